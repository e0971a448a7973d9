"""bench.py: one round at tiny sizes runs every benchmark, and every figure comes out finite and positive."""

import json
import math

import pytest

import bench


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
