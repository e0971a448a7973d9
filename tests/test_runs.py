"""The run plumbing in runs.py: the results file, run folders, strict JSON, the divergence rule, the exit codes of
cli(), --resume through the parser, and report.py's redraw and merge of run folders."""

import importlib
import io
import json
import math
import os
import random
import re
import select
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import stop_at_backward, synthetic_final
import report
import runs
import synthetic
import vision
from runs import (Progress, Results, cli, duration, git_state, given, load_results, new_run_dir, one_at_a_time,
                  restore, set_threads, snapshot, time_forward, write_json)


def test_results_file_shape_and_atomic_rewrite(tmp_path):
    res = Results(str(tmp_path), "vision", {"lr": 0.1, "sigma": [0.1], "sens_seed": 3}, "cpu")
    res.log("vit/seed0", {"epoch": 0, "sens": 0.5})
    res.final("vit/seed0", {"sens": 0.4, "sens_stderr": 0.01})
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["args"]["lr"] == 0.1 and data["env"]["device"] == "cpu" and data["script"] == "vision"
    if os.path.isfile("/proc/cpuinfo"):  # the processor, since CPU training repeats bit for bit only on the same one
        assert data["env"]["cpu"] and "model name" not in data["env"]["cpu"]
    run = data["runs"]["vit/seed0"]
    assert run == {"history": [{"epoch": 0, "sens": 0.5}], "final": {"sens": 0.4, "sens_stderr": 0.01},
                   "measured_under": {"sigma": [0.1], "sens_seed": 3}}  # the measurement's flags, not lr
    assert os.listdir(tmp_path) == ["metrics.json"]  # no temp file left behind
    assert load_results(str(tmp_path))["runs"].keys() == {"vit/seed0"}


def test_corrupt_or_missing_results_file_is_a_clear_error(tmp_path):
    (tmp_path / "metrics.json").write_text('{"args": {}, "ru')
    with pytest.raises(ValueError, match="not a valid metrics.json"):
        load_results(str(tmp_path))
    with pytest.raises(ValueError, match="no results file"):
        load_results(str(tmp_path / "nothing.json"))
    write_json(str(tmp_path / "x.json"), [1])
    with pytest.raises(ValueError, match="not a metrics.json"):
        load_results(str(tmp_path / "x.json"))
    write_json(str(tmp_path / "s" / "metrics.json"), {"script": "synthetic", "runs": {}})  # --resume of another's run
    with pytest.raises(ValueError, match="was written by synthetic.py, not vision.py"):
        load_results(str(tmp_path / "s"), "vision")
    assert load_results(str(tmp_path / "s"), "synthetic")["script"] == "synthetic"


def test_run_dir_is_never_reused(tmp_path):
    a = new_run_dir("vision", "vit", out_dir=str(tmp_path))
    b = new_run_dir("vision", "vit", out_dir=str(tmp_path))
    assert a != b and b.endswith("vit-2") and os.path.isdir(a) and os.path.isdir(b)


def test_git_state_says_when_the_code_is_not_its_commit(tmp_path):
    """A run records its commit and whether a tracked file was edited since (a run of edited code must not pass for
    the commit's); untracked files (data, out/) do not count; outside git, nothing."""
    assert git_state(str(tmp_path)) == (None, None)
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,
                                    check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "model.py").write_text("a = 1\n")
    git("add", "model.py")
    git("commit", "-qm", "one")
    commit = git("rev-parse", "HEAD").stdout.decode().strip()
    (tmp_path / "data.bin").write_text("x")
    assert git_state(str(tmp_path)) == (commit, False)
    (tmp_path / "model.py").write_text("a = 2\n")
    assert git_state(str(tmp_path)) == (commit, True)


@pytest.mark.slow
def test_git_state_gives_up_on_a_git_that_hangs(tmp_path, monkeypatch):
    """A git that never answers (a lock, a network filesystem) costs a run 5 s, not the run: no commit is recorded."""
    (tmp_path / "git").write_text("#!/bin/sh\nexec sleep 60\n")
    (tmp_path / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    assert git_state(str(tmp_path)) == (None, None) and time.monotonic() - t0 < 15


def test_cpu_model_reads_proc_cpuinfo_and_falls_back_to_platform(monkeypatch):
    """The processor's name from /proc/cpuinfo's 'model name' line (none on a processor without that line); where
    there is no /proc (macOS, Windows), platform's name, or None when it has none either."""
    files = {"amd": "processor\t: 0\nmodel name\t: AMD EPYC 7B13: 2 cores\n", "arm": "processor\t: 0\nBogoMIPS\t: 50\n"}
    for kind, expected in [("amd", "AMD EPYC 7B13: 2 cores"), ("arm", None)]:
        monkeypatch.setattr(runs, "open", lambda *a, text=files[kind], **kw: io.StringIO(text),
                            raising=False)
        assert runs.cpu_model() == expected

    def no_proc(*a, **kw):
        raise FileNotFoundError("/proc/cpuinfo")

    monkeypatch.setattr(runs, "open", no_proc, raising=False)
    for name, expected in [("arm", "arm"), ("", None)]:
        monkeypatch.setattr(runs.platform, "processor", lambda name=name: name)
        assert runs.cpu_model() == expected


def test_help_gives_each_default_once_and_none_for_switches():
    """--help adds '(default: ...)' after a flag's text: lists space-separated, an empty text as 'none', '%' kept;
    nothing for a switch, a default of None (filled in later), a positional argument, or a text that gives its own."""
    p = runs.ArgumentParser(prog="x")
    p.add_argument("pos", nargs="?", default="a", help="a positional")
    p.add_argument("--switch", action="store_true", help="a switch")
    p.add_argument("--later", default=None, help="filled in later")
    p.add_argument("--given", type=int, default=3, help="steps (Default: three)")
    p.add_argument("--sigma", nargs="+", type=float, default=[0.1, 1.0], help="noise")
    p.add_argument("--prefix", default="", help="a prefix")
    p.add_argument("--share", default="50%", help="a share")
    shown = {a.dest: runs.HelpFormatter("x")._get_help_string(a) for a in p._actions}
    assert shown == {"help": "show this help message and exit", "pos": "a positional", "switch": "a switch",
                     "later": "filled in later", "given": "steps (Default: three)",
                     "sigma": "noise (default: 0.1 1.0)", "prefix": "a prefix (default: none)",
                     "share": "a share (default: 50%%)"}
    assert "a share (default: 50%)" in p.format_help()


def test_progress_lines_reach_a_pipe_as_they_are_printed():
    """Under nohup, tee or reproduce.sh's logs stdout is a pipe, which Python buffers: each progress line is flushed,
    so it is there while the run goes on, not when the process ends."""
    code = ("import time; from runs import Progress; "
            "p = Progress('m/seed0', 0, 10, 5, every=0.5); p.tick(0, True); time.sleep(60)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # (some shells and CI set it)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        ready, _, _ = select.select([child.stdout], [], [], 10)  # unflushed: at 8 KiB, 70 s of lines
        assert ready and "m/seed0 | step 0/10 | evaluating for" in child.stdout.readline()
    finally:
        child.kill()
        child.wait()


def test_strict_json_and_no_replace(tmp_path):
    """NaN and inf become null; the file is readable by strict parsers; replace=False never replaces a file. The file
    gets the permissions the umask gives any new file, and the process keeps its umask."""
    path = tmp_path / "m.json"
    before = os.umask(0o027)  # a known umask, whatever earlier tests left
    try:
        write_json(str(path), {"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}})
        assert os.umask(0o027) == 0o027 and os.stat(path).st_mode & 0o777 == 0o640
    finally:
        os.umask(before)
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c)) == {"a": None, "b": [1.5, None],
                                                                                     "c": {"d": None}}
    with pytest.raises(FileExistsError):
        write_json(str(path), {"x": 1}, replace=False)
    assert json.loads(path.read_text())["b"] == [1.5, None] and os.listdir(tmp_path) == ["m.json"]
    write_json(str(tmp_path / "new.json"), {"x": 1}, replace=False)  # a new file: written, no temp file left
    assert sorted(os.listdir(tmp_path)) == ["m.json", "new.json"] and json.loads((tmp_path / "new.json").read_text())
    assert path.read_text().startswith('{\n "a": null,\n "b": [\n  1.5,')  # a value per line, a space per level:
    # two runs' metrics.json compare line by line with diff


def test_the_temp_file_is_written_beside_the_file_it_replaces(tmp_path, monkeypatch):
    """write_json renames a temp file in the target's own folder: a rename within one file system, never one from
    /tmp, which fails (EXDEV) where out/ is on another disk, under a hidden name (what a kill -9 mid-write leaves is
    not listed beside the run's files). A write that fails halfway leaves the old file whole."""
    renamed = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: renamed.append((src, dst)) or real(src, dst))
    path = tmp_path / "run" / "metrics.json"
    write_json(str(path), {"x": 1})
    (src, dst), = renamed
    assert os.path.dirname(src) == str(tmp_path / "run") and dst == str(path)
    assert os.path.basename(src).startswith(".tmp-") and src.endswith(".json")
    with pytest.raises(TypeError):
        write_json(str(path), {"x": object()})  # not JSON: fails while writing the temp file
    assert json.loads(path.read_text()) == {"x": 1} and os.listdir(tmp_path / "run") == ["metrics.json"]


def test_given_names_a_flag_typed_with_or_without_its_value():
    assert given(["--lr", "0.1"], "--lr") and given(["--model", "vit", "--lr=0.1"], "--epochs", "--lr")
    assert not given(["--lr-warmup", "3", "0.1"], "--lr") and not given([], "--lr")


def test_a_snapshot_restores_weights_optimizer_and_every_random_generator():
    """restore(snapshot(...)): the weights, the optimizer's state and the Python, NumPy, torch and given generators
    are put back, so what is drawn and trained after it repeats what followed the snapshot. A snapshot of another
    model, or of generators of another kind of device (a GPU run resumed with --device cpu), is one clear error."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(5)

    def step():  # one training step and one draw of each generator
        loss = model(torch.randn(4, 3, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return [random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=gen))]

    step()
    snap = snapshot(1, model, opt, [gen])
    after = step() + [p.detach().clone() for p in model.parameters()]
    step()  # moves everything on
    assert restore(snap, model, opt, [gen]) == 1
    again = step() + [p.detach().clone() for p in model.parameters()]
    assert after[:4] == again[:4] and all(torch.equal(a, b) for a, b in zip(after[4:], again[4:]))
    with pytest.raises(ValueError, match=r"^checkpoint.pt does not fit this run's model and optimizer \('model'\)$"):
        restore({"step": 1}, model, opt)  # the first line of the error, here its only one
    cuda = dict(snap, rng=dict(snap["rng"], generators=[torch.zeros(16, dtype=torch.uint8)]))  # Philox: seed, offset
    with pytest.raises(ValueError, match=r"^checkpoint.pt holds the random generators of a run on another kind "
                                         r"of device \(Expected a CPUGeneratorImplState .*\); resume it with the "):
        restore(cuda, model, opt, [gen])  # a GPU run's checkpoint resumed with --device cpu


def test_a_snapshot_puts_back_the_cuda_generators_on_a_gpu(monkeypatch):
    """On a GPU, snapshot() saves the CUDA generators' states and restore() puts them back too, each as a CPU tensor
    (the form torch takes); the GPU is faked here, so that the suite checks it without one. A checkpoint made on a
    machine without CUDA and resumed on one with it, or the other way round, puts back none."""
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    snap = snapshot(1, model, opt)
    assert (snap["rng"]["cuda"] is None) == (not torch.cuda.is_available())  # no CUDA: no CUDA states saved
    states = [torch.arange(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]  # two GPUs' states
    put = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    assert snapshot(1, model, opt)["rng"]["cuda"] is states  # saved on a GPU
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: put.append(list(s)))
    assert restore(dict(snap, rng=dict(snap["rng"], cuda=states)), model, opt) == 1
    assert len(put) == 1 and len(put[0]) == 2
    assert all(torch.equal(a, b) and a.device.type == "cpu" for a, b in zip(put[0], states))
    put.clear()
    assert restore(dict(snap, rng=dict(snap["rng"], cuda=None)), model, opt) == 1 and put == []  # made without CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert restore(dict(snap, rng=dict(snap["rng"], cuda=states)), model, opt) == 1 and put == []  # a GPU's, on a CPU


def test_divergence_rule(tmp_path, capsys):
    """Non-finite, or over 100x the run's first loss (at least 1), is diverged: marked in metrics.json with its step,
    a non-finite loss written as null; a finite loss below the limit is not. A diverged run counts as finished, and
    a resumed run keeps its first loss (from its history) as the reference."""
    res = Results(str(tmp_path), "vision", {}, "cpu")
    assert not res.diverged("a", 0, 0.7) and not res.diverged("a", 1, 99.0)
    assert res.diverged("a", 2, 101.0)
    assert not res.diverged("b", 0, 3.0) and not res.diverged("b", 5, 299.0) and res.diverged("b", 6, 301.0)
    assert res.diverged("c", 0, float("nan"))
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["runs"]["a"]["diverged"] == {"step": 2, "loss": 101.0}
    assert data["runs"]["c"]["diverged"] == {"step": 0, "loss": None}
    err = capsys.readouterr().err
    assert "c diverged at step 0 (training loss nan: not finite)" in err and "over 100x the initial 0.7" in err
    res.log("d", {"step": 0, "train_loss": 2.0})
    res.log("d", {"step": 5, "train_loss": 1.0})
    assert res.finished("a") and not res.finished("d")  # a diverged run is not trained again on --resume
    torch.save({"run": "d", "state": {"step": 5}}, tmp_path / "checkpoint.pt")
    again = Results(str(tmp_path), "vision", {}, "cpu", resume=True)
    assert again.resume("d", "step") == {"step": 5}
    assert again.diverged("d", 6, 250.0)  # the limit is still 100x the run's first loss (2.0), not this one's


def test_cli_exit_codes(tmp_path, capsys):
    """cli(): a normal run returns; ValueError / FileNotFoundError (as 'reason: file') / out of memory (a GPU's or a
    CPU's) -> 2, a diverged run -> 3, Ctrl-C -> 130, each with one line on stderr and metrics.json marked interrupted;
    any other RuntimeError is a bug and keeps its traceback."""
    def main_of(body):
        def main(args):
            return body()
        main.__module__ = __name__
        return main

    parse = lambda argv: None
    assert cli(main_of(lambda: {"runs": {"x": {}}}), parse, []) is None
    res = Results(str(tmp_path), "vision", {}, "cpu")

    def interrupted():
        with res.recording():
            raise KeyboardInterrupt

    for body, code, text in [(lambda: (_ for _ in ()).throw(ValueError("--n-sens 9 asks for more")), 2, "--n-sens"),
                             (lambda: open(tmp_path / "none.txt"), 2,
                              f"test_runs.py: No such file or directory: {tmp_path / 'none.txt'}\n"),
                             (lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")), 2,
                              "test_runs.py: out of memory; lower --batch-size (or the estimator's chunk), or the "
                              "data's or the model's size\n"),
                             (lambda: torch.empty(2**62, dtype=torch.uint8), 2,  # the CPU allocator's failure
                              "test_runs.py: out of memory; lower --batch-size"),
                             (lambda: {"runs": {"vit/seed0": {"diverged": {"step": 3}}}}, 3, "vit/seed0"),
                             (interrupted, 130, "interrupted")]:
        with pytest.raises(SystemExit) as e:
            cli(main_of(body), parse, [])
        err = capsys.readouterr().err
        assert e.value.code == code and text in err and len(err.strip().splitlines()) == 1, err
    assert json.loads((tmp_path / "metrics.json").read_text())["interrupted"] is True
    with pytest.raises(RuntimeError, match="a bug"):
        cli(main_of(lambda: (_ for _ in ()).throw(RuntimeError("a bug"))), parse, [])


def test_an_error_in_a_run_keeps_its_training_state_and_other_ranks_write_nothing(tmp_path):
    """An error inside recording() (a file found damaged after training, say) writes the latest training state to
    checkpoint.pt, without marking the run interrupted; Results(write=False), a torchrun rank other than 0, writes
    no file at all."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for folder, write in [(tmp_path / "rank0", True), (tmp_path / "rank1", False)]:
        res = Results(str(folder), "vision", {}, "cpu", write=write)
        res.log("a", {"step": 0, "train_loss": 1.0})
        res.checkpoint("a", 0, True, 0, model, opt)  # an evaluation's snapshot, kept in memory (--save-every 0)
        with pytest.raises(ValueError), res.recording():
            raise ValueError("damaged")
        if write:
            assert torch.load(folder / "checkpoint.pt", weights_only=False)["run"] == "a"
            assert "interrupted" not in load_results(str(folder))
        else:
            assert not folder.exists()


# -----------------------------------------------------------------------------
# progress lines on a timer


class Stamped(io.StringIO):
    """A stdout that keeps the time each line was written."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def write(self, text):
        self.lines += [(time.monotonic(), line) for line in text.splitlines() if line]
        return super().write(text)


def test_progress_prints_on_a_timer_through_a_long_evaluation_and_slow_steps(monkeypatch):
    """A loop whose first evaluation takes 0.6 s and whose steps take 30 ms, with a line every 0.1 s: the first line
    comes during that evaluation (within two periods of the start), no gap between lines is much over a period, the
    lines give the loss, ms per step and the time to the next evaluation and to the end, and one line gives the
    estimated time of the run once three steps are timed. stop() ends the thread before it returns."""
    out = Stamped()
    monkeypatch.setattr(sys, "stdout", out)
    t0 = time.monotonic()
    progress = Progress("vit/seed0", 0, 40, 20, every=0.1)
    for step in range(41):
        evaluating = step % 20 == 0 or step == 40
        progress.tick(step, evaluating, torch.tensor(0.5 + step))
        time.sleep(0.6 if step == 0 else 0.1 if evaluating else 0.03)
    progress.stop()
    assert not progress.thread.is_alive()  # joined: no thread left to wake while the process exits
    times = [t0] + [t for t, _ in out.lines]
    text = [line for _, line in out.lines]
    assert times[1] - t0 < 0.2 and "step 0/40 | evaluating for" in text[0]
    assert max(b - a for a, b in zip(times, times[1:])) < 0.25
    ticking = [line for line in text if "ms/step" in line]
    assert len(ticking) >= 5 and all("next evaluation in" in line and "end in" in line for line in ticking)
    assert re.search(r"loss \d+\.5000 \| 3\d ms/step", ticking[0]), ticking[0]
    estimate = [line for line in text if "estimated time of this run" in line]
    assert len(estimate) == 1 and "36 steps at 3" in estimate[0] and "2 evaluations at" in estimate[0]
    spent = progress.seconds()  # 38 training steps of 30 ms; evaluations 0.6 + 0.1 s (the last one's tick ends it)
    assert spent["training"] == pytest.approx(38 * 0.03, rel=0.3)
    assert spent["evaluations"] == pytest.approx(0.7, rel=0.2) and spent["final"] == pytest.approx(0.1, abs=0.05)


def test_progress_estimate_names_a_cpu_sized_command_when_over_an_hour(capsys):
    """The estimate line is followed by the hint only when the estimate is over an hour on a CPU; the arithmetic of
    the estimate: steps left x median step time + evaluations left x an evaluation's time."""
    for cpu, total, hinted in [(True, 10**6, True), (False, 10**6, False), (True, 100, False)]:
        progress = Progress("m/seed0", 0, total, 50, every=0, hint="try --small", cpu=cpu)
        progress.last, progress.evals = (time.monotonic(), 4, False), [1.0]
        progress.steps = [0.01, 0.01, 0.02]
        assert progress.evals_left(4) == total // 50 + 0 and progress.eval_time() == pytest.approx(0.99)
        assert progress.seconds_left(4) == pytest.approx((total - 4) * 0.01 + total // 50 * 0.99)
        progress.steps.pop()
        progress.tick(5, False)
        out = capsys.readouterr().out
        assert "estimated time of this run" in out and ("try --small" in out) == hinted, out
    assert [duration(s) for s in [4.7e-6, 0.0049, 0.005, 0.02, 5, 90, 119.4, 120, 600, 36000, 1e6]] == [
        "0 s", "0 s", "0.005 s", "0.02 s", "5 s", "90 s", "119 s", "2.0 min", "10.0 min", "10.0 h", "277.8 h"]
    assert duration(math.inf) == duration(math.nan) == "?"  # not 'inf h' or 'nan h'
    last = Progress("m/seed0", 0, 101, 50, every=0)  # evaluations at 50, 100 and the last step, 101
    assert [last.evals_left(s) for s in (4, 50, 100)] == [3, 2, 1]
    # a guess (seconds per step, per evaluation) is told at once: 1,000 steps and 21 evaluations (0 to 1,000 by 50)
    Progress("m/seed0", 0, 1000, 50, every=0, hint="try --small", guess=(3.0, 60.0))
    assert capsys.readouterr().out.splitlines() == [
        "m/seed0 | estimated time of this run on this machine: about 71.0 min (guessed from a timed forward pass; "
        "timed after a few steps)", "m/seed0 | over an hour on a CPU; try --small"]
    for per_eval, hinted in [(300.0, False), (300.5, True)]:  # 1,000 x 3 s + 2 evaluations: 3,600 s, then 3,601 s
        Progress("m/seed0", 0, 1000, 1000, every=0, hint="try --small", guess=(3.0, per_eval))
        assert ("over an hour on a CPU" in capsys.readouterr().out) == hinted, per_eval
    Progress("m/seed0", 0, 1000, 50, every=0, guess=(3.0, 60.0), early=True)  # --until-acc may stop it sooner
    assert "this machine: at most about 71.0 min" in capsys.readouterr().out
    # a run that stops early (--until-acc) at the evaluation of step 300: its lines now say final measurements
    progress = Progress("m/seed0", 0, 1000, 50, every=0, early=True)
    progress.tick(300, True)
    assert "step 300/1000 | evaluating for" in progress.line()
    progress.end_early()
    assert "step 300/300 | final evaluation and measurements for" in progress.line()


def test_each_progress_line_says_where_the_run_is_and_what_is_left(capsys):
    """line() in each state, set by hand (100 steps of 10 an epoch, an evaluation every 30): an evaluation before any
    is timed, with the guess's time to the end; one after, with the last one's time; a training step, with the steps
    to the next evaluation (or to the end, where that comes first) at the median step time."""
    progress = Progress("m/seed0", 0, 100, 30, every=0, per_epoch=10, guess=(0.5, 20.0))
    capsys.readouterr()
    progress.last = (time.monotonic(), 5, False)  # a training step before any is timed
    assert progress.line() == "m/seed0 | step 5/100 (epoch 0.5) | timing the first steps"
    progress.last = (time.monotonic() - 300, 30, True)  # 70 steps x 0.5 s + 4 evaluations (30 to 90, 100) x 20 s
    assert progress.line() == "m/seed0 | step 30/100 (epoch 3.0) | evaluating for 5.0 min | about 20 s each, end in " \
                              "about 115 s (guessed from a timed forward pass)"
    progress.evals, progress.steps = [2.5], [0.5, 0.4, 0.6]  # an evaluation is 2.5 s less a step's 0.5 s
    assert progress.line().endswith(" | the last evaluation took 2 s"), progress.line()
    progress.last, progress.loss = (time.monotonic(), 45, False), torch.tensor(0.25)  # 15 steps to step 60
    assert progress.line() == "m/seed0 | step 45/100 (epoch 4.5) | loss 0.2500 | 500 ms/step | next evaluation in " \
                              "7.5 s | end in 34 s"  # 55 steps x 0.5 s + 3 evaluations x 2 s
    progress.last = (time.monotonic(), 95, False)  # the last evaluation, at step 100, comes before step 120
    assert "| next evaluation in 2.5 s | end in 4.5 s" in progress.line(), progress.line()


@pytest.mark.slow
def test_a_slow_training_loop_prints_progress_on_time(tmp_path, monkeypatch):
    """vision.py with training steps slowed to 50 ms and --progress-every 0.3: progress lines with the epoch, ms per
    step and the time to the end come between the evaluations, at most about a period apart."""
    real = torch.Tensor.backward

    def slow(self, *a, **k):
        time.sleep(0.05)
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "backward", slow)
    importlib.import_module("torch._dynamo")  # the first optimizer step imports it: a second that holds the interpreter
    out = Stamped()
    monkeypatch.setattr(sys, "stdout", out)
    t0 = time.monotonic()
    vision.main(vision.parse_args(["--dataset", "fake28", "--model", "mlp", "--epochs", "4", "--eval-every", "2",
                                   "--batch-size", "20", "--n-train", "200", "--n-test", "20", "--n-sens", "5",
                                   "--mlp-hidden", "16", "--progress-every", "0.3", "--out-dir", str(tmp_path)]))
    lines = [(t, line) for t, line in out.lines if " | step " in line]
    assert any(re.search(r"step \d+/40 \(epoch \d\.\d\) \| loss [\d.]+ \| 5\d ms/step \| next evaluation in .* \| end "
                         r"in", line) for _, line in lines), [line for _, line in lines]
    training = [t for t, line in out.lines if "/seed0" in line]  # every line of the run, progress or evaluation
    assert training[0] - t0 < 5 and max(b - a for a, b in zip(training, training[1:])) < 0.6


def test_an_evaluations_time_is_its_iterations_mean_less_a_training_step():
    """An iteration that evaluates also takes a training step (but the last): an evaluation's time is the mean of
    those iterations less the median step, the whole mean while no step is timed, and 0 while no evaluation is."""
    progress = Progress("m/seed0", 0, 100, 10, every=0)
    assert progress.eval_time() == 0
    progress.evals = [0.4, 0.6]
    assert progress.eval_time() == pytest.approx(0.5)
    progress.steps = [0.1, 0.1, 0.3]
    assert progress.eval_time() == pytest.approx(0.4)


def test_time_forward_is_seconds_per_input_of_the_second_call_in_eval_mode():
    """A model that takes 50 ms a call on 10 inputs: about 5 ms an input, and the model is left in eval mode."""
    class Slow(torch.nn.Module):
        def forward(self, x):
            time.sleep(0.05)
            return x

    model = Slow().train()
    assert 0.005 <= time_forward(model, torch.zeros(10, 3)) < 0.02 and not model.training


def test_a_runs_progress_lines_follow_progress_every_on_rank_0_and_hint_on_a_cpu_alone(tmp_path, monkeypatch):
    """Results.progress prints every --progress-every seconds (20 if the run's flags have none), never on a torchrun
    rank that does not write (write=False), and gives the CPU-size hint on a CPU only."""
    made, real = [], runs.Progress
    monkeypatch.setattr(runs, "Progress", lambda *a, **kw: made.append(kw) or real(*a, **{**kw, "every": 0}))
    for args, device, write in [({"progress_every": 7}, "cpu", True), ({}, "cpu", True),
                                ({"progress_every": 7}, "cpu", False), ({"progress_every": 7}, "cuda", True)]:
        results = Results(str(tmp_path), "vision", args, "cpu", write=write)
        results.device = torch.device(device)  # a GPU run's (its environment cannot be read without a GPU)
        results.progress("m/seed0", 0, 10, 5)
    assert [(kw["every"], kw["cpu"]) for kw in made] == [(7, True), (20, True), (0, True), (7, False)]


def test_every_runs_progress_lines_stop_when_its_training_ends(tmp_path, monkeypatch):
    """Each run's progress thread is stopped once the run has its final numbers: no line of an ended run is printed
    while the next one trains or after the script returns."""
    made, real = [], runs.Progress
    monkeypatch.setattr(runs, "Progress", lambda *a, **kw: made.append(real(*a, **kw)) or made[-1])
    vision.main(vision.parse_args(["--dataset", "fake28", "--model", "mlp", "cnn", "--epochs", "1", "--n-train", "20",
                                   "--n-test", "10", "--n-sens", "2", "--mlp-hidden", "8", "--out-dir", str(tmp_path)]))
    assert len(made) == 2 and all(p.done.is_set() for p in made)


def test_a_runs_progress_lines_stop_once_its_final_numbers_are_in(tmp_path, capsys):
    """Results.final stops the run's progress thread at once (not when the next run starts): no line is printed
    while a script goes on after a run (robustness.py's measurements, the next run's data and model), and the
    ended Progress still gives the run's seconds to a second final()."""
    res = runs.Results(str(tmp_path), "vision", {"progress_every": 0.02}, "cpu")
    progress = res.progress("m/seed0", 0, 10, 5)
    progress.tick(0, False)
    time.sleep(0.1)
    assert "m/seed0 | step 0/10" in capsys.readouterr().out
    res.final("m/seed0", {"acc": 0.5})
    assert progress.done.is_set() and res.current is None and res.ended is progress
    capsys.readouterr()  # a line the thread began before final() stopped it (final waits for it)
    time.sleep(0.1)
    assert capsys.readouterr().out == ""
    res.final("m/seed0", {"corrupt_acc": 0.4})
    assert set(res.data["runs"]["m/seed0"]["seconds"]) == {"training", "evaluations", "final"}
    diverged = res.progress("m/seed1", 0, 10, 5)  # a run without final numbers: the next run's start stops it
    res.progress("m/seed2", 0, 10, 5)
    assert diverged.done.is_set() and res.ended is diverged
    res.stop_progress()


def test_seed_all_seeds_pythons_numpys_and_torchs_generators():
    """The same seed gives the same draws of random, numpy and torch; another seed other draws of each."""
    def draws(seed):
        runs.seed_all(seed)
        return random.random(), float(np.random.rand()), torch.rand(1).item()
    first, again, other = draws(3), draws(3), draws(4)
    assert first == again and all(a != b for a, b in zip(first, other))


def test_threads_are_one_per_process_by_default_and_at_most_four_per_core(kept_threads):
    """--threads 0 (the default policy) is one thread; a number is that many, up to 4x the cores; more, or fewer
    than 0, is refused with a message."""
    cores = os.cpu_count() or 1
    assert set_threads(0) == 1 and set_threads(2) == 2 and set_threads(4 * cores) == 4 * cores
    with pytest.raises(ValueError, match=f"--threads {4 * cores + 1} is more than 4x the {cores} cores"):
        set_threads(4 * cores + 1)
    with pytest.raises(ValueError, match="--threads must be >= 0"):
        set_threads(-1)


def test_all_sum_adds_the_ranks_numbers_in_float64(monkeypatch):
    """all_sum under torchrun (two ranks stood in for, each holding the same numbers): the sums are exact in float64,
    a loss of 0.1 as well as a count above 2^24, where float32 would round both."""
    monkeypatch.setattr(runs, "ranks", lambda: (0, 2))
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: "gloo")
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t: t.mul_(2))
    assert runs.all_sum(0.1, 2**24 + 1, 3) == (0.2, 2**25 + 2, 6)
    monkeypatch.setattr(runs, "ranks", lambda: (0, 1))
    assert runs.all_sum(0.1, 7) == (0.1, 7)  # one process: the numbers themselves


def test_under_torchrun_batchnorm_is_synchronised_on_gpus_only(monkeypatch):
    """for_training under torchrun (two ranks and DDP stood in for): on a GPU each BatchNorm becomes a SyncBatchNorm
    and DDP is given the GPU; on a CPU, where SyncBatchNorm cannot run, the BatchNorm stays and DDP gets no device.
    One process: the model itself."""
    monkeypatch.setattr(runs, "ranks", lambda: (0, 2))
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda m, device_ids: (m, device_ids))
    for device, norm, ids in [("cpu", torch.nn.BatchNorm2d, None), ("cuda:0", torch.nn.SyncBatchNorm, ["cuda:0"])]:
        model, got_ids = runs.for_training(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)),
                                           torch.device(device))
        assert type(model[1]) is norm and got_ids == (ids and [torch.device(i) for i in ids]), device
    monkeypatch.setattr(runs, "ranks", lambda: (0, 1))
    model = torch.nn.Linear(2, 2)
    assert runs.for_training(model, torch.device("cpu")) is model


def test_under_torchrun_a_gpu_run_joins_nccl_on_its_local_gpu_and_a_cpu_run_gloo(monkeypatch, kept_threads):
    """setup() under torchrun (WORLD_SIZE > 1), with the process group and the CUDA calls stood in for: --device cuda,
    or auto where CUDA is present, joins nccl on GPU LOCAL_RANK and runs there; --device cpu, or auto without CUDA,
    joins gloo and sets no GPU. Rank 0 alone prints."""
    from types import SimpleNamespace

    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: calls.append(backend))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(f"gpu {i}"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    for device, has_cuda, expected, on in [("cuda", False, ["gpu 1", "nccl"], "cuda:1"),
                                           ("auto", True, ["gpu 1", "nccl"], "cuda:1"),
                                           ("auto", False, ["gloo"], "cpu"), ("cpu", True, ["gloo"], "cpu")]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda has_cuda=has_cuda: has_cuda)
        calls.clear()
        got = runs.setup(SimpleNamespace(threads=0, device=device))
        assert calls == expected and str(got) == on, (device, has_cuda, calls, got)
    assert sys.stdout is not None and sys.stdout.name != os.devnull  # rank 0 prints
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored afterwards
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    runs.setup(SimpleNamespace(threads=0, device="cpu"))
    assert sys.stdout.name == os.devnull  # the other ranks are silenced
    sys.stdout.close()  # the file setup() opened (sys.stdout itself is restored afterwards)


def test_get_device_takes_a_cuda_index_the_machine_has(monkeypatch):
    """With one GPU (stood in for), cuda and cuda:0 are devices and cuda:1 is one clear error, not a failure at the
    first tensor moved there; auto is cuda."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert [str(runs.get_device(name)) for name in ["cuda", "cuda:0", "auto"]] == ["cuda", "cuda:0", "cuda"]
    with pytest.raises(ValueError, match=r"^--device cuda:1: this machine has 1 CUDA device\(s\), numbered from 0$"):
        runs.get_device("cuda:1")


def test_a_data_folder_that_cannot_hold_a_lock_is_read_unlocked(tmp_path):
    """Where folder/.lock cannot be made (here the folder's parent is a file) the block still runs, unlocked."""
    (tmp_path / "a-file").write_text("")
    ran = []
    with one_at_a_time(str(tmp_path / "a-file" / "data")):
        ran.append(True)
    assert ran == [True]


# -----------------------------------------------------------------------------
# --resume through the script's parser


def test_resume_of_a_folder_written_before_a_flag_existed(tmp_path, monkeypatch, capsys):
    """A run folder whose saved arguments lack a flag (it was added to the script later) resumes with that flag's
    default, and says from which step (resumed from the command line itself, sys.argv); any flag other than --threads
    and --device beside --resume is refused."""
    argv = ["--case", "sparse-lower", "--seeds", "0", "--steps", "6", "--eval-every", "2", "--n-train", "100",
            "--n-test", "20", "--n-sens", "10", "--out-dir", str(tmp_path), "--run-name", "r"]
    stop_at_backward(monkeypatch, 4)
    with pytest.raises(SystemExit) as e:
        cli(synthetic.main, synthetic.parse_args, argv)
    assert e.value.code == 130
    monkeypatch.undo()
    folder = tmp_path / "synthetic" / "r"
    data = json.loads((folder / "metrics.json").read_text())
    del data["args"]["reps"]  # as if --reps had been added to synthetic.py after this run was written
    data["args"]["noise"] = "uniform"  # ... and a --noise flag removed since
    data["args"]["device"] = "cuda:7"  # the device, threads and progress lines come from this command, never from
    data["args"]["progress_every"] = 0.5  # the folder (their defaults where the command gives none)
    (folder / "metrics.json").write_text(json.dumps(data))
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["synthetic.py", "--resume", str(folder), "--threads", "1"])  # as typed
    resumed = synthetic.main(synthetic.parse_args())
    assert "noise" not in resumed["args"] and resumed["args"]["device"] == "cpu"
    assert resumed["args"]["threads"] == 1 and resumed["args"]["progress_every"] == 20
    assert "from sparse-lower/seed0's checkpoint at 2" in capsys.readouterr().out
    assert resumed["args"]["reps"] == 2 and resumed["args"]["steps"] == 6  # the new flag's default, the saved flags
    assert [h["step"] for h in resumed["runs"]["sparse-lower/seed0"]["history"]] == [0, 2, 4, 6]
    with pytest.raises(SystemExit):
        synthetic.parse_args(["--resume", str(folder), "--steps", "9"])
    assert "only --threads, --device and --progress-every may be given beside it, not --steps" in \
        capsys.readouterr().err


# -----------------------------------------------------------------------------
# report.py: redraw one folder, merge several


def vision_run(tmp_path, name, *extra):
    argv = ["--dataset", "fake28", "--model", "vit", "mlp", "--epochs", "1", "--n-train", "60", "--n-test", "20",
            "--n-sens", "6", "--batch-size", "30", "--sigma", "0.3", "3", "--depth", "1", "--heads", "2", "--dim", "16",
            "--dim-head", "8", "--mlp-dim", "16", "--mlp-hidden", "16", "--out-dir", str(tmp_path), "--run-name", name]
    vision.main(vision.parse_args(argv + list(extra)))
    return str(tmp_path / "vision" / name)


@pytest.mark.slow
def test_report_merges_seeds_run_apart_and_data_sizes(tmp_path, capsys):
    """Two vision.py folders of one seed each merge into a new folder whose paired differences have both seeds (the
    same numbers as one run of both seeds); folders of two --n-train sizes merge into a data-scale study; the
    sources are never written to."""
    a, b = vision_run(tmp_path, "s0", "--seeds", "0"), vision_run(tmp_path, "s1", "--seeds", "1")
    both = vision_run(tmp_path, "both", "--seeds", "0", "1")
    before = os.path.getmtime(os.path.join(a, "metrics.json"))
    merged = report.main(report.parse_args([a, b, "--out-dir", str(tmp_path), "--run-name", "m"]))
    whole = load_results(both)
    d, w = merged["paired"]["models"]["mlp"]["diff"]["patch:3"], whole["paired"]["models"]["mlp"]["diff"]["patch:3"]
    assert d["seeds"] == 2 and d == w and merged["runs"].keys() == whole["runs"].keys()
    out = tmp_path / "vision" / "m"
    assert load_results(str(out))["sources"] == [a, b] and (out / "sigma_sweep.png").stat().st_size > 5000
    for r in merged["runs"].values():  # each run keeps what it was measured under, beside its numbers
        assert r["measured_under"]["sigma"] == [0.3, 3] and r["measured_under"]["sens_seed"] == 0
        assert r["measured_under"]["n_sens"] == 6 and r["measured_under"]["mask"] == ["patch"]
    assert os.path.getmtime(os.path.join(a, "metrics.json")) == before
    printed = capsys.readouterr().out
    assert "mlp - vit | patch:0.3" in printed
    assert printed.splitlines()[-1].startswith(f"wrote {out / 'metrics.json'} {out}")  # the merge's files, last
    small = vision_run(tmp_path, "n30", "--seeds", "0", "--n-train", "30")
    with pytest.raises(ValueError, match=r"different flags \(--n-train: 60 / 30\).*--vary n-train"):
        report.merge([a, small])
    scale = report.main(report.parse_args([a, small, "--out-dir", str(tmp_path), "--run-name", "scale", "--vary",
                                           "n-train"]))
    assert scale["varied"] == {"n-train": [60, 30]}
    assert scale["args"]["n_train"] == 60 and merged["args"]["seeds"] == [0]  # a merge's args: its first folder's
    assert set(scale["data_scale"]) == {"30", "60"} and not scale["runs"]
    assert merged["data"] == load_results(a)["data"] and "data" not in scale  # one dataset, or none named
    lines = capsys.readouterr().out.splitlines()  # the summary: the paired differences at each size, smallest first
    assert [line.split(" | ")[:2] for line in lines if " images | " in line] == [["30 images", "mlp - vit"],
                                                                                  ["60 images", "mlp - vit"]]
    at = {n: scale["data_scale"][n]["models"]["mlp"]["diff"]["patch:3"]["per_seed"] for n in ["30", "60"]}
    assert at["60"] == {"seed0": d["per_seed"]["seed0"]} and at["30"].keys() == {"seed0"}
    assert (tmp_path / "vision" / "scale" / "data_scale.png").stat().st_size > 5000


@pytest.mark.slow
def test_report_imports_torch_only_to_make_paired_differences(tmp_path):
    """report.py imports torch (through common.py) only when a merge makes paired differences, so --times, --claims,
    a redraw and the other merges start in 0.3 s instead of 3.8: the smoke calls it up to 37 times. In a process of
    its own: --times, --claims and a redraw leave torch unimported; the merge of two vision.py seeds imports it and
    writes the numbers of the same merge here."""
    a, b = vision_run(tmp_path, "s0", "--seeds", "0"), vision_run(tmp_path, "s1", "--seeds", "1")
    code = ("import sys, report\n"
            "a, b, out = sys.argv[1:]\n"
            "loaded = lambda: print('imported', sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'common'}))\n"
            "for argv in [['--times', a, b], ['--claims', out], [a]]:\n"
            "    report.main(report.parse_args(argv))\n"
            "loaded()\n"
            "report.main(report.parse_args([a, b, '--out-dir', out, '--run-name', 'm']))\n"
            "loaded()")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, a, b, str(tmp_path)], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    imported = [line for line in out.stdout.splitlines() if line.startswith("imported ")]
    assert imported == ["imported []", "imported ['common', 'torch']"] and "| total " in out.stdout
    here = report.merge([a, b])["paired"]
    assert load_results(str(tmp_path / "vision" / "m"))["paired"] == here and here["models"]["mlp"]["diff"]
    assert (tmp_path / "vision" / "m" / "sigma_sweep.png").stat().st_size > 5000


@pytest.mark.slow
def test_report_merges_one_model_at_two_sizes_named_by_its_flags(tmp_path):
    """The same model in folders that differ in a flag the merge varies (the MLP at two widths, as the ViT at two
    sizes in reproduce.sh's vitsize row) is named by its values there and paired like two models: the difference is
    the two runs' per-image flips apart, on the same images and noise. Without --vary the merge refuses them."""
    one = vision_run(tmp_path, "w16", "--seeds", "0", "--model", "mlp", "--sigma", "30")
    two = vision_run(tmp_path, "w64", "--seeds", "0", "--model", "mlp", "--sigma", "30", "--mlp-hidden", "64")
    merged = report.merge([one, two], vary=["mlp-hidden"])
    assert set(merged["runs"]) == {"mlp[mlp-hidden=[16]]/seed0", "mlp[mlp-hidden=[64]]/seed0"}
    assert merged["runs"]["mlp[mlp-hidden=[64]]/seed0"]["model"] == "mlp[mlp-hidden=[64]]"
    assert merged["paired"]["reference"] == "mlp[mlp-hidden=[16]]"
    diff = merged["paired"]["models"]["mlp[mlp-hidden=[64]]"]["diff"]["patch:30"]
    flips = [load_results(f)["runs"]["mlp/seed0"]["final"]["per_image"]["patch:30"] for f in (one, two)]
    assert diff["mean"] == pytest.approx(sum(b - a for a, b in zip(*flips)) / len(flips[0]))
    assert any(a != b for a, b in zip(*flips))  # not vacuous: the two widths flip differently
    with pytest.raises(ValueError, match="different flags"):
        report.merge([one, two])


def test_a_size_study_names_its_models_by_the_varied_flags_that_differ(tmp_path):
    """Of the flags --vary names, a model in several folders is named by those its folders differ in (depth here,
    not heads, the same in both); a model in one folder keeps its name."""
    run = {"model": "vit", "seed": 0, "history": [], "final": {}}
    folders = []
    for depth, runs_in in [(8, ["vit/seed0", "mlp/seed0"]), (12, ["vit/seed0"])]:
        (tmp_path / str(depth)).mkdir()
        args = {"seeds": [0], "depth": depth, "heads": 4}
        write_json(str(tmp_path / str(depth) / "metrics.json"),
                   {"script": "vision", "args": args, "runs": {r: {**run, "model": r.split("/")[0]} for r in runs_in}})
        folders.append(str(tmp_path / str(depth)))
    merged = report.merge(folders, vary=["depth", "heads"])
    assert set(merged["runs"]) == {"vit[depth=8]/seed0", "vit[depth=12]/seed0", "mlp/seed0"}


def test_report_refuses_what_it_cannot_merge_or_read(tmp_path):
    """A run in two folders, folders of two scripts, a metrics.json without runs, or one naming no script of this
    repository: each a ValueError naming the problem, nothing drawn."""
    def folder(name, data):
        (tmp_path / name).mkdir()
        write_json(str(tmp_path / name / "metrics.json"), data)
        return str(tmp_path / name)

    run = {"model": "vit", "seed": 0, "history": [], "final": {}}
    a = folder("a", {"script": "vision", "runs": {"vit/seed0": run}})
    b = folder("b", {"script": "vision", "runs": {"vit/seed0": run}})
    c = folder("c", {"script": "grokking", "runs": {}})
    with pytest.raises(ValueError, match="vit/seed0 is in more than one of the folders"):
        report.merge([a, b])
    with pytest.raises(ValueError, match="written by different scripts"):
        report.merge([a, c])
    for flag, x, y in [("sigma", [0.1], [0.5]), ("sens_seed", 0, 1), ("n_sens", 500, 100), ("mask", ["patch"], None)]:
        args = {"seeds": [0], "threads": 1, "sigma": [0.1], "sens_seed": 0, "n_sens": 500, "mask": ["patch"]}
        f = folder(f"x-{flag}", {"script": "vision", "args": {**args, flag: x}, "runs": {"vit/seed0": run}})
        g = folder(f"y-{flag}", {"script": "vision", "args": {**args, flag: y, "seeds": [1], "threads": 2,
                                                             "device": "cuda", "run_name": "y", "no_figures": True},
                                 "runs": {"vit/seed1": run}})
        dashed = flag.replace("_", "-")
        with pytest.raises(ValueError, match=f"different flags \\(--{dashed}: {re.escape(f'{x} / {y}')}\\)"):
            report.merge([f, g])
        assert set(report.merge([f, g], vary=[dashed])["runs"]) == {"vit/seed0", "vit/seed1"}
    old = folder("old", {"script": "vision", "args": args, "runs": {"vit/seed1": run}})  # before --flat-patches
    new = folder("new", {"script": "vision", "args": {**args, "flat_patches": None}, "runs": {"vit/seed0": run}})
    assert len(report.merge([old, new])["runs"]) == 2  # a flag absent from an older folder counts as off
    with pytest.raises(ValueError, match="--vary sigmaa: no such flag"):
        report.merge([old, new], vary=["sigmaa"])
    with pytest.raises(SystemExit) as e:  # the merged folder stays inside --out-dir, as the scripts' run folders
        report.parse_args([a, b, "--run-name", "../../x"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        report.parse_args(["--claims", str(tmp_path), a])  # run folders or --claims, not both
    with pytest.raises(ValueError, match="no 'runs' mapping"):
        load_results(folder("d", {"script": "vision", "runs": [1, 2]}))
    with pytest.raises(ValueError, match="names no script of this repository"):
        report.draw({"runs": {}}, str(tmp_path))


def test_a_merge_names_the_runs_that_have_no_final_numbers_yet(tmp_path, capsys):
    """A folder whose run is still training (its final numbers empty) merges, but the merge lists it and says so in
    one line, since its final numbers are missing from the paired differences; a diverged run, which ended, is not
    listed, and its folder redrawn exits 3, as the run did."""
    def folder(name, runs):
        (tmp_path / name).mkdir()
        write_json(str(tmp_path / name / "metrics.json"), {"script": "grokking", "args": {}, "runs": runs})
        return str(tmp_path / name)

    done = folder("done", {"grok/seed0": {"model": "grok", "seed": 0, "history": [],
                                           "final": {"epoch_memorised": 9, "epoch_grokked": 30, "sens": 0.5}}})
    going = folder("going", {"grok/seed1": {"model": "grok", "seed": 1, "history": [], "final": {}}})
    dead = folder("dead", {"grok/seed2": {"model": "grok", "seed": 2, "history": [], "final": {}, "diverged": 7}})
    merged = report.main(report.parse_args([done, going, dead, "--out-dir", str(tmp_path), "--run-name", "m"]))
    assert merged["unfinished"] == [f"grok/seed1 in {going}"]
    assert load_results(str(tmp_path / "grokking" / "m"))["unfinished"] == merged["unfinished"]
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [f"note: grok/seed1 in {going} has no final numbers yet (still running, or stopped: --resume it), "
                     "so the merge's final numbers leave it out"]
    assert "unfinished" not in report.merge([done, dead])
    with pytest.raises(SystemExit) as e:  # redrawn alone, the diverged run's folder exits 3 as its run did
        cli(report.main, report.parse_args, [dead])
    assert e.value.code == 3 and "1 run(s) diverged (grok/seed2)" in capsys.readouterr().err


def test_the_readme_snippets_run_from_another_folder(tmp_path):
    """Every Python block of the README, saved as a file in another folder and run as the README says (this
    repository on PYTHONPATH), offline: the estimator prints a sensitivity with its standard error, and the
    corruption accuracy runs without the release or the frost textures and says frost was skipped."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    blocks = open(os.path.join(root, "README.md")).read().split("```python\n")[1:]
    assert len(blocks) == 2
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
    outputs = []
    for i, block in enumerate(blocks):
        (tmp_path / f"mine{i}.py").write_text(block.split("```", 1)[0])
        out = subprocess.run([sys.executable, f"mine{i}.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        outputs.append(out.stdout)
    assert re.fullmatch(r"sensitivity 0\.\d{4} \+- 0\.\d{4}\n", outputs[0]), outputs[0]
    assert re.fullmatch(r"clean 0\.\d+ \| mean corruption 0\.\d+ over 14 of the 15 \| skipped \['frost'\]\n",
                        outputs[1]), outputs[1]


def test_pyproject_names_every_module():
    """`pip install -e .` installs the modules pyproject.toml names: every top-level .py file of the repository."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "pyproject.toml")).read()
    named = set(re.findall(r'"(\w+)"', text.split("py-modules = [", 1)[1].split("]", 1)[0]))
    assert named == {f[:-3] for f in os.listdir(root) if f.endswith(".py")}


def test_time_split_in_minutes(tmp_path, capsys):
    """report.py --times: each run's training, evaluation and final-measurement minutes and their total; runs
    written before the split are left out."""
    runs = {"vit/seed0": {"history": [], "final": {}, "seconds": {"training": 600, "evaluations": 360, "final": 480}},
            "mlp/seed0": {"history": [], "final": {}}}
    write_json(str(tmp_path / "metrics.json"), {"script": "vision", "runs": runs})
    report.main(report.parse_args([str(tmp_path), "--times"]))
    assert capsys.readouterr().out == ("vit/seed0 | training 10.0 min | evaluations 6.0 min | final measurements 8.0 "
                                       "min | total 24.0 min\n")  # (large enough that 1/61 would show)
    (tmp_path / "b").mkdir()  # a row of several folders: their sum on a last line
    write_json(str(tmp_path / "b" / "metrics.json"), {"script": "vision", "runs": {"cnn/seed0": {
        "history": [], "final": {}, "seconds": {"training": 30, "evaluations": 30, "final": 30}}}})
    report.main(report.parse_args([str(tmp_path), str(tmp_path / "b"), "--times"]))
    assert capsys.readouterr().out.splitlines()[-1] == ("all 2 runs | training 10.5 min | evaluations 6.5 min | "
                                                        "final measurements 8.5 min | total 25.5 min")


def test_a_resumed_run_counts_the_time_before_its_checkpoint(tmp_path, capsys):
    """The seconds a run records cover the whole run: its checkpoint keeps the training and evaluation time so far,
    and the Progress of the resumed invocation starts from them. metrics.json keeps the environment of each resumed
    invocation beside that of the first (CPU runs repeat bit for bit on one processor only). One line says where the
    run goes on from."""
    from runs import Results

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    res = Results(str(tmp_path), "synthetic", {}, "cpu")
    progress = res.progress("m/seed0", 0, 10, 5)
    progress.steps, progress.evals = [2.0, 3.0], [7.0]  # as if timed
    res.checkpoint("m/seed0", 5, True, 5, model, opt)
    res.stop_progress()
    again = Results(str(tmp_path), "synthetic", {}, "cpu", resume=True)
    capsys.readouterr()
    assert again.resume("m/seed0", "step")["step"] == 5
    assert capsys.readouterr().out == "m/seed0: resumed after step 5\n"
    assert again.data["env"] == res.data["env"] and again.data["resumed"] == [runs.environment("cpu")]
    spent = again.progress("m/seed0", 5, 10, 5).seconds()
    assert spent == {"training": 5.0, "evaluations": 7.0, "final": 0.0}  # no tick yet: no final measurements
    fresh = again.progress("m/seed1", 0, 10, 5).seconds()  # another run starts from nothing
    assert fresh == {"training": 0.0, "evaluations": 0.0, "final": 0.0}


def test_matched_accuracy_table_over_seeds(capsys):
    """Per model and level: the seeds that reach it, and the mean +- s.e. over them of the epoch and each
    sensitivity; a seed that never reaches a level is left out of that level and counted."""
    def run(model, seed, at):
        return {"model": model, "seed": seed, "history": [], "final": {"match_acc": at}}

    data = {"runs": {"vit/seed0": run("vit", 0, {"0.9": {"epoch": 10, "sens@patch:0.1": 0.1}, "0.99": None}),
                     "vit/seed1": run("vit", 1, {"0.9": {"epoch": 20, "sens@patch:0.1": 0.3},
                                                 "0.99": {"epoch": 40, "sens@patch:0.1": 0.2}})}}
    report.matched_accuracy(data)
    assert capsys.readouterr().out.splitlines() == [
        "vit at train acc 0.9 (2 of 2 seeds) | epoch 15.0 +- 5.0 | patch:0.1 0.2000 +- 0.1000",
        "vit at train acc 0.99 (1 of 2 seeds) | epoch 40.0 | patch:0.1 0.2000"]


def test_own_numbers_per_model_over_seeds(capsys):
    """Each model's own final numbers: accuracies and sensitivities as mean +- s.e. over its seeds, the epochs it
    stopped at; a model of one seed shows its s.e. over the inputs; a run without its sweep is left out."""
    def run(model, seed, epoch, acc, sens, stderr=0.01):
        return {"model": model, "seed": seed, "history": [], "final": {
            "train_acc": acc, "test_acc": acc - 0.1, "epoch": epoch,
            "sens_at": {"patch:0.1": {"sens": sens, "stderr": stderr}, "flat:0.1": {"sens": 2 * sens, "stderr": 0}}}}

    data = {"runs": {"vit/seed0": run("vit", 0, 45, 0.99, 0.1), "vit/seed1": run("vit", 1, 50, 0.97, 0.3),
                     "mlp/seed0": run("mlp", 0, 65, 0.95, 0.02, stderr=0.005),
                     "cnn/seed0": {"model": "cnn", "seed": 0, "history": [], "final": {}}}}
    report.own_numbers(data)
    assert capsys.readouterr().out.splitlines() == [
        "vit (2 seeds) | train acc 0.980 +- 0.010 | test acc 0.880 +- 0.010 | epoch 45-50 | patch:0.1 0.2000 +- 0.1000 "
        "| flat:0.1 0.4000 +- 0.2000",
        "mlp (1 seed) | train acc 0.950 | test acc 0.850 | epoch 65 | patch:0.1 0.0200 +- 0.0050 | flat:0.1 0.0400 +- "
        "0.0000"]


def test_run_identity_from_fields_and_from_older_names():
    """A run record's (model, seed) comes from its fields; records written before them are named '<model>/seed<k>'
    (the pretrained models '<model>/pretrained')."""
    assert report.identity("anything", {"model": "vit-reg", "seed": 2}) == ("vit-reg", 2)
    assert report.identity("mlp-sigmoid/seed12", {}) == ("mlp-sigmoid", 12)
    assert report.identity("convnext_tiny/pretrained", {}) == ("convnext_tiny", "pretrained")
    assert report.identity("x/seedling", {}) == ("x", "seedling")


def test_merged_language_runs_are_paired_against_the_first_model_asked_for(tmp_path):
    """Folders merged in any order: the paired differences take the first model of --model (with its first --attn)
    as the reference, here roberta-softmax, although the LSTM's folder comes first; those at initialisation pair the
    flips measured there, those at the end the final ones."""
    def folder(name, run, values, init):
        data = {"script": "language", "args": {"model": ["roberta", "lstm"], "attn": ["softmax", "relu"]},
                "runs": {run: {"history": [], "final": {"per_image": {"2": values}, "per_image_init": {"2": init}}}}}
        write_json(str(tmp_path / name / "metrics.json"), data)
        return str(tmp_path / name)

    merged = report.merge([folder("a", "lstm/seed0", [0.5, 0.25], [1.0, 0.5]),
                           folder("b", "roberta-softmax/seed0", [0.25, 0.0], [0.5, 0.0])])
    assert merged["paired"]["final"]["reference"] == merged["paired"]["init"]["reference"] == "roberta-softmax"
    assert merged["paired"]["final"]["models"]["lstm"]["diff"]["2"]["mean"] == pytest.approx(0.25)
    assert merged["paired"]["init"]["models"]["lstm"]["diff"]["2"]["mean"] == pytest.approx(0.5)


def robustness_run(model, seed, sens, acc, **more):
    """('<model>/seed<seed>', a robustness.py run record) with its sensitivity, mean corruption accuracy and `more`."""
    return f"{model}/seed{seed}", {"model": model, "seed": seed, "history": [], "final": {
        "sens": sens, "mean_corruption_acc": acc, "corruption_acc": {"snow": {"1": acc}}, **more}}


def test_robustness_summary_means_standard_errors_and_correlation(capsys):
    """Per model the mean over seeds with its standard error (std over seeds / sqrt(seeds); none for one seed), and
    Pearson's r of sensitivity against mean corruption accuracy over every model and seed (undefined, and said so,
    where either is the same everywhere)."""
    data = {"script": "robustness", "runs": dict([robustness_run("a", 0, 0.1, 0.9), robustness_run("a", 1, 0.3, 0.7),
                                                  robustness_run("b", 0, 0.5, 0.5)])}
    out = report.robustness_summary(data)
    assert out["a"]["seeds"] == 2 and out["a"]["sens"] == pytest.approx([0.2, 0.1])
    assert out["a"]["mean_corruption_acc"] == pytest.approx([0.8, 0.1]) and out["b"]["sens"] == [0.5, None]
    assert out["correlation_sens_vs_corruption_acc"] == {"pearson_r": pytest.approx(-1.0), "points": 3}
    printed = capsys.readouterr().out
    assert "a (2 seeds) | sens 0.2000 +- 0.1000" in printed and "b (1 seed) | sens 0.5000 |" in printed
    assert "sensitivity vs mean corruption accuracy over 3 models and seeds: Pearson r = -1.000" in printed
    assert "note:" not in printed  # no standard_measured: all 15, as before robustness.py recorded it
    flat = {"script": "robustness", "runs": dict(robustness_run("a", s, 0.25, a) for s, a in enumerate([.9, .7, .5]))}
    assert report.robustness_summary(flat)["correlation_sens_vs_corruption_acc"] == {"pearson_r": None, "points": 3}
    assert "Pearson r = undefined (one of them is constant)" in capsys.readouterr().out


def test_robustness_summary_says_when_a_mean_is_over_fewer_than_the_15_corruptions(capsys):
    """A run that left corruptions out (frost, without its textures) has a mean corruption accuracy over fewer than
    the 15 of the paper and RobustBench: the summary says over how many, and in how many runs."""
    data = {"script": "robustness", "runs": dict([robustness_run("a", 0, 0.1, 0.9, standard_measured=14),
                                                  robustness_run("a", 1, 0.3, 0.7, standard_measured=15),
                                                  robustness_run("b", 0, 0.5, 0.5, standard_measured=14)])}
    report.robustness_summary(data)
    assert "note: mean_corruption_acc is over 14 or 15 of the 15 standard corruptions (2 of 3 runs measured fewer)" \
        in capsys.readouterr().out
    data["runs"]["a/seed1"]["final"]["standard_measured"] = 14
    report.robustness_summary(data)
    assert "is over 14 of the 15 standard corruptions (3 of 3 runs measured fewer)" in capsys.readouterr().out


def test_the_robustness_claim_pairs_reg_with_vanilla_by_seed_and_skips_what_was_not_measured(capsys):
    """report.py's robustness claim (Table 2): each model's summary, then reg - vanilla paired by seed, mean +- s.e.
    over the seeds both have; a number missing from any of them (sharpness not measured) is left out, not a crash.
    A folder's summary prints the same per-model lines."""
    data = {"script": "robustness", "runs": dict([
        robustness_run("vit-vanilla", 0, 0.30, 0.60, shop=1.0, shpred=0.1),
        robustness_run("vit-vanilla", 1, 0.40, 0.50, shop=2.0, shpred=0.1),
        robustness_run("vit-vanilla", 2, 0.5, 0.5, shop=None, shpred=0.1),
        robustness_run("vit-reg", 0, 0.10, 0.70, shop=1.5, shpred=0.1),
        robustness_run("vit-reg", 1, 0.10, 0.65, shop=None, shpred=0.1)])}  # no seed 2 of reg; no shop for seed 1
    report.robustness_claim(data)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "vit-vanilla (3 seeds) | sens 0.4000 +- 0.0577 | mean_corruption_acc 0.5333 +- 0.0333 | shop " \
                     "1.5000 +- 0.5000 | shpred 0.1000 +- 0.0000"
    assert out[-1] == ("vit-reg - vit-vanilla, paired by seed | sens -0.2500 +- 0.0500 (2 seeds) | "
                       "mean_corruption_acc +0.1250 +- 0.0250 (2 seeds) | shpred +0.0000 +- 0.0000 (2 seeds)")
    report.summary(data)
    assert capsys.readouterr().out.splitlines() == out[:-1]


def test_a_one_seed_difference_is_printed_with_its_error_over_the_inputs():
    """A paired difference of one seed has no standard error over seeds: the summary gives its standard error over
    the inputs and says so; with two seeds, the error over seeds."""
    from common import paired_differences

    one = paired_differences({("a", 0): {"k": [0, 1, 0, 1]}, ("b", 0): {"k": [0, 0, 0, 0]}}, "b")
    assert report.paired_text(one["models"]["a"]["diff"]["k"]) == "+0.5000 +- 0.2887 (1 seed, s.e. over inputs)"
    two = paired_differences({("a", 0): {"k": [1, 1]}, ("b", 0): {"k": [0, 0]}, ("a", 1): {"k": [0, 0]},
                              ("b", 1): {"k": [0, 0]}}, "b")
    assert report.paired_text(two["models"]["a"]["diff"]["k"]) == "+0.5000 +- 0.5000 (2 seeds)"


def test_a_paired_difference_shows_its_error_and_seeds_only_where_it_has_them():
    """pm(): the sign always; the standard error unless there is none (None, or NaN for one seed); '1 seed' and
    'n seeds'."""
    assert report.pm(0.0123, 0.0045, 3) == "+0.0123 +- 0.0045 (3 seeds)"
    assert report.pm(-0.0123, 0.0045, 1) == "-0.0123 +- 0.0045 (1 seed)"
    assert report.pm(0.0123, None) == report.pm(0.0123, float("nan")) == "+0.0123"
    assert report.mean_se([0.25]) == "0.2500" and report.mean_se([0.0, 0.5], ".2f") == "0.25 +- 0.25"


def test_claims_print_every_row_from_its_merged_folder_and_say_which_did_not_run(tmp_path, capsys):
    """report.py --claims OUT: one block per claims-table row, headed by its folder under OUT, its seeds and how many
    run folders were merged into it; a row whose folder is missing is one 'not run' line, and a folder that holds none
    of them says so at the end."""
    runs = {f"sparse-lower/seed{s}": {"model": "sparse-lower", "seed": s, "history": [],
                                      "final": synthetic_final(0.0, 0.0, 0.3)}
            for s in range(2)}
    write_json(str(tmp_path / "synthetic" / "fig12" / "metrics.json"),
               {"script": "synthetic", "runs": runs, "sources": ["a", "b"]})
    report.main(report.parse_args(["--claims", str(tmp_path)]))
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("[")]) == len(report.CLAIMS)
    assert out[0] == "[synthetic] synthetic/cases: not run"
    assert out[1:4] == ["[fig12] synthetic/fig12 (2 seeds, 2 folders)",
                        "sparse-lower (2 seeds) | ood_acc 0.000 +- 0.000 | test_acc 1.000 +- 0.000 | align_sparse "
                        "0.900 +- 0.000 | align_frequent 0.100 +- 0.000 | sens 0.000 +- 0.000 | sens_sparse_fn "
                        "0.000 +- 0.000 | sens_frequent_fn 0.300 +- 0.000",
                        "the model learns the lower-sensitivity feature in every seed in 1 of 1 settings"]
    assert out[4] == "[vision3k] vision/fmnist-3k: not run"
    assert out[-2:] == ["[robustness] robustness/fmnist-rob: not run", "[robustness] robustness/fig9: not run"]
    report.main(report.parse_args(["--claims", str(tmp_path / "synthetic")]))  # a folder below reproduce.sh's
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(report.CLAIMS) + 1 and all(line.endswith(": not run") for line in out[:-1])
    assert out[-1] == (f"no row's folder is under {tmp_path / 'synthetic'}: give the folder that bash reproduce.sh "
                       "wrote (its --out, out by default, which holds synthetic/, vision/, language/, ...)")


def test_start_run_makes_a_fresh_folder_and_says_where_it_writes(tmp_path, capsys, monkeypatch, kept_threads):
    """start_run: a new out/<script>/<name> folder (a -2 suffix when the name is taken), its Results, and one line
    naming the folder, the device and the threads. A torchrun rank other than 0 gets rank 0's folder and writes
    nothing in it."""
    import argparse

    import runs

    args = argparse.Namespace(resume=None, run_name=None, out_dir=str(tmp_path), seeds=[0])
    torch.set_num_threads(1)
    first, res = runs.start_run("vision", args, "default", "cpu")
    second, _ = runs.start_run("vision", args, "default", "cpu")
    rank0 = str(tmp_path / "rank0")  # the folder rank 0 broadcasts, not made yet
    monkeypatch.setattr(runs, "ranks", lambda: (1, 2))
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", lambda box, src: box.__setitem__(0, rank0))
    third, other = runs.start_run("vision", args, "default", "cpu")
    assert first == str(tmp_path / "vision" / "default") and second == first + "-2"
    assert os.path.isfile(os.path.join(first, "metrics.json")) and res.data["args"]["seeds"] == [0]
    assert capsys.readouterr().out.splitlines() == [f"writing {first} | device cpu | 1 thread",
                                                    f"writing {second} | device cpu | 1 thread",
                                                    f"writing {rank0} | device cpu | 1 thread | 2 processes"]
    assert third == rank0 and not other.write and not os.path.exists(rank0)


def test_report_merges_into_out_combined_by_default_and_names_a_missing_folder(tmp_path, capsys):
    """report.py's own flags: a merge goes to out/<script>/combined unless --out-dir and --run-name say otherwise, and
    may vary no flag beyond the free ones unless --vary names it; a folder that does not exist is a one-line error."""
    args = report.parse_args([str(tmp_path), str(tmp_path)])
    assert (args.out_dir, args.run_name, args.vary, args.times, args.claims) == ("out", "combined", [], False, None)
    for argv in [[str(tmp_path), str(tmp_path / "nope")], ["--claims", str(tmp_path / "nope")]]:
        with pytest.raises(SystemExit):
            report.parse_args(argv)
        assert f"{tmp_path / 'nope'}: no such run folder or metrics.json" in capsys.readouterr().err
