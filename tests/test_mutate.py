"""tools/mutate.py, the developer's mutation check: each mutant changes one thing in one target function and still
compiles, every mutant has its own name, --rerun selects exactly the survivors of a report and --skip leaves out
every mutant that reports ran."""

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import mutate  # noqa: E402
import pytest  # noqa: E402
from conftest import printing  # noqa: E402


def test_each_mutant_changes_one_function_compiles_and_has_its_own_name():
    """sincos_2d has two of several changes on one line (two 4s, two divisions, two floor divisions): each is a mutant,
    told apart by its occurrence, and each changes that function alone."""
    source = open(os.path.join(ROOT, "vits.py")).read()
    original = ast.dump(ast.parse(source))
    found = list(mutate.mutants("vits.py", ["sincos_2d"]))
    names = [(name, line, what, k) for name, line, what, k, _ in found]
    assert len(found) > 10 and len(set(names)) == len(names)
    assert any(k == 2 for *_, k in names)
    func = mutate.find(ast.parse(source), "sincos_2d")
    for *_, mutated in found:
        tree = ast.parse(mutated)
        assert ast.dump(tree) != original
        changed = mutate.find(tree, "sincos_2d")
        tree.body[tree.body.index(changed)] = func  # the rest of the file as it was
        assert ast.dump(tree) == original


def listed(*args):
    p = subprocess.run([sys.executable, os.path.join("tools", "mutate.py"), "--files", "vits.py", "--functions",
                        "sincos_2d", "--list", *args], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()[:-1]


def test_rerun_lists_only_the_survivors_of_a_report(tmp_path):
    """A report whose one survivor is the second of two identical changes on a line: --rerun selects that one alone
    (an earlier report, without occurrences, selects both)."""
    line = next(line for _, line, what, k, _ in mutate.mutants("vits.py", ["sincos_2d"])
                if what == "4 -> 5" and k == 2)
    twice = [f"vits.py:{line} sincos_2d: 4 -> 5", f"vits.py:{line} sincos_2d: 4 -> 5 (#2 on the line)"]
    assert set(twice) <= set(listed())
    report = tmp_path / "report.json"
    mutants = [{"file": "vits.py", "function": "sincos_2d", "line": line, "mutation": "4 -> 5", "occurrence": k,
                "killed": k == 1} for k in (1, 2)]
    report.write_text(json.dumps({"mutants": mutants}))
    assert listed("--rerun", str(report)) == twice[1:]
    mutants = [{**m, "killed": not m["killed"]} for m in mutants]
    report.write_text(json.dumps({"mutants": mutants}))
    assert listed("--rerun", str(report)) == twice[:1]
    for m in mutants:
        del m["occurrence"]
    report.write_text(json.dumps({"mutants": mutants}))
    assert listed("--rerun", str(report)) == twice


def each_applied(func, applies):
    """The function's source with each change applied in turn; each undo gives the function back."""
    before, changed = ast.unparse(func), []
    for apply in applies:
        undo = apply()
        changed.append(ast.unparse(func))
        undo()
        assert ast.unparse(func) == before
    return changed


def test_a_condition_is_negated_where_no_other_change_reverses_it():
    """`if a:` and `b if a else 3` are negated; a comparison (flipped instead) and a `not` (dropped instead) are not,
    and the undo gives the function back."""
    source = "def f(a, b):\n    if a:\n        b = 1\n    if a < b:\n        b = 2\n    while not a:\n" \
             "        a = b if a else 3\n    return b\n"
    func = ast.parse(source).body[0]
    negations = [apply for _, what, apply in mutate.mutations(func) if what == "negate the condition"]
    assert len(negations) == 2
    changed = each_applied(func, negations)
    assert "if not a:" in changed[0] and "b if not a else 3" in changed[1]


def test_each_bound_of_a_slice_and_each_break_is_dropped_in_turn():
    """x[1:-1:2] gives three mutants, one bound dropped in each; a `break` and a `continue` are deleted (a pass in
    their place), and each undo gives the function back."""
    source = "def f(x):\n    for i in x:\n        if i:\n            continue\n        break\n    return x[1:-1:2]\n"
    func = ast.parse(source).body[0]
    found = {what: apply for _, what, apply in mutate.mutations(func)
             if "bound" in what or what in ("delete `break`", "delete `continue`")}
    assert set(found) == {"drop a slice's lower bound", "drop a slice's upper bound", "drop a slice's step bound",
                          "delete `break`", "delete `continue`"}
    changed = dict(zip(found, each_applied(func, found.values())))
    assert "x[:-1:2]" in changed["drop a slice's lower bound"] and "x[1::2]" in changed["drop a slice's upper bound"]
    assert "x[1:-1]" in changed["drop a slice's step bound"]
    assert "break" not in changed["delete `break`"] and "continue" not in changed["delete `continue`"]


def test_a_value_returned_becomes_none_but_a_bare_return_is_left():
    """`return x + 1` -> `return None`; `return` and `return None` give no mutant (they return None already)."""
    source = "def f(x):\n    if x:\n        return\n    if x is None:\n        return None\n    return x + 1\n"
    func = ast.parse(source).body[0]
    found = [apply for _, what, apply in mutate.mutations(func) if what == "return None"]
    changed, = each_applied(func, found)
    assert changed.endswith("return None") and "x + 1" not in changed


def test_neighbouring_arguments_are_swapped_unless_the_call_is_symmetric():
    """f(a, b, c) gives two mutants, f(b, a, c) and f(a, c, b); max(a, b), torch.equal(a, b) and d.transpose(1, 2)
    none (their order never matters), nor two equal arguments or a starred one, and each undo gives the function
    back."""
    source = ("def f(a, b, c, d):\n    return f(a, b, c) + max(a, b) + f(a, a) + f(*a, b) + d.transpose(1, 2) + "
              "torch.equal(a, b)\n")
    func = ast.parse(source).body[0]
    found = [apply for _, what, apply in mutate.mutations(func) if what.startswith("swap arguments")]
    assert len(found) == 2
    changed = each_applied(func, found)
    assert "f(b, a, c)" in changed[0] and "f(a, c, b)" in changed[1]
    assert all("max(a, b) + f(a, a) + f(*a, b) + d.transpose(1, 2) + torch.equal(a, b)" in c for c in changed)


def test_skip_leaves_out_every_mutant_the_reports_ran(tmp_path):
    """--skip with two reports: the mutants either ran, killed or not, are left out, the rest listed in their order
    (an earlier report, without occurrences, leaves out every occurrence of a change on its line)."""
    every = listed()
    line = next(line for _, line, what, k, _ in mutate.mutants("vits.py", ["sincos_2d"])
                if what == "4 -> 5" and k == 2)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"mutants": [{"file": "vits.py", "function": "sincos_2d", "line": line,
                                              "mutation": "4 -> 5", "occurrence": 2, "killed": True}]}))
    second_four = f"vits.py:{line} sincos_2d: 4 -> 5 (#2 on the line)"
    assert listed("--skip", str(first)) == [m for m in every if m != second_four]
    second.write_text(json.dumps({"mutants": [{"file": "vits.py", "function": "sincos_2d", "line": line,
                                               "mutation": "4 -> 5", "killed": False}]}))
    left = listed("--skip", str(first), str(second))
    assert left == [m for m in every if not m.startswith(f"vits.py:{line} sincos_2d: 4 -> 5")]
    assert len(left) == len(every) - 2


TINY = {  # a repository of one module and its tests: the mutation check's own subject in the tests below
    "m.py": "def double(x):\n    return 2 * x\n\n\ndef half(x):\n    return x / 2\n\n\ndef clip(x):\n"
            "    return max(x, 0)\n",
    "tests/test_m.py": "import os\nimport sys\n\nimport pytest\n\n"
                       "sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
                       "import m  # noqa: E402\n\n\n"
                       "def test_double():\n    assert os.environ['OMP_NUM_THREADS'] == '1'\n"
                       "    assert m.double(3) == 6 and m.clip(5) == 5\n\n\n"
                       "@pytest.mark.slow\ndef test_half():\n    assert m.half(4) == 2\n",
    "tests/test_slow.py": "import pytest\n\n\n@pytest.mark.slow\ndef test_nothing_quick():\n    pass\n",
    "pytest.ini": "[pytest]\nmarkers =\n    slow: the end-to-end tests\n",
}

# a mutant whose tests hang, having started a process (its pid in child.pid); both end by themselves after two
# minutes, so that a mutant of run itself that no longer stops them (tools/mutate.py mutates itself) leaves nothing
HANG = TINY["m.py"].replace("return 2 * x", "import subprocess, time\n    child = subprocess.Popen(['sleep', '120'])\n"
                            "    open('child.pid', 'w').write(str(child.pid))\n    end = time.time() + 120\n"
                            "    while time.time() < end:\n        pass")


def tiny_repo(root):
    for path, text in TINY.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def running(pid):
    """Whether a process runs (a zombie, left to a parent that never waits, does not)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):  # (ended, or reaped between the two looks)
        return False
    except OSError:  # no /proc: it answered the signal
        return True


def ends(pid, seconds):
    """Whether the process has ended within `seconds`: a killed process may take a while to end on a loaded machine."""
    end = time.time() + seconds
    while running(pid):
        if time.time() > end:
            return False
        time.sleep(0.1)
    return True


def test_run_kills_a_mutant_its_quick_or_slow_tests_fail_or_that_hangs(tmp_path, monkeypatch, capfd):
    """A mutant is killed when the quick tests fail, when only the slow ones do, or when the tests run past the
    timeout (the processes its tests started stopped with them); it survives when both pass or when a file has no
    quick test (pytest's exit code 5). Each run is in the copy, with one thread whatever the caller's, its output kept
    from the terminal, and the file put back as it was."""
    repo = tiny_repo(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    original = TINY["m.py"]
    quick, both = ["tests/test_m.py"], ["tests/test_m.py", "tests/test_slow.py"]
    assert mutate.run(str(repo), "m.py", original, both, 60) is False
    assert mutate.run(str(repo), "m.py", original, ["tests/test_slow.py"], 60) is False  # exit code 5, then 0
    assert mutate.run(str(repo), "m.py", original.replace("2 * x", "3 * x"), quick, 60) is True
    assert mutate.run(str(repo), "m.py", original.replace("x / 2", "x / 3"), quick, 60) is True  # the slow test
    assert mutate.run(str(repo), "m.py", original.replace("max(x, 0)", "max(x, 1)"), quick, 60) is False
    assert mutate.run(str(repo), "m.py", original, ["tests/no_such_test.py"], 60) is True  # pytest's usage error
    assert mutate.run(str(repo), "m.py", HANG, quick, 10) is True  # (time for pytest to start, under load too)
    pid = int((repo / "child.pid").read_text())  # the process the hanging tests started is stopped with them
    assert ends(pid, 30)  # (it lives 120 s if left)
    assert (repo / "m.py").read_text() == original
    assert capfd.readouterr() == ("", "")


def test_main_runs_each_mutant_in_a_copy_and_reports_the_survivors(tmp_path, monkeypatch, capsys):
    """Every mutant of the targets, two at a time, each in a scratch copy that no other run is using (two, without .git,
    out/ or checkpoints, removed at the end), after the file's tests have passed on the unchanged code: the report
    counts the killed per file, lists the survivor (clip's 0 -> 1), and --rerun of that report runs it alone; after a
    Ctrl-C the run under way ends, no other starts, and the report holds every mutant run."""
    repo = tiny_repo(tmp_path / "repo")
    for junk in [".git/HEAD", "out/x.json", "ckpt.pt"]:
        (repo / junk).parent.mkdir(parents=True, exist_ok=True)
        (repo / junk).write_text("")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(mutate, "ROOT", str(repo))
    monkeypatch.setattr(mutate, "TARGETS", {"m.py": (["double", "clip"], ["tests/test_m.py"]),
                                            "n.py": (["triple"], ["tests/test_m.py"])})
    (repo / "n.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.setattr(mutate.tempfile, "tempdir", str(scratch))
    copies, busy, real_run = [], set(), mutate.run

    def run(copy, path, source, tests, timeout):
        assert copy not in busy  # one test run at a time in a copy (raised in the tool's thread, then in main)
        busy.add(copy)
        copies.append((copy, sorted(os.listdir(copy)), source))
        try:
            return real_run(copy, path, source, tests, timeout)
        finally:
            busy.discard(copy)
    monkeypatch.setattr(mutate, "run", run)

    def main(*args):
        mutate.main(mutate.parse_args(list(args)))
        return capsys.readouterr().out

    report = tmp_path / "report.json"
    printed = printing(monkeypatch, mutate)
    out = main("--jobs", "2", "--timeout", "60", "--functions", "double", "clip", "--out", str(report))
    assert sum(a[0].startswith("[") and kw == {"flush": True} for a, kw in printed) == 5
    assert [kw for a, kw in printed if a[0].startswith("the tests of 1 file(s) pass on the unchanged code, each of "
                                                       "their 1 test files run once (")] == [{"flush": True}]
    found = list(mutate.mutants("m.py", ["double", "clip"]))
    labels = [mutate.label("m.py", *m[:4]) for m in found]
    assert len(labels) == 5 and "m.py:10 clip: 0 -> 1" in labels
    assert len(copies) == 6 and os.listdir(scratch) == []
    assert copies[0][2] == TINY["m.py"]  # first m.py's tests on the unchanged code, in the first copy
    assert all(files == ["m.py", "n.py", "pytest.ini", "tests"] for _, files, _ in copies)
    assert all(os.path.basename(c).startswith("mutate-") for c, _, _ in copies)
    assert sorted(source for _, _, source in copies[1:]) == sorted(m[4] for m in found)  # each mutant once
    assert len({c for c, _, _ in copies}) == 2  # side by side, each in a copy of its own (run's assert)
    assert report.read_text().startswith('{\n "summary": {\n  "m.py": {\n   "mutants": 5,')  # one per line
    data = json.loads(report.read_text())
    assert data["summary"] == {"m.py": {"mutants": 5, "killed": 4}}  # n.py ran none
    assert [mutate.label(r["file"], r["function"], r["line"], r["mutation"], r["occurrence"])
            for r in data["mutants"]] == labels
    assert [r["killed"] for r in data["mutants"]] == [m != "m.py:10 clip: 0 -> 1" for m in labels]
    assert "survivors (the tests missed these):\n  m.py:10 clip: 0 -> 1\n" in out
    assert "m.py: 4/5 killed (80%)" in out and "all: 4/5 killed (80.0% +- 17.9%)" in out
    assert out.count("killed   m.py") == 4 and out.count("SURVIVED m.py:10 clip: 0 -> 1") == 1
    seconds = [int(t) for t in re.findall(r"^\[\d/5 (\d+)s\] ", out, re.M) + re.findall(r" in (\d+)s$", out, re.M)
               + re.findall(r"^the tests of 1 file\(s\) pass on the unchanged code, each of their 1 test files run "
                           r"once \((\d+)s\)$", out, re.M)]
    assert len(seconds) == 7 and max(seconds) < 300  # since the first test run (the unchanged code's)

    again = tmp_path / "again.json"
    out = main("--jobs", "1", "--rerun", str(report), "--out", str(again))
    assert [r["mutation"] for r in json.loads(again.read_text())["mutants"]] == ["0 -> 1"]
    assert "[1/1 " in out and "all: 0/1 killed (0.0% +- 0.0%)" in out

    def interrupted(copy, path, source, tests, timeout):
        if len(copies) == 10:  # the unchanged code's tests and the first mutant have run: Ctrl-C during the second
            os.kill(os.getpid(), signal.SIGINT)  # (a KeyboardInterrupt in the main thread, as a Ctrl-C raises it)
        return run(copy, path, source, tests, timeout)
    monkeypatch.setattr(mutate, "run", interrupted)
    # a Python started with SIGINT ignored (a background job of a non-interactive shell, as tools/mutate.py's own
    # check of this file once ran) keeps ignoring it: the Ctrl-C's KeyboardInterrupt is set up here
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        out = main("--jobs", "1", "--files", "m.py", "--out", str(again))
    finally:
        signal.signal(signal.SIGINT, handler)
    assert "interrupted after 2 of 5 mutants" in out and os.listdir(scratch) == []
    assert len(copies) == 11  # the run under way ended, and is in the report; no other started
    assert json.loads(again.read_text())["summary"] == {"m.py": {"mutants": 2, "killed": 2}}
    none = tmp_path / "new" / "none.json"  # in a folder made for it (the default is out/mutate/report.json)
    out = main("--change", "no such change", "--out", str(none))
    assert "all: 0/0 killed (0.0% +- 0.0%)" in out and json.loads(none.read_text()) == {"summary": {}, "mutants": []}


def test_a_sigterm_ends_the_tool_as_a_ctrl_c_does(tmp_path):
    """tools/mutate.py run as a command (a copy of it in a tiny repository, with that repository's targets) and sent
    SIGTERM, as `timeout` or kill sends it, during its second mutant's test run: that run ends, no other starts, the
    report holds the mutants whose runs ended, and its scratch copies are gone (a plain SIGTERM had left the copies and
    the test runs, each in a session of its own, running, and no report)."""
    repo = tiny_repo(tmp_path / "repo")
    slowly = "def test_slowly():  # first: every test run takes 2 s or more\n    import time\n    time.sleep(2)\n\n\n"
    (repo / "tests" / "test_m.py").write_text(TINY["tests/test_m.py"].replace("def test_double", slowly + "def "
                                                                               "test_double"))
    text = open(os.path.join(ROOT, "tools", "mutate.py")).read()
    main = '\nif __name__ == "__main__":'
    (repo / "tools").mkdir()
    (repo / "tools" / "mutate.py").write_text(text.replace(main, '\nTARGETS = {"m.py": (["double", "clip"], '
                                                                 '["tests/test_m.py"])}\n' + main))
    scratch, report = tmp_path / "scratch", tmp_path / "report.json"
    scratch.mkdir()
    tool = subprocess.Popen([sys.executable, "tools/mutate.py", "--jobs", "1", "--timeout", "60", "--out",
                             str(report)], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, TMPDIR=str(scratch)))
    lines = []
    for line in tool.stdout:  # the first mutant's line: the second's run has started
        lines.append(line)
        if line.startswith("[1/5 "):
            break
    time.sleep(1)
    tool.send_signal(signal.SIGTERM)
    out = "".join(lines) + tool.communicate(timeout=60)[0]
    assert tool.returncode == 0 and "interrupted after 2 of 5 mutants" in out, out
    assert json.loads(report.read_text())["summary"] == {"m.py": {"mutants": 2, "killed": 2}}
    assert os.listdir(scratch) == []


def test_no_mutant_runs_when_the_tests_fail_on_the_unchanged_code(tmp_path, monkeypatch):
    """A test that fails without any mutant (broken, or flaky: a failure at random) would count every mutant killed:
    the tool stops once the tests have run on the unchanged code, each test file once (side by side, each in its own
    copy; a file's tests named apart in one run), naming the test file that fails and every file whose mutants it
    runs, and removes its scratch copies without writing a report."""
    repo = tiny_repo(tmp_path / "repo")
    (repo / "m.py").write_text(TINY["m.py"].replace("return 2 * x", "return 3 * x"))  # test_m.py's double fails
    (repo / "n.py").write_text("def triple(x):\n    return 3 * x\n")
    (repo / "o.py").write_text("def quadruple(x):\n    return 4 * x\n")
    scratch, report = tmp_path / "scratch", tmp_path / "report.json"
    scratch.mkdir()
    monkeypatch.setattr(mutate, "ROOT", str(repo))
    monkeypatch.setattr(mutate, "TARGETS", {  # test_slow.py passes; o.py's test of it runs with the whole file
        "m.py": (["double", "clip"], ["tests/test_m.py::test_double"]),
        "n.py": (["triple"], ["tests/test_slow.py", "tests/test_m.py::test_half"]),
        "o.py": (["quadruple"], ["tests/test_slow.py::test_nothing_quick"])})
    monkeypatch.setattr(mutate.tempfile, "tempdir", str(scratch))
    ran, real_run = [], mutate.run
    monkeypatch.setattr(mutate, "run", lambda *a: ran.append(a) or real_run(*a))
    with pytest.raises(SystemExit, match=r"^tools/mutate.py: the tests in tests/test_m.py fail on the unchanged code "
                       r"\(broken, flaky, or past --timeout\): every mutant of m.py, n.py would count as killed; make "
                       r"them pass first$"):
        mutate.main(mutate.parse_args(["--jobs", "2", "--timeout", "60", "--out", str(report)]))
    assert sorted(r[1:4] for r in ran) == [
        ("m.py", (repo / "m.py").read_text(), ["tests/test_m.py::test_double", "tests/test_m.py::test_half"]),
        ("n.py", (repo / "n.py").read_text(), ["tests/test_slow.py"])]
    assert ran[0][0] != ran[1][0] and os.listdir(scratch) == [] and not report.exists()


def test_every_kind_of_change_is_made_once_where_it_applies_and_undone():
    """A function with one of each thing the check changes: each change as the mutant's line reads after it (a
    statement deleted is a `pass`), the function's own statements deleted as well as nested ones, a docstring and
    `f(device=...)` left, and each undo giving the function back."""
    source = '''def f(a, b, x):
    "a docstring"
    y = a + b * 2 - x / 1.5 // 0.0 % 3 ** 1
    if a < b and x in b or not a:
        y = x.mean() + -a
    z = g(a, b, key=1, **x)
    h(a, device=b)
    y += 1
    while y:
        break
    return y if x else z[1:]
'''
    expected = [
        ("Add -> Sub", "y = a - b * 2 - x / 1.5 // 0.0 % 3 ** 1"),
        ("Mult -> Div", "y = a + b / 2 - x / 1.5 // 0.0 % 3 ** 1"),
        ("2 -> 3", "y = a + b * 3 - x / 1.5 // 0.0 % 3 ** 1"),
        ("Sub -> Add", "y = a + b * 2 + x / 1.5 // 0.0 % 3 ** 1"),
        ("Div -> Mult", "y = a + b * 2 - x * 1.5 // 0.0 % 3 ** 1"),
        ("1.5 -> 3.0", "y = a + b * 2 - x / 3.0 // 0.0 % 3 ** 1"),
        ("FloorDiv -> Div", "y = a + b * 2 - x / 1.5 / 0.0 % 3 ** 1"),
        ("0.0 -> 1.0", "y = a + b * 2 - x / 1.5 // 1.0 % 3 ** 1"),
        ("Mod -> FloorDiv", "y = a + b * 2 - x / 1.5 // 0.0 // 3 ** 1"),
        ("3 -> 4", "y = a + b * 2 - x / 1.5 // 0.0 % 4 ** 1"),
        ("Pow -> Mult", "y = a + b * 2 - x / 1.5 // 0.0 % (3 * 1)"),
        ("1 -> 0", "y = a + b * 2 - x / 1.5 // 0.0 % 3 ** 0"),
        ("negate the condition", "if not (a < b and x in b or not a):"),
        ("Or -> And", "if (a < b and x in b) and (not a):"), ("And -> Or", "if (a < b or x in b) or not a:"),
        ("Lt -> GtE", "if a >= b and x in b or not a:"), ("In -> NotIn", "if a < b and x not in b or not a:"),
        ("drop Not", "if a < b and x in b or +a:"),
        (".mean -> .sum", "y = x.sum() + -a"), ("Add -> Sub", "y = x.mean() - -a"), ("drop USub", "y = x.mean() + +a"),
        ("drop key=", "z = g(a, b, **x)"), ("swap arguments 1 and 2", "z = g(b, a, key=1, **x)"),
        ("1 -> 0", "z = g(a, b, key=0, **x)"),
        ("delete `h(a, device=b)`", "pass"),
        ("delete `y += 1`", "pass"), ("1 -> 0", "y += 0"),
        ("negate the condition", "while not y:"), ("delete `break`", "pass"),
        ("return None", "return None"), ("negate the condition", "return y if not x else z[1:]"),
        ("drop a slice's lower bound", "return y if x else z[:]"), ("1 -> 0", "return y if x else z[0:]")]
    func = ast.parse(source).body[0]
    found = list(mutate.mutations(func))
    before = ast.unparse(func).splitlines()
    lines = [[line.strip() for line, was in zip(after.splitlines(), before) if line != was]
             for after in each_applied(func, [apply for *_, apply in found])]
    assert sorted((what, *changed) for (_, what, _), changed in zip(found, lines)) == sorted(expected)
    long = ast.parse("def f(x):\n    if x:\n        print('a line longer than fifty characters, cut at fifty')\n")
    assert [what for _, what, _ in mutate.mutations(long.body[0])] == \
        ["negate the condition", "delete `print('a line longer than fifty characters, cut at`"]


def test_find_reads_a_method_by_its_class():
    """`Class.name` is that class's method, not a function or another class's method of the same name."""
    tree = ast.parse("def go():\n    return 0\n\n\nclass A:\n    def go(self):\n        return 1\n\n\n"
                     "class B:\n    x = 1\n\n    def go(self):\n        return 2\n")
    assert [mutate.find(tree, name).body[0].value.value for name in ["go", "A.go", "B.go"]] == [0, 1, 2]


def test_help_shows_the_examples_and_every_flag_with_its_help():
    """--help prints the module's examples as written and each flag with its help text and metavar."""
    p = subprocess.run([sys.executable, os.path.join("tools", "mutate.py"), "--help"], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "    python tools/mutate.py --list                 # only print the mutants\n" in p.stdout
    for flag, words in [("--files", "files to mutate"), ("--jobs", "mutants run side by side"),
                        ("--timeout", "seconds before a mutant's test run counts as failed"),
                        ("--functions", "only these functions of the files"), ("--change", "only the mutants whose"),
                        ("--list", "only list the mutants"), ("--sample", "run only this many mutants"),
                        ("--sample-seed", "seed of the --sample draw"), ("--rerun", "run only the mutants that"),
                        ("--skip REPORT [REPORT ...]", "leave out every mutant"), ("--out", "the JSON report")]:
        assert f"{flag} " in text and words in text, flag


def test_flags_take_their_defaults_and_values_and_refuse_what_is_not_a_target(monkeypatch, capsys, tmp_path):
    """Each flag's default and a value given; --jobs defaults to the cores (one where they are unknown); a file or a
    function that is not a target is one line and exit code 2, and so is --jobs or --timeout below 1, a negative
    --sample, or a report of --rerun or --skip that is missing, not JSON or not mutate.py's. --change keeps the changes
    containing its text; --sample draws that many in file order (all of them when it is 0 or more than there are)."""
    monkeypatch.chdir(tmp_path)
    for name in ["r.json", "a.json", "b.json"]:
        (tmp_path / name).write_text('{"summary": {}, "mutants": []}')
    (tmp_path / "bad.json").write_text('{"summary": {}, "mut')
    (tmp_path / "foreign.json").write_text('{"mutants": [{"file": "common.py"}]}')
    args = mutate.parse_args([])
    assert vars(args) == {"files": list(mutate.TARGETS), "jobs": os.cpu_count() or 1, "timeout": 300,
                          "functions": None, "change": None, "list": False, "sample": 0, "sample_seed": 0,
                          "rerun": None, "skip": [], "out": "out/mutate/report.json",
                          "names": {path: names for path, (names, _) in mutate.TARGETS.items()}}
    args = mutate.parse_args(["--files", "vits.py", "parity.py", "--jobs", "3", "--timeout", "5", "--functions",
                              "sincos_2d", "parity", "--change", "a", "b", "--list", "--sample", "4", "--sample-seed",
                              "7", "--rerun", "r.json", "--skip", "a.json", "b.json", "--out", "o.json"])
    assert vars(args) == {"files": ["vits.py", "parity.py"], "jobs": 3, "timeout": 5,
                          "functions": ["sincos_2d", "parity"], "change": ["a", "b"], "list": True, "sample": 4,
                          "sample_seed": 7, "rerun": "r.json", "skip": ["a.json", "b.json"], "out": "o.json",
                          "names": {"vits.py": ["sincos_2d"], "parity.py": ["parity"]}}
    monkeypatch.setattr(mutate.os, "cpu_count", lambda: None)
    assert mutate.parse_args([]).jobs == 1
    for argv, error in [(["--files", "nope.py"], "invalid choice: 'nope.py'"), (["--jobs", "two"], "invalid int"),
                        (["--files", "vits.py", "--functions", "sincos_2d", "parity", "zzz"],
                         "--functions parity zzz: not a target of vits.py (TARGETS lists them)"),
                        (["--jobs", "0"], "--jobs must be at least 1, got 0"),
                        (["--timeout", "0"], "--timeout must be at least 1, got 0"),
                        (["--sample", "-3"], "--sample must be at least 0, got -3"),
                        (["--rerun", "none.json"], "--rerun none.json: not a report that mutate.py wrote (No such"),
                        (["--skip", "a.json", "bad.json"], "--skip bad.json: not a report that mutate.py wrote "
                                                           "(JSONDecodeError: Unterminated string"),
                        (["--rerun", "foreign.json"], "--rerun foreign.json: not a report that mutate.py wrote "
                                                      "(KeyError: 'killed')")]:
        with pytest.raises(SystemExit) as stop:
            mutate.parse_args(argv)
        assert stop.value.code == 2 and error in capsys.readouterr().err
    every = listed()
    fours = listed("--change", "4 -> 5")  # the changes that contain this text
    assert fours == [m for m in every if ": 4 -> 5" in m] and 0 < len(fours) < len(every)
    assert listed("--sample", "0") == listed("--sample", str(len(every))) == listed("--sample", "999") == every
    one, three = listed("--sample", "1"), listed("--sample", "3", "--sample-seed", "5")
    assert len(one) == 1 and len(three) == 3 and three == [m for m in every if m in three] != every[:3]


def test_a_swap_compares_each_pair_of_neighbours_and_looks_for_stars_in_that_pair_alone():
    """f(a, b, a): both pairs swapped; f(a, a, b): the second pair alone; a starred argument rules out only the pairs
    it is in (f(*a, b, c): b and c swapped; f(a, b, *c): a and b)."""
    source = "def f(a, b, c):\n    return f(a, b, a) + f(a, a, b) + f(*a, b, c) + f(a, b, *c)\n"
    func = ast.parse(source).body[0]
    found = [apply for _, what, apply in mutate.mutations(func) if what.startswith("swap arguments")]
    assert sorted(line.split("return ")[1] for line in each_applied(func, found)) == sorted([
        "f(b, a, a) + f(a, a, b) + f(*a, b, c) + f(a, b, *c)", "f(a, a, b) + f(a, a, b) + f(*a, b, c) + f(a, b, *c)",
        "f(a, b, a) + f(a, b, a) + f(*a, b, c) + f(a, b, *c)", "f(a, b, a) + f(a, a, b) + f(*a, c, b) + f(a, b, *c)",
        "f(a, b, a) + f(a, a, b) + f(*a, b, c) + f(b, a, *c)"])


def test_a_ctrl_c_during_a_test_run_stops_it_with_what_it_started_and_puts_the_file_back(tmp_path, monkeypatch):
    """Ctrl-C while the tests run (raised once the process they start is up): the test run, in a process group of
    its own that the terminal's Ctrl-C does not reach, is stopped with that process, and the file is as it was."""
    repo = tiny_repo(tmp_path)
    pid_file = repo / "child.pid"

    class Interrupted(subprocess.Popen):
        def wait(self, timeout=None):
            if timeout is None:  # run's own wait after stopping the group
                return super().wait()
            while not (pid_file.exists() and pid_file.read_text()) and self.poll() is None:
                time.sleep(0.05)
            raise KeyboardInterrupt
    monkeypatch.setattr(mutate.subprocess, "Popen", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        mutate.run(str(repo), "m.py", HANG, ["tests/test_m.py"], 600)
    assert ends(int(pid_file.read_text()), 30)
    assert (repo / "m.py").read_text() == TINY["m.py"]
