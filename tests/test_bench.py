"""bench.py: one round at tiny sizes runs every benchmark, and every figure comes out finite and positive; the
baselines its speed-ups divide by do the work they claim, and each figure is the ratio of the rounds it timed."""

import json
import math
import os
import time

import pytest
import torch

import bench
from common import gaussian, sensitivity
from test_common import phi


@pytest.mark.slow
def test_one_tiny_round_gives_every_figure(tmp_path):
    """Every figure the README's benchmark table lists is there, finite and > 0 (the memory growth >= 0: the chunk
    may already sit in the process's heap), and the results file is written."""
    out = tmp_path / "b.json"
    results = bench.main(bench.parse_args(["--rounds", "1", "--n-inputs", "4", "--device", "cpu", "--out", str(out)]))
    names = ["est_eff_vit", "est_eff_mlp", "est_speedup_vit", "est_speedup_mlp", "train_speedup_mlp",
             "train_speedup_vit", "est_eff_roberta", "est_prefix_speedup_lstm", "est_prefix_speedup_gpt2",
             "est_prefix_speedup_lstm_sampled", "est_prefix_speedup_gpt2_sampled",
             "est_bucket_speedup_roberta", "eval_sorted_speedup_roberta", "scattered_rows_speedup_cnn",
             "scattered_rows_speedup_vit", "read_token_speedup_vit", "read_token_speedup_roberta",
             "read_token_speedup_gpt2", "read_token_train_speedup_parity_64", "read_token_train_speedup_parity_128",
             "read_token_train_speedup_vit",
             "sens_needed_speedup_vit", "sens_needed_measured", "paper_vit_step_ms",
             "lstm_fused_speedup", "corruption_images_per_s", "shared_cpu_slowdown",
             "shared_cpu_slowdown_default",
             "quickstart_s", "reference_s", "quickstart_ratio"]
    for name in names:
        assert math.isfinite(results[name]) and results[name] > 0, name
    assert math.isfinite(results["est_1e6_mem_mb"]) and results["est_1e6_mem_mb"] >= 0
    assert json.loads(out.read_text())["results"] == pytest.approx(results)


def test_only_runs_the_named_groups(tmp_path, capsys):
    """--only estimator measures the estimator's figures and nothing else, and prints each as it is measured."""
    out = tmp_path / "b.json"
    results = bench.main(bench.parse_args(["--rounds", "1", "--n-inputs", "4", "--device", "cpu", "--only",
                                           "estimator", "--out", str(out)]))
    assert sorted(results) == [f"est_{f}_{m}" for f in ["eff", "evals_per_s", "speedup"] for m in ["mlp", "vit"]]
    assert "est_speedup_vit " in capsys.readouterr().out


def test_two_runs_at_once_never_share_a_results_file(tmp_path, monkeypatch):
    """The results file is reserved (created with O_EXCL) before anything runs: a second run at the same moment
    takes the next free name, and a named --out that another run holds is refused before any benchmark."""
    monkeypatch.chdir(tmp_path)
    first, second = bench.reserve(None), bench.reserve(None)
    assert (first, second) == ("out/bench/bench.json", "out/bench/bench-2.json")
    with pytest.raises(ValueError, match="never replaces"):
        bench.reserve(first)


class LastTokenThreshold(torch.nn.Module):
    """Class 0 while the last token's first coordinate is >= 0: a threshold unit whose flip probability is known.
    Counts the rows it is given and whether it was in training mode."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.rows, self.modes = [], []

    def forward(self, x):
        self.rows.append(len(x))
        self.modes.append(self.training)
        h = self.w * x.reshape(len(x), -1, x.shape[-1])[:, -1, 0]
        return torch.stack([h, -h], 1)


def test_the_naive_loop_measures_the_sensitivity_the_estimator_does():
    """The authors' per-draw loop, the baseline of est_speedup, estimates the same quantity as common.sensitivity:
    N(0, 0.1^2) noise on a last token at 0.1 flips the unit with probability Phi(-1), so S = Phi(-1) / T."""
    x = torch.zeros(1000, 4, 3)
    x[:, -1, 0] = 0.1
    expected = phi(-1) / 4
    model = LastTokenThreshold().eval()
    torch.manual_seed(0)
    naive = bench.naive_sensitivity(model, x, 0.1, 2)
    assert max(model.rows) == 100 and sum(model.rows) == 1000 * (1 + 4 * 2)  # the authors' batches of 100
    ours = sensitivity(lambda xb, idx: model(xb), x, gaussian(0.1), reps=2, seed=0).mean
    se = math.sqrt(4 * expected * (1 - 4 * expected) / 2000) / 4  # 2,000 draws at the last token
    assert abs(naive - expected) < 4 * se and abs(ours - expected) < 4 * se


def test_timed_rounds_warms_up_then_times_each_method_in_turn():
    """One warm-up call of each method, then `rounds` rounds in which the methods take turns, each timed alone."""
    calls = []
    times = bench.timed_rounds([lambda: calls.append("a"), lambda: (calls.append("b"), time.sleep(0.02))],
                               torch.device("cpu"), 3)
    assert calls == ["a", "b"] * 4
    assert len(times) == 3 and all(r[0] < 0.5 and 0.02 <= r[1] < 5 for r in times)  # loose: a busy machine


def test_the_estimator_figures_are_the_ratios_of_its_rounds(monkeypatch):
    """est_eff = forward time / estimator time and est_speedup = naive time / estimator time, each the median over
    rounds; the forward baseline runs the model in eval mode over as many rows as the estimator evaluates, in its
    chunks, and the estimator and the naive loop both measure sigma 0.1 (the unit above: S = Phi(-1) / T)."""
    model, x, seen = LastTokenThreshold(), torch.zeros(200, 4, 3), {}
    x[:, -1, 0] = 0.1

    def rounds(fns, device, n):
        seen["rounds"] = n
        model.rows.clear()
        fns[1]()
        seen["forward rows"], seen["modes"] = sum(model.rows), set(model.modes)
        model.rows.clear()
        s = fns[0]()
        seen["evaluations"], seen["chunk"], seen["sens"] = s.evaluations, max(model.rows), [s.mean, fns[2]()]
        return [[2.0, 4.0, 20.0], [2.0, 8.0, 60.0], [4.0, 4.0, 40.0]]

    monkeypatch.setattr(bench, "timed_rounds", rounds)
    torch.manual_seed(0)
    out = bench.bench_estimator("m", model, x, 7, 3, torch.device("cpu"))  # 800 evaluations: 114 chunks of 7, and 2
    assert out == {"est_eff_m": 2.0, "est_speedup_m": 10.0, "est_evals_per_s_m": 400.0}
    expected = phi(-1) / 4
    se = math.sqrt(4 * expected * (1 - 4 * expected) / 200) / 4  # 200 draws at the last token
    assert all(abs(v - expected) < 4 * se for v in seen.pop("sens"))  # sigma 0.2 would give Phi(-0.5) / 4: 7 s.e.
    assert seen == {"rounds": 3, "forward rows": 800, "modes": {False}, "evaluations": 800, "chunk": 7}


def test_the_training_figures_compare_one_epoch_of_each_pipeline(monkeypatch):
    """train_speedup = the usual pipeline's time / ours, the median over rounds; both train the same model on every
    image once, in training mode, with optimiser steps."""
    model, seen = LastTokenThreshold(), {}
    x, y = torch.randint(0, 256, (250, 1, 4, 4), dtype=torch.uint8), torch.randint(0, 2, (250,))

    def rounds(fns, device, n):
        for name, fn in zip(["ours", "usual"], fns):
            model.rows.clear()
            model.modes.clear()
            model.eval()
            before = model.w.item()
            fn()
            seen[name] = (sum(model.rows), max(model.rows), set(model.modes), model.w.item() != before)
        return [[2.0, 6.0], [4.0, 8.0], [2.0, 10.0]]

    monkeypatch.setattr(bench, "timed_rounds", rounds)
    out = bench.bench_training("m", model, x, y, 3, torch.device("cpu"))
    assert out == {"train_speedup_m": 3.0, "train_images_per_s_m": 125.0}
    assert seen == {"ours": (250, 100, {True}, True), "usual": (250, 100, {True}, True)}  # batches of 100 in both


def test_a_run_stopped_before_its_results_gives_its_file_name_back(tmp_path, monkeypatch):
    """main reserves the results file; a run that ends without writing it (Ctrl-C) removes the empty file, and one
    that wrote it keeps it."""
    out = tmp_path / "b.json"

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_all", stopped)
    with pytest.raises(KeyboardInterrupt):
        bench.main(bench.parse_args(["--out", str(out)]))
    assert not out.exists()
    monkeypatch.setattr(bench, "run_all", lambda args: (open(args.out, "w").write("{}"), {})[1])
    assert bench.main(bench.parse_args(["--out", str(out)])) == {} and out.read_text() == "{}"


def test_the_reserved_results_file_is_readable_by_all_and_writable_by_its_owner(tmp_path):
    """reserve creates the results file as rw-r--r-- (under the usual umask 022), as write_json leaves it."""
    old = os.umask(0o022)
    try:
        path = bench.reserve(str(tmp_path / "b.json"))
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644
