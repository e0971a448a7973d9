"""tools/mutate.py, the developer's mutation check: each mutant changes one thing in one target function and still
compiles, every mutant has its own name, --rerun selects exactly the survivors of a report and --skip leaves out
every mutant that reports ran."""

import ast
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import mutate  # noqa: E402


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
    """f(a, b, c) gives two mutants, f(b, a, c) and f(a, c, b); max(a, b) and d.transpose(1, 2) none (their order
    never matters), nor two equal arguments or a starred one, and each undo gives the function back."""
    source = "def f(a, b, c, d):\n    return f(a, b, c) + max(a, b) + f(a, a) + f(*a, b) + d.transpose(1, 2)\n"
    func = ast.parse(source).body[0]
    found = [apply for _, what, apply in mutate.mutations(func) if what.startswith("swap arguments")]
    assert len(found) == 2
    changed = each_applied(func, found)
    assert "f(b, a, c)" in changed[0] and "f(a, c, b)" in changed[1]
    assert all("max(a, b) + f(a, a) + f(*a, b) + d.transpose(1, 2)" in c for c in changed)


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
