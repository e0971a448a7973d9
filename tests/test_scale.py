"""Running at scale: --resume after Ctrl-C continues every training script to exactly the numbers of an uninterrupted
run, and a real two-process torchrun of vision.py and of language.py (gloo, CPU) gives the single-process numbers in
one run folder.
(The estimator's sharding over ranks is checked in test_common.py.)"""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from conftest import stop_at_backward
import grokking
import language
import parity
import report
import robustness
import synthetic
import vision
from runs import cli, strict_json

VIT = ["--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16", "--mlp-dim", "16"]
MRPC = ["the cat sat on the mat", "a cat sat on a mat", "stocks fell today", "it was sunny", "he said it works"]

# script: (module, flags of a tiny run, the backward() call during which Ctrl-C arrives)
RUNS = {
    "synthetic": (synthetic, ["--steps", "6", "--eval-every", "2", "--seeds", "0", "1", "--case", "sparse-lower",
                              "--n-train", "200", "--n-test", "50", "--n-sens", "20"], 9),
    "grokking": (grokking, ["--p", "11", "--epochs", "6", "--eval-every", "2", "--dim", "16", "--heads", "2",
                            "--mlp-dim", "16"], 4),
    "parity": (parity, ["--n", "8", "--k", "2", "--steps", "6", "--eval-every", "2", "--n-train", "200",
                        "--n-test", "50", "--n-sens", "20", "--dim", "16", "--seeds", "0", "1"], 8),
    "vision": (vision, ["--dataset", "fake28", "--model", "vit", "mlp", "--mlp-hidden", "16", "--epochs", "3",
                        "--eval-every", "1", "--n-train", "60", "--n-test", "20", "--n-sens", "4", "--batch-size",
                        "20", "--sigma", "1"] + VIT, 7),
    "robustness": (robustness, ["--dataset", "fake28", "--model", "vit", "--variants", "reg", "--epochs", "2",
                                "--eval-every", "1", "--n-train", "40", "--n-test", "20", "--n-sens", "4",
                                "--batch-size", "20", "--corruptions", "contrast", "--severities", "2", "--n-sharp",
                                "4", "--sharp-reps", "1", "--sigma", "1"] + VIT, 3),  # the cut after epoch 1's noise
    "language": (language, ["--model", "gpt2", "lstm", "--dim", "16", "--heads", "2", "--depth", "1", "--epochs", "2",
                            "--batch-size", "4", "--eval-every", "2", "--n-sens", "4", "--sigma", "2"], 6),
}


def write_glue(tmp_path):
    """A tiny MRPC in GLUE's layout; returns the --data-dir."""
    folder = tmp_path / "glue" / "MRPC"
    folder.mkdir(parents=True)
    for name, n in [("msr_paraphrase_train.txt", 24), ("msr_paraphrase_test.txt", 8)]:  # the paper's split
        rows = [f"{i % 2}\t{i}\t{i + 1}\t{MRPC[i % 5]} {MRPC[(i * 3) % 5]}\t{MRPC[(i + 2) % 5]}" for i in range(n)]
        (folder / name).write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "\n".join(rows) + "\n")
    return tmp_path / "glue"


def without_time(runs):
    """The runs' numbers as metrics.json holds them (NaN as null), minus the wall-clock times (which differ between
    any two runs)."""
    drop = lambda d: {k: v for k, v in d.items() if k != "time"}  # noqa: E731
    return strict_json({run: {"history": [drop(h) for h in r["history"]], "final": drop(r["final"])}
                        for run, r in runs.items()})


@pytest.mark.slow
@pytest.mark.parametrize("script", list(RUNS))
def test_resume_after_ctrl_c_equals_an_uninterrupted_run(script, tmp_path, monkeypatch, capsys):
    """Ctrl-C in the middle of training writes checkpoint.pt (the state at the last evaluation) and exits 130;
    --resume then redoes the steps since and gives exactly the same histories and final numbers as a run that was
    never interrupted (model, optimizer and every random generator are restored)."""
    whole, resumed, cut = whole_and_resumed(script, tmp_path, monkeypatch, capsys)
    assert without_time(resumed["runs"]) == without_time(whole["runs"])
    assert "interrupted" not in json.loads((cut / "metrics.json").read_text())


def whole_and_resumed(script, tmp_path, monkeypatch, capsys, device=()):
    """The script's tiny run uninterrupted (run "whole"), and stopped by Ctrl-C during a training step and resumed (run
    "cut", its folder returned); device: the --device flags of both."""
    module, argv, cut_at = RUNS[script]
    argv = argv + ["--out-dir", str(tmp_path), *device]
    if script == "language":
        argv += ["--data-dir", str(write_glue(tmp_path))]
    whole = module.main(module.parse_args(argv + ["--run-name", "whole"]))

    stop_at_backward(monkeypatch, cut_at)
    with pytest.raises(SystemExit) as e:
        cli(module.main, module.parse_args, argv + ["--run-name", "cut"])
    assert e.value.code == 130 and "--resume" in capsys.readouterr().err
    cut = tmp_path / script / "cut"
    assert (cut / "checkpoint.pt").exists() and json.loads((cut / "metrics.json").read_text())["interrupted"]
    monkeypatch.undo()
    return whole, module.main(module.parse_args(["--resume", str(cut), *device])), cut


@pytest.mark.slow
@pytest.mark.parametrize("script", list(RUNS))
def test_no_figures_writes_metrics_alone_and_report_draws_them_from_it(script, tmp_path):
    """--no-figures: the run folder holds no figure, a resumed run keeps the flag, and `python report.py FOLDER`
    draws every figure afterwards from metrics.json."""
    module, argv, _ = RUNS[script]
    argv = argv + ["--out-dir", str(tmp_path), "--run-name", "r", "--no-figures"]
    if script == "language":
        argv += ["--data-dir", str(write_glue(tmp_path))]
    module.main(module.parse_args(argv))
    folder = tmp_path / script / "r"
    assert not list(folder.glob("*.png"))
    assert module.parse_args(["--resume", str(folder)]).no_figures
    report.main(report.parse_args([str(folder)]))
    paths = list(folder.glob("*.png"))
    assert paths and all(p.stat().st_size > 5000 for p in paths), paths


class Killed(BaseException):
    """kill -9: neither Ctrl-C nor an error, so nothing more is written (recording() handles neither)."""


@pytest.mark.slow
@pytest.mark.parametrize("script", list(RUNS))
def test_killed_right_after_the_first_checkpoint_resumes(script, tmp_path, monkeypatch, capsys):
    """kill -9 right after the first checkpoint.pt is written (step 0, before anything was logged): the folder's
    metrics.json already lists the checkpoint's run, so --resume continues it to an uninterrupted run's numbers
    instead of refusing it as another run's checkpoint."""
    from runs import Results

    module, argv, _ = RUNS[script]
    argv = argv + ["--out-dir", str(tmp_path), "--save-every", "1"]
    if script == "language":
        argv += ["--data-dir", str(write_glue(tmp_path))]
    whole = module.main(module.parse_args(argv + ["--run-name", "whole"]))
    real = Results.write_checkpoint

    def write_then_die(self):
        real(self)
        raise Killed

    monkeypatch.setattr(Results, "write_checkpoint", write_then_die)
    with pytest.raises(Killed):
        module.main(module.parse_args(argv + ["--run-name", "cut"]))
    monkeypatch.undo()
    cut = tmp_path / script / "cut"
    assert (cut / "checkpoint.pt").exists()
    resumed = module.main(module.parse_args(["--resume", str(cut)]))
    assert without_time(resumed["runs"]) == without_time(whole["runs"])


@pytest.mark.slow
def test_resumed_without_its_checkpoint_keeps_finished_models_and_restarts_the_rest(tmp_path, monkeypatch, capsys):
    """A run folder carried back from a lent GPU comes without checkpoint.pt (too large to return): --resume keeps
    the models that finished, trains the unfinished one again from its start, and ends with an uninterrupted run's
    numbers."""
    _, argv, _ = RUNS["vision"]  # the ViT, then the MLP: 9 training steps each
    argv = argv + ["--out-dir", str(tmp_path)]
    whole = vision.main(vision.parse_args(argv + ["--run-name", "whole"]))
    stop_at_backward(monkeypatch, 12)  # the MLP's third step
    with pytest.raises(SystemExit) as e:
        cli(vision.main, vision.parse_args, argv + ["--run-name", "cut"])
    assert e.value.code == 130
    monkeypatch.undo()
    cut = tmp_path / "vision" / "cut"
    (cut / "checkpoint.pt").unlink()
    stopped = json.loads((cut / "metrics.json").read_text())["runs"]
    assert stopped["vit/seed0"]["final"] and stopped["mlp/seed0"]["history"] and not stopped["mlp/seed0"]["final"]
    steps = []
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a, real=torch.optim.SGD.step, **k:
                        steps.append(1) or real(self, *a, **k))
    resumed = vision.main(vision.parse_args(["--resume", str(cut)]))
    assert "no checkpoint: unfinished runs restart" in capsys.readouterr().out
    assert len(steps) == 9  # the MLP's steps alone, all of them
    assert without_time(resumed["runs"]) == without_time(whole["runs"])


def one_and_two_processes(argv, tmp_path, run, returncodes=(0, 0)):
    """The record of `run` after `python *argv` and after torchrun --nproc_per_node=2 of the same (rank 0 alone
    writes one run folder), ending with `returncodes` (torchrun's 1 where a rank failed)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name, launch, returncode in [("one", [sys.executable], returncodes[0]),
                                     ("two", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                              "--nproc_per_node=2"], returncodes[1])]:
        done = subprocess.run(launch + argv + ["--out-dir", str(tmp_path / name), "--run-name", "r"], cwd=root,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == returncode, done.stderr[-2000:]
    script = argv[0].removesuffix(".py")
    assert os.listdir(tmp_path / "two" / script) == ["r"]  # one folder, written by rank 0 alone
    return [json.loads((tmp_path / n / script / "r" / "metrics.json").read_text())["runs"][run] for n in ["one", "two"]]


@pytest.mark.slow
def test_torchrun_two_processes_match_one(tmp_path):
    """torchrun --nproc_per_node=2 (gloo on this CPU): the global batch is split across the ranks, so training,
    evaluation and the sharded sensitivity give the single process's numbers (loss within 1e-3), and rank 0 alone
    writes one run folder. A batch of 15 splits 8 / 7, so each rank's loss must be weighted by its share for DDP's
    average to be the batch mean."""
    argv = ["vision.py", "--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "32", "--epochs", "2",
            "--eval-every", "1", "--n-train", "90", "--n-test", "30", "--n-sens", "20", "--batch-size", "15",
            "--sigma", "2", "--lr", "0.05", "--device", "cpu"]
    one, two = one_and_two_processes(argv, tmp_path, "mlp/seed0")
    for a, b in zip(one["history"], two["history"]):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-3 and abs(a["test_loss"] - b["test_loss"]) < 1e-3
        assert abs(a["train_acc"] - b["train_acc"]) <= 1 / 90 and abs(a["test_acc"] - b["test_acc"]) <= 1 / 30
        assert abs(a["sens"] - b["sens"]) <= max(a["sens_stderr"], 1e-9)
    assert len(one["history"]) == len(two["history"]) == 3
    # at initialisation the two models are the same weights: the sharded estimator gives exactly one process's counts
    assert one["history"][0]["sens"] == two["history"][0]["sens"] > 0
    assert one["history"][0]["sens_stderr"] == two["history"][0]["sens_stderr"]


@pytest.mark.slow
def test_a_run_diverges_under_torchrun_as_in_one_process(tmp_path):
    """The divergence check under torchrun reads the batch mean of the loss (the ranks' weighted losses summed and
    divided by the number of ranks): a run at --lr 20 diverges at the same epoch, with the same loss, on one process
    and on two (within 10%: the two sums round apart over an epoch of growing weights)."""
    argv = ["vision.py", "--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "32", "--epochs", "2", "--n-train",
            "90", "--n-test", "30", "--n-sens", "20", "--batch-size", "15", "--lr", "20", "--device", "cpu"]
    one, two = one_and_two_processes(argv, tmp_path, "mlp/seed0", returncodes=(3, 1))  # diverged
    assert one["diverged"]["step"] == two["diverged"]["step"] == 1
    assert one["diverged"]["loss"] > 1e3 and abs(two["diverged"]["loss"] / one["diverged"]["loss"] - 1) < 0.1


@pytest.mark.slow
def test_language_under_torchrun_matches_one_process(tmp_path):
    """language.py under torchrun: a batch of 5 splits 3 / 2 across the two ranks, each rank's loss weighted by its
    share, so training gives the single process's losses (dropout off: its masks are drawn per rank). AdamW ignores a
    factor common to both ranks, not a misweighted rank: at --lr 1e-2 that shows within a few steps."""
    argv = ["language.py", "--data-dir", str(write_glue(tmp_path)), "--model", "lstm", "--dim", "16", "--epochs", "2",
            "--batch-size", "5", "--eval-every", "2", "--n-sens", "4", "--sigma", "2", "--dropout", "0", "--lr", "1e-2",
            "--device", "cpu"]
    one, two = one_and_two_processes(argv, tmp_path, "lstm/seed0")
    assert len(one["history"]) == len(two["history"]) > 2
    for a, b in zip(one["history"], two["history"]):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-4 and a["train_acc"] == b["train_acc"]


@pytest.mark.slow
@pytest.mark.parametrize("script", list(RUNS))
def test_sigterm_is_handled_as_ctrl_c(script, tmp_path, monkeypatch, capsys):
    """SIGTERM (kill, timeout, a cluster's preemption) in the middle of training: one line on stderr, exit 143,
    metrics.json marked interrupted with what was measured, checkpoint.pt written, so --resume can continue."""
    module, argv, cut_at = RUNS[script]
    argv = argv + ["--out-dir", str(tmp_path), "--run-name", "t"]
    if script == "language":
        argv += ["--data-dir", str(write_glue(tmp_path))]
    stop_at_backward(monkeypatch, cut_at, how="sigterm")
    with pytest.raises(SystemExit) as e:
        cli(module.main, module.parse_args, argv)
    err = capsys.readouterr().err
    assert e.value.code == 143 and len(err.strip().splitlines()) == 1 and "terminated (SIGTERM)" in err, err
    folder = tmp_path / script / "t"
    data = json.loads((folder / "metrics.json").read_text())
    assert data["interrupted"] is True and any(r["history"] for r in data["runs"].values())
    assert (folder / "checkpoint.pt").exists()
    assert signal.getsignal(signal.SIGTERM) is not None  # cli() put the previous handler back


@pytest.mark.slow
def test_robustness_resumed_after_an_interrupted_evaluation_is_evaluated(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the trained model's corruptions are being evaluated, then --resume: the run is evaluated (its
    final numbers hold corruption accuracy, ShOp and ShPred) and its training is not done again; resumed once more,
    the finished run is left as it is."""
    module, argv, _ = RUNS["robustness"]
    argv = argv + ["--out-dir", str(tmp_path), "--run-name", "e"]
    real = robustness.evaluate_corruptions

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(robustness, "evaluate_corruptions", interrupted)
    with pytest.raises(SystemExit) as e:
        cli(module.main, module.parse_args, argv)
    assert e.value.code == 130
    monkeypatch.setattr(robustness, "evaluate_corruptions", real)
    steps = []
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a, **k: steps.append(1))
    data = module.main(module.parse_args(["--resume", str(tmp_path / "robustness" / "e")]))
    final = data["runs"]["vit-reg/seed0"]["final"]
    assert {"corruption_acc", "mean_corruption_acc", "shop", "shpred", "clean_acc"} <= set(final) and not steps
    evaluated = []  # resumed once more, finished: nothing is trained or evaluated again
    monkeypatch.setattr(robustness, "evaluate_corruptions", lambda *a, **k: evaluated.append(1) or real(*a, **k))
    again = module.main(module.parse_args(["--resume", str(tmp_path / "robustness" / "e")]))
    kept = again["runs"]["vit-reg/seed0"]["final"]  # read back from metrics.json (NaN written as null)
    assert not steps and not evaluated and (kept["corruption_acc"], kept["shop"]) == (final["corruption_acc"],
                                                                                     final["shop"])
