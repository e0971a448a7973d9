"""bench.py: one round at tiny sizes runs every benchmark, and every figure comes out finite and positive; the
baselines its speed-ups divide by do the work they claim, and each figure is the ratio of the rounds it timed."""

import copy
import json
import math
import os
import subprocess
import sys
import time
import types

import pytest
import torch
import torch.nn.functional as F

import bench
from common import gaussian, sensitivity
from conftest import printing
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
    N(0, 0.1^2) noise on a last token at 0.1 flips the unit with probability Phi(-1), so S = Phi(-1) / T; at 10 none
    flips, so S = 0 exactly."""
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
    x[:, -1, 0] = 10.0  # 100 standard deviations from the threshold: no draw flips it, so both give exactly 0
    assert bench.naive_sensitivity(model, x, 0.1, 2) == 0.0
    assert sensitivity(lambda xb, idx: model(xb), x, gaussian(0.1), reps=2, seed=0).mean == 0.0


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
    image once in batches of 100, in training mode, with optimiser steps on gradients of their own batch (none left
    from the step before)."""
    model, seen, fresh = LastTokenThreshold(), {}, []
    model.w.register_hook(lambda grad: fresh.append(model.w.grad is None))  # before the gradient is accumulated
    x, y = torch.randint(0, 256, (250, 1, 4, 4), dtype=torch.uint8), torch.randint(0, 2, (250,))

    def rounds(fns, device, n):
        for name, fn in zip(["ours", "usual"], fns):
            model.rows.clear()
            model.modes.clear()
            fresh.clear()
            model.eval()
            before = model.w.item()
            fn()
            seen[name] = (sum(model.rows), max(model.rows), set(model.modes), model.w.item() != before, set(fresh))
        return [[2.0, 6.0], [4.0, 8.0], [2.0, 10.0]]

    monkeypatch.setattr(bench, "timed_rounds", rounds)
    out = bench.bench_training("m", model, x, y, 3, torch.device("cpu"))
    assert out == {"train_speedup_m": 3.0, "train_images_per_s_m": 125.0}
    assert seen == {"ours": (250, 100, {True}, True, {True}), "usual": (250, 100, {True}, True, {True})}


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


CPU = torch.device("cpu")
ROOT = os.path.dirname(os.path.abspath(bench.__file__))  # the repository, where bench.py runs its processes
TIMES = [[1.0, 2.0], [1.0, 4.0], [2.0, 2.0]]  # three rounds of two methods: the second / the first has median 2


def standing_in(monkeypatch, times=TIMES, log=None):
    """timed_rounds replaced: each method is called once and what it returns kept (one list per timed_rounds call),
    and `times` are the rounds' times. With `log`, a new list is appended to it before each method, for what the
    method's calls note there."""
    calls = []

    def rounds(fns, device, n):
        assert n == 3
        calls.append([])
        for fn in fns:
            if log is not None:
                log.append([])
            calls[-1].append(fn())
        return times

    monkeypatch.setattr(bench, "timed_rounds", rounds)
    return calls


def small_vit_args():
    return bench.vision.parse_args(["--dataset", "fashionmnist", "--depth", "1", "--heads", "2", "--dim-head", "8",
                                    "--dim", "16", "--mlp-dim", "32"])


def test_mrpc_like_pairs_have_mrpcs_lengths_and_are_padded_on_the_right():
    """Lengths of mean 51 and std 12 within 20-101 tokens, words from 4 to 999, padding after each pair's last word;
    the seed picks them."""
    import language

    tokens = bench.mrpc_like(4000, CPU, seed=5)
    real = tokens != language.PAD
    lengths = real.sum(1).float()
    assert abs(lengths.mean() - 51) < 0.5 and abs(lengths.std() - 12) < 0.5
    assert lengths.min() == 20 and lengths.max() <= 101 and tokens.shape[1] == lengths.max()
    assert torch.equal(real, torch.arange(tokens.shape[1]) < lengths[:, None])  # right-padded
    assert tokens[real].min() == 4 and tokens[real].max() == 999
    assert bench.mrpc_like(20000, CPU, seed=3).shape[1] == 101  # one pair drawn at 102, cut to 101
    assert torch.equal(bench.mrpc_like(3, CPU, seed=5), bench.mrpc_like(3, CPU, seed=5))
    assert not torch.equal(bench.mrpc_like(3, CPU, seed=5), bench.mrpc_like(3, CPU, seed=6))


def building(monkeypatch, draw=False):
    """The models vision.build_model builds from now on, as (model, name, args, shape), in a list that fills. With
    draw, every weight is drawn from N(0, 1): random models whose predictions noise flips (at PyTorch's
    initialisation a small ViT gives no flip at all)."""
    built, real = [], bench.vision.build_model

    def build(name, args, *shape):
        model = real(name, args, *shape)
        if draw:
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0, 1)
        built.append((model, name, args, shape))
        return model

    monkeypatch.setattr(bench.vision, "build_model", build)
    return built


def test_the_scattered_figure_times_the_same_draws_in_two_batch_sizes(monkeypatch):
    """scattered_rows_speedup: the authors' mask through the model in its default rows / in 2,048 rows, the same
    masks and noise (the same per-image flips), for the CNN and the ViT."""
    calls, seen, real = standing_in(monkeypatch), [], bench.vision.scattered_sensitivity
    monkeypatch.setattr(bench.vision, "scattered_sensitivity",
                        lambda m, x, *a, **kw: seen.append((type(m).__name__, m.training, len(x), a, kw))
                        or real(m, x, *a, **kw))
    built = building(monkeypatch, draw=True)
    torch.manual_seed(0)
    out = bench.bench_scattered(small_vit_args(), torch.randn(6, 1, 28, 28), 3, CPU)
    assert out == {"scattered_rows_speedup_cnn": 2.0, "scattered_rows_speedup_vit": 2.0}
    assert [(name, shape) for _, name, _, shape in built] == [("cnn", (1, 28, 10)), ("vit", (1, 28, 10))]
    for default, wide in calls:
        assert torch.equal(default.per_input, wide.per_input) and default.evaluations == wide.evaluations == 6 * 49
        assert default.mean > 0
    assert [s[0] for s in seen] == ["CNN"] * 2 + ["ViT"] * 2 and not any(s[1] for s in seen)
    assert [s[2:] for s in seen] == [(6, (4, 1.0, 49, 0), {}), (6, (4, 1.0, 49, 0), {"rows": 2048})] * 2


def test_the_language_figures_are_their_rounds_ratios_over_the_same_answers(monkeypatch):
    """est_eff_roberta = forward time / the estimator's (over as many rows as it evaluates), the prefix cache's, the
    buckets', the sorted evaluation's and the fused LSTM's speed-ups = the other's time / theirs, each the median
    over rounds; the prefix cache and the buckets give the same sensitivities as without them, the sorted
    evaluation the loss of the pairs in their own order, both in batches of 32; each LSTM step computes a loss."""
    import language

    batches, seen, real = [], [], language.measure_sensitivity  # batches: what each method called a model with
    calls = standing_in(monkeypatch, log=batches)

    def build(*a):
        built.append(make(*a))
        built[-1].register_forward_pre_hook(lambda m, x: batches[-1].append(len(x[0])) if batches else None)
        return built[-1]

    monkeypatch.setattr(language, "measure_sensitivity", lambda m, x, **kw: seen.append(
        (type(m).__name__, m.training, len(x), kw)) or real(m, x, **kw))
    built, make = [], language.build_model
    monkeypatch.setattr(language, "build_model", build)
    out = bench.bench_language(2, 3, CPU, n_pairs=40)
    assert out == {"est_eff_roberta": 2.0, "est_prefix_speedup_lstm": 2.0, "est_prefix_speedup_lstm_sampled": 2.0,
                   "est_prefix_speedup_gpt2": 2.0, "est_prefix_speedup_gpt2_sampled": 2.0,
                   "est_bucket_speedup_roberta": 2.0, "eval_sorted_speedup_roberta": 2.0, "lstm_fused_speedup": 2.0}
    (sens, _), forwards = calls[0]  # measure_sensitivity gives (Sensitivity, counts per position)
    assert forwards == sens.evaluations == int((bench.mrpc_like(2, CPU) != language.PAD).sum())
    for (fast, _), (slow, _) in calls[1:6]:  # the prefix caches (4) and the buckets
        assert torch.equal(fast.per_input, slow.per_input) and fast.evaluations == slow.evaluations
    (loss, _, _), unsorted = calls[6]  # language.evaluate's sorted batches, then the pairs in their own order
    assert float(unsorted) == pytest.approx(loss, rel=1e-5)
    assert sorted(batches[12]) == [8, 32] and batches[13] == [32, 8]  # 40 pairs in batches of 32
    for loss in calls[7]:  # a training step's loss with torch.nn.LSTM, then the hand-written cell (dropout on)
        assert loss.shape == () and abs(float(loss) - math.log(2)) < 0.2  # two classes, barely trained
    roberta, _, gpt2, lstm = built  # RoBERTa, the two causal models, and the LSTM those steps trained
    assert [type(m).__name__ for m in built] == ["TextTransformer", "LSTMClassifier", "TextTransformer",
                                                "LSTMClassifier"]
    assert (roberta.causal, roberta.blocks[0].attn, gpt2.causal, gpt2.blocks[0].attn) == (False, "softmax", True,
                                                                                          "softmax")
    assert lstm.training and all(p.grad is not None for p in lstm.parameters() if p.requires_grad)
    common = dict(reps=1, align="right", seed=0)
    assert [(name, training, n, kw) for name, training, n, kw in seen] == [
        ("TextTransformer", False, 2, dict(sigma=1.0, positions=None, **common))] + [
        (name, False, n, dict(sigma=2.0, positions=k, **common, prefix_cache=cache))
        for name in ["LSTMClassifier", "TextTransformer"] for n, k in [(2, None), (12, 8)]
        for cache in [True, False]] + [
        ("TextTransformer", False, 12, dict(sigma=2.0, positions=8, **common, buckets=b)) for b in [True, False]]


def test_the_read_token_figures_compare_the_same_predictions(monkeypatch):
    """read_token_speedup: every token / the read token alone, for the ViT's sensitivity (patch mask, sigma 1) and the
    language models' logits (RoBERTa's forward, GPT-2's resumed from its prefix cache at a random position of each
    pair); the same answers either way. Every token is the ViT's vit_every_token and the language models' training
    flag alone (the ViT's stays off), and each model evaluates again afterwards."""
    import language

    log, forward_from = [], language.TextTransformer.forward_from  # log: what each method's forward passes saw
    calls, built = standing_in(monkeypatch, log=log), building(monkeypatch, draw=True)
    every_token = bench.vit_every_token
    monkeypatch.setattr(bench, "vit_every_token", lambda vit, img: log[-1].append("every") or every_token(vit, img))
    monkeypatch.setattr(language.TextTransformer, "forward_from", lambda self, e, mask, start, *a: log[-1].append(
        ("gpt2", self.training, start, mask.sum(1))) or forward_from(self, e, mask, start, *a))
    models, make = [], language.build_model

    def build(*a):  # each language model, noting its training flag at each call
        models.append(make(*a))
        models[-1].register_forward_pre_hook(lambda m, x: log[-1].append(("called", m.training)) if log else None)
        return models[-1]

    monkeypatch.setattr(language, "build_model", build)
    sigmas = []
    monkeypatch.setattr(bench, "gaussian", lambda sigma: sigmas.append(sigma) or gaussian(sigma))
    torch.manual_seed(0)
    out = bench.bench_read_token(small_vit_args(), torch.randn(3, 1, 28, 28), 3, CPU, n_pairs=70)
    assert out == {"read_token_speedup_vit": 2.0, "read_token_speedup_roberta": 2.0, "read_token_speedup_gpt2": 2.0}
    (vit, name, _, shape), = built
    assert (name, shape) == ("vit", (1, 28, 10)) and not vit.training
    (alone, every), *language_models = calls
    assert torch.equal(alone.per_input, every.per_input) and alone.evaluations == 3 * 49 and alone.mean > 0
    for alone, every in language_models:
        assert [len(x) for x in alone] == [len(x) for x in every] == [64, 6] and alone[0].shape[1] == 2
        assert torch.allclose(torch.cat(alone), torch.cat(every), atol=1e-5)
    assert "every" not in log[0] and "every" in log[1] and sigmas == [1.0, 1.0]
    assert log[2] == [("called", False)] * 2 and log[3] == [("called", True)] * 2  # RoBERTa's two batches
    roberta, gpt2 = models
    assert (roberta.causal, roberta.blocks[0].attn, gpt2.causal, gpt2.blocks[0].attn) == (False, "softmax", True,
                                                                                          "softmax")
    assert not roberta.training and not gpt2.training
    assert [flag for _, flag, *_ in log[4] + log[5]] == [False, False, True, True]  # GPT-2's two batches, each way
    start, length = (torch.cat(v) for v in zip(*[entry[2:] for entry in log[4]]))
    assert (start >= 0).all() and (start < length).all() and 0.3 < (start / length).mean() < 0.7  # uniform


def test_vit_every_token_is_the_vits_forward_on_every_token():
    """The ViT's forward with its last block over every token gives the ViT's own logits."""
    vit = bench.vision.build_model("vit", small_vit_args(), 1, 28, 10).eval()
    img = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(bench.vit_every_token(vit, img), vit(img), atol=1e-5)


def test_the_read_token_training_figures_train_both_ways(monkeypatch):
    """read_token_train_speedup_<parity_64|parity_128|vit>: 5 AdamW steps (lr 1e-3) on every token / on the read token
    alone, each way giving every weight a gradient and changing it, with the same losses from the same start (the
    ViT's dropout draws included): parity.py's transformer (20 bits, 4 heads, 2 blocks) at widths 64 and 128 on n
    sequences, then the ViT on 100 28x28 images."""
    import parity

    params, opts, moved, batches, real = [], [], [], [], torch.optim.AdamW

    def adamw(p, lr):
        params.append((list(p), lr))
        opts.append(real(params[-1][0], lr=lr))
        step = opts[-1].step
        opts[-1].step = lambda: batches[-1].append("step") or step()
        return opts[-1]

    def rounds(fns, device, n):  # each way from the same weights, optimiser state and random draws
        weights, state, rng = [p.detach().clone() for p in params[-1][0]], copy.deepcopy(opts[-1].state_dict()), \
            torch.get_rng_state()
        for fn in fns:
            with torch.no_grad():
                for p, w in zip(params[-1][0], weights):
                    p.copy_(w)
            opts[-1].load_state_dict(copy.deepcopy(state))
            torch.set_rng_state(rng)
            batches.append([])
            fn()
            moved.append(all(p.grad is not None and not torch.equal(w, p) for w, p in zip(weights, params[-1][0])))
        return TIMES

    models, built, transformer, ce = [], building(monkeypatch), parity.ParityTransformer, F.cross_entropy
    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    monkeypatch.setattr(bench, "timed_rounds", rounds)
    def parity_model(*a):  # noting its inputs
        models.append(a)
        model = transformer(*a)
        model.register_forward_pre_hook(lambda m, x: bits.append(x[0]))
        return model

    bits = []
    monkeypatch.setattr(parity, "ParityTransformer", parity_model)
    monkeypatch.setattr(F, "cross_entropy", lambda out, y: batches[-1].append((len(y), ce(out, y))) or
                        batches[-1][-1][1])
    out = bench.bench_read_token_training(small_vit_args(), 64, 3, CPU)
    assert out == {"read_token_train_speedup_parity_64": 2.0, "read_token_train_speedup_parity_128": 2.0,
                   "read_token_train_speedup_vit": 2.0}
    assert moved == [True] * 6 and [lr for _, lr in params] == [1e-3] * 3
    assert models == [(20, 64, 4, 2), (20, 128, 4, 2)] and [(name, shape) for _, name, _, shape in built] == [
        ("vit", (1, 28, 10))]
    bits = torch.cat(bits)  # random bits as +-1, each sequence of 20 as parity.py takes it
    assert bits.shape == (64 * 5 * 2, 20, 1) and set(bits.unique().tolist()) == {-1.0, 1.0} and abs(bits.mean()) < 0.1
    assert [[b if b == "step" else b[0] for b in steps] for steps in batches] == \
        [[64, "step"] * 5] * 4 + [[100, "step"] * 5] * 2
    for alone, every in zip(batches[::2], batches[1::2]):  # the same losses either way (Adam's steps on gradients
        losses = [[b[1].item() for b in steps if b != "step"] for steps in (alone, every)]  # of float noise aside)
        assert losses[0][0] == pytest.approx(losses[1][0], abs=1e-6)
        assert losses[0] == pytest.approx(losses[1], abs=1e-3)


def test_the_paper_vits_step_on_a_cpu_is_one_sgd_step_of_the_authors_vit(monkeypatch):
    """paper_vit_step_ms: the median time of a training step (one per round on a CPU) in ms, of the authors' ViT
    (depth 8, 32 heads of 64, 28x28 images of one channel, 10 classes) at its SGD rate, on min(100, n) images."""
    built, steps, real_step = building(monkeypatch), [], torch.optim.SGD.step
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a: steps.append(self.param_groups[0]["lr"])
                        or real_step(self, *a))
    seen, ce = [], F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda out, y: seen.append(len(y)) or ce(out, y))
    moved = []

    def rounds(fns, device, n):  # the step, once: it changes every weight
        model = built[0][0]
        before = [p.detach().clone() for p in model.parameters()]
        fns[0]()
        moved.append(all(p.grad is not None and not torch.equal(a, p) for a, p in zip(before, model.parameters())))
        return [[0.5], [0.25], [2.0]]

    monkeypatch.setattr(bench, "timed_rounds", rounds)
    assert bench.bench_paper_vit(3, 3, CPU) == {"paper_vit_step_ms": 500.0}
    assert moved == [True]
    assert [(name, a.depth, a.heads, a.dim_head, shape) for _, name, a, shape in built] == [("vit", 8, 32, 64,
                                                                                             (1, 28, 10))]
    assert steps == [bench.vision.learning_rate("vit", bench.vision.parse_args(["--dataset", "fashionmnist"]))]
    assert seen == [3]
    sizes, randint = [], torch.randint  # at most 100 images (the step itself is not taken again)
    monkeypatch.setattr(torch, "randint", lambda low, high, size, **kw: sizes.append(size) or randint(low, high, size,
                                                                                                      **kw))
    monkeypatch.setattr(bench, "timed_rounds", lambda fns, device, n: [[1.0]])
    bench.bench_paper_vit(150, 3, CPU)
    assert sizes == [(100, 1, 28, 28), (100,)]


def test_the_corruption_figure_counts_every_image_of_every_corruption_but_frost_at_every_severity(monkeypatch):
    """corruption_images_per_s: n 32x32x3 images x 18 corruptions (all but frost) x 5 severities over the seconds the
    clock read between the first and the last, after a warm-up on 10 images."""
    import corruptions

    seen, real = [], corruptions.corrupt
    monkeypatch.setattr(corruptions, "corrupt", lambda x, name, s, g, **kw: seen.append((x.shape, name, s))
                        or real(x, name, s, g, **kw))
    ticks = iter([10.0, 14.0])
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    out = bench.bench_corruptions(CPU, n=12)
    names = [c for c in corruptions.SEVERITY if c != "frost"]
    assert len(names) == 18 and out == {"corruption_images_per_s": 12 * 18 * 5 / 4.0}
    assert seen == [((10, 3, 32, 32), "fog", 1)] + [((12, 3, 32, 32), name, s) for name in names for s in range(1, 6)]


def test_rss_mb_is_this_process_resident_memory():
    """Resident memory in MB (2^20 bytes, as /proc/self/statm's pages give it): below the process's peak, and up by
    about 200 MB once 200 MB are written."""
    import resource

    def statm_mb():  # the same, read as resident pages
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before = bench.rss_mb()
    x = torch.ones(50_000_000)  # 200 MB, written
    after, pages = bench.rss_mb(), statm_mb()
    assert 0 < before < after <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 + 1
    assert 150 < after - before < 260 and after > 300 and abs(after - pages) < 0.2  # in MB of 2^20 bytes
    del x


def test_the_memory_figure_is_the_sampled_peak_over_the_start_of_a_million_evaluations(monkeypatch):
    """est_1e6_mem_mb on a CPU: the highest resident memory sampled (every 2 ms) while the estimator runs, minus the
    memory before it, for at least 10^6 evaluations of a linear model (5,000 inputs of 16 positions, 13 draws, chunks
    of 8,192, noise of sigma 0.1)."""
    readings, seen = [100.0, 100.0, 160.0, 130.0], []

    def rss():
        readings.append(readings[-1])  # from the fifth reading on, the last one again
        return readings.pop(0)

    def estimator(f, x, perturb, *, reps, batch_size):
        deadline = time.monotonic() + 30
        while len(readings) > 4 or readings[0] != 130.0:  # until the sampler has read 100 and 160 during the run
            assert time.monotonic() < deadline, "no memory sampled while the estimator ran"
            time.sleep(0.001)
        noise = perturb(torch.zeros(10**5, 1), torch.Generator().manual_seed(0))
        seen.append((tuple(x.shape), reps, batch_size, tuple(f(x[:3], None).shape), round(float(noise.std()), 3)))
        return types.SimpleNamespace(evaluations=len(x) * x.shape[1] * reps)

    pauses = []  # the sampler's, between its readings
    monkeypatch.setattr(bench, "rss_mb", rss)
    monkeypatch.setattr(bench, "sensitivity", estimator)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(sleep=lambda s: (pauses.append(s), time.sleep(s))))
    assert bench.bench_memory(CPU) == {"est_1e6_mem_mb": 60.0}
    assert seen == [((5000, 16, 8), 13, 8192, (3, 10), 0.1)] and pauses and set(pauses) == {0.002}
    monkeypatch.setattr(bench, "sensitivity", lambda f, x, p, *, reps, batch_size: types.SimpleNamespace(
        evaluations=999_999))
    with pytest.raises(AssertionError):
        bench.bench_memory(CPU)


def test_the_training_workload_is_one_sgd_epoch_of_a_small_vit_in_batches_of_100(monkeypatch):
    """training_workload(n): vision.py's ViT (depth 2, 4 heads of 16, width 64, 7x7 patches) trained one epoch of n
    28x28 images per call, in batches of 100, by SGD at 0.01; each call trains it further."""
    built, seen, real = building(monkeypatch), [], bench.epoch_on_device
    monkeypatch.setattr(bench, "epoch_on_device", lambda model, opt, x, y, **kw: seen.append(
        (type(opt).__name__, opt.param_groups[0]["lr"], x.shape, x.dtype, y.shape, kw["batch_size"])) or real(
        model, opt, x, y, **kw))
    run = bench.training_workload(150)
    assert [(name, a.depth, a.heads, a.dim_head, a.dim, a.patch_size, shape) for _, name, a, shape in built] == [
        ("vit", 2, 4, 16, 64, 7, (1, 28, 10))]
    run()
    run()
    assert seen == [("SGD", 0.01, (150, 1, 28, 28), torch.uint8, (150,), 100)] * 2


def test_the_busy_worker_trains_until_its_seconds_have_passed(monkeypatch, capsys):
    """busy_worker: the policy's threads, one run, 'ready', then runs until the clock passes the end."""
    runs, threads, clock = [], [], iter([100.0, 100.5, 101.0, 101.5, 102.0])
    monkeypatch.setattr(bench, "training_workload", lambda n: lambda: runs.append(n))
    monkeypatch.setattr(bench.torch, "set_num_threads", threads.append)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(time=lambda: next(clock)))
    bench.busy_worker(3, 7, 1.2)  # to 101.2: the first run, then two more
    assert runs == [7, 7, 7] and threads == [3] and capsys.readouterr().out == "ready\n"


def test_the_busy_worker_says_ready_through_a_pipe_while_it_runs():
    """bench_shared_cpu reads the worker's 'ready' through a pipe before it times: the line must come through while
    the worker trains (a pipe's buffer would hold it until the worker ends), and the worker trains on until killed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe's own buffering, as bench.py's
    worker = subprocess.Popen([sys.executable, "-c", "import bench; bench.busy_worker(1, 20, 120)"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={**env, "OMP_NUM_THREADS": "1"})
    try:
        t = time.time()
        assert worker.stdout.readline() == "ready\n" and time.time() - t < 60 and worker.poll() is None
    finally:
        worker.kill()
        worker.wait()


def test_the_shared_cpu_figures_time_a_run_alone_then_beside_a_busy_worker(monkeypatch, kept_threads):
    """shared_cpu_slowdown = busy time / alone time with one thread per process, _default the same with torch's
    default threads in both (the worker started with them, timed once it says it is ready, then killed);
    alone_default_speedup = alone with one thread / alone with the default; one thread at the end."""
    log, times = [], iter([[[2.0]], [[3.0]], [[0.5]], [[4.0]]])

    class Worker:
        def __init__(self, argv, **kw):
            log.append(("start", argv, kw))
            self.stdout = types.SimpleNamespace(readline=lambda: log.append("ready") or "ready\n")

        def kill(self):
            log.append("kill")

        def wait(self):
            log.append("wait")

    def rounds(fns, device, n):
        log.append(("timed", torch.get_num_threads(), n))
        return next(times)

    monkeypatch.setattr(bench.subprocess, "Popen", Worker)
    monkeypatch.setattr(bench, "timed_rounds", rounds)
    monkeypatch.setattr(bench, "training_workload", lambda n: log.append(("workload", n)))
    monkeypatch.setattr(bench, "TORCH_DEFAULT_THREADS", 2)
    out = bench.bench_shared_cpu(9, 3)
    assert torch.get_num_threads() == 1
    assert out == {"shared_cpu_slowdown": 1.5, "shared_cpu_slowdown_default": 8.0, "torch_default_threads": 2,
                   "alone_default_speedup": 4.0}
    for k in (1, 2):
        worker = [sys.executable, "-c", f"import bench; bench.busy_worker({k}, 9, 900)"]
        assert log[:7] == [("workload", 9), ("timed", k, 3), ("start", worker, dict(cwd=ROOT, stdout=subprocess.PIPE,
                                                                                     text=True)),
                           "ready", ("timed", k, 3), "kill", "wait"]
        del log[:7]
    assert log == []


def test_the_quick_start_figure_is_a_fresh_one_thread_synthetic_run_over_the_reference_workload(monkeypatch,
                                                                                                 kept_threads):
    """quickstart_s: `python synthetic.py` in a process of its own (one thread, from the repository, into a
    temporary folder; 20 steps below n = 300), as the clock reads it; reference_s: the median of training_workload(n)'s
    rounds; quickstart_ratio: the first over the second."""
    seen, workloads = [], []
    monkeypatch.setattr(bench, "training_workload", lambda n: workloads.append(n) or (lambda: None))
    monkeypatch.setattr(bench, "timed_rounds", lambda fns, device, n: [[2.0], [1.0], [4.0]] if n == 3 else None)
    monkeypatch.setattr(bench.subprocess, "run", lambda argv, **kw: seen.append((argv, kw)))
    ticks = iter([5.0, 35.0, 0.0, 10.0])
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's: the quick start still gets one
    torch.set_num_threads(2)  # and the reference workload one in this process, whatever it had
    assert bench.bench_quickstart(120, 3) == {"quickstart_s": 30.0, "reference_s": 2.0, "quickstart_ratio": 15.0}
    assert bench.bench_quickstart(300, 3)["quickstart_s"] == 10.0
    assert torch.get_num_threads() == 1
    assert workloads == [120, 300] and len(seen) == 2
    for (argv, kw), steps in zip(seen, [["--steps", "20"], []]):
        assert argv[:3] == [sys.executable, "synthetic.py", "--out-dir"] and argv[4:] == steps
        assert not os.path.exists(argv[3])  # a temporary folder, gone
        assert kw["cwd"] == ROOT and kw["check"] and kw["capture_output"] and kw["env"]["OMP_NUM_THREADS"] == "1"
        assert kw["env"]["PATH"] == os.environ["PATH"]


def test_run_all_gives_each_group_its_sizes_prints_each_figure_and_writes_them(tmp_path, monkeypatch, capsys):
    """On a CPU with --n-inputs N: the estimator on N 32x32 images (4x4 patches, the tiny ViT) and 16N 28x28 images
    (7x7, the MLP); training on 30N images (the MLP) and 3N (the ViT), each model with 10 classes; N images for the
    scattered mask, read_token, the sensitivity during training and the paper's ViT; 10N for the corruptions, 3N for the
    shared CPU and 30N for the quick start; MRPC-length pairs: N // 12 (at least 2) for the estimator, 256 evaluated and
    256 trained on (32 and 16 below N = 10). Each figure is printed as measured; the file holds them all, with the
    arguments."""
    seen = []

    def shown(v):  # a tensor by its shape, a model by its class and classes, the vision flags by their model size
        if isinstance(v, torch.Tensor):
            return tuple(v.shape)
        if isinstance(v, torch.nn.Module):
            return type(v).__name__, [m.out_features for m in v.modules() if isinstance(m, torch.nn.Linear)][-1]
        return ("args", v.dataset, v.depth, v.heads, v.dim_head) if hasattr(v, "dim_head") else v

    def stub(name, figures=1.0):
        def run(*a, **kw):
            seen.append((name, [shown(v) for v in a], kw))
            return {f"{name}_figure": figures}
        return run

    names = ["estimator", "training", "scattered", "read_token", "read_token_training", "sens_during", "paper_vit",
             "language", "corruptions", "shared_cpu", "quickstart", "memory"]
    for name in names:
        monkeypatch.setattr(bench, f"bench_{name}", stub(name, 0.123456))
    for n, pairs, trained in [(24, 256, 256), (4, 32, 16)]:
        out = tmp_path / f"b{n}.json"
        args = bench.parse_args(["--n-inputs", str(n), "--device", "cpu", "--rounds", "3", "--batch-size", "64",
                                 "--out", str(out)])
        results = bench.run_all(args)
        cpu, a = CPU, ("args", "fashionmnist", 4, 4, 16)  # the converged protocol's ViT
        assert seen == [
            ("estimator", ["vit", ("TinyViT", 10), (n, 64, 48), 64, 3, cpu], {}),
            ("estimator", ["mlp", ("TinyMLP", 10), (16 * n, 16, 49), 64, 3, cpu], {}),
            ("training", ["mlp", ("MLP", 10), (30 * n, 1, 28, 28), (30 * n,), 3, cpu], {}),
            ("training", ["vit", ("ViT", 10), (3 * n, 1, 28, 28), (3 * n,), 3, cpu], {}),
            ("scattered", [a, (n, 1, 28, 28), 3, cpu], {}),
            ("read_token", [a, (n, 1, 28, 28), 3, cpu, pairs], {}),
            ("read_token_training", [a, trained, 3, cpu], {}),
            ("sens_during", [n, cpu], {}),
            ("paper_vit", [n, 3, cpu], {}),
            ("language", [max(2, n // 12), 3, cpu, pairs], {}),
            ("corruptions", [cpu, 10 * n], {}),
            ("shared_cpu", [3 * n, 3], {}),
            ("quickstart", [30 * n, 3], {}),
            ("memory", [cpu], {})], n
        seen.clear()
        assert results == {f"{k}_figure": 0.123456 for k in names}
        printed = capsys.readouterr().out.splitlines()
        assert printed == [f"{k}_figure 0.1235" for k in names] + [f"wrote {out}"]
        data = json.loads(out.read_text())
        assert data["results"] == results and data["args"]["n_inputs"] == n and data["env"]["device"] == "cpu"


@pytest.mark.parametrize("accs, levels, n", [
    ([0.1, 0.3, 0.3, 0.3, 0.5, 0.45, 0.6, 0.7, 0.7, 0.8], [4, 6, 9], 40),  # the first new highs from the 3rd, 5th, 9th
    ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7], [3, 5, 6], 40),  # none from the 9th: the last new high
    ([0.5, 0.45, 0.4, 0.4, 0.3, 0.3, 0.3, 0.2, 0.2, 0.1], [1], 20)])  # no new high (n / 10 at the floor of 2)
def test_the_sens_during_figure_times_two_whole_runs_with_levels_reached_where_asked(monkeypatch, accs, levels, n):
    """sens_needed_speedup_vit = the clock's time of the run with --sens-during every / with needed and --match-acc
    at the accuracies first reached at about the 3rd, 5th and 9th evaluations; sens_needed_measured: the evaluations
    the second run measured. Both train the converged protocol's ViT on 3n images whose label is a brighter row, 9
    epochs with an evaluation after each, Adam at 1e-3, sensitivity at sigma 0.1 and 1 on n / 10 images."""
    runs = []

    def train(name, seed, args, data, results, device):
        runs.append((name, seed, vars(args), data))
        folders.append((results.folder, results.data["script"], results.data["args"] == vars(args)))
        rows = [{"train_acc": a, **({"sens": 0.1} if args.sens_during == "every" or i in levels else {})}
                for i, a in enumerate(accs)]
        results.data["runs"][f"{name}/seed{seed}"] = {"history": rows}

    ticks, folders = iter([0.0, 30.0, 100.0, 110.0]), []
    monkeypatch.setattr(bench.vision, "train", train)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    out = bench.bench_sens_during(n, CPU)
    assert out == {"sens_needed_speedup_vit": 3.0, "sens_needed_measured": len(levels)}
    (_, _, every, data), (name, seed, needed, same) = runs
    assert (name, seed) == ("vit", 0) and same is data
    assert every["sens_during"] == "every" and needed["sens_during"] == "needed"
    assert every["match_acc"] == [] and needed["match_acc"] == [accs[j] for j in levels]
    for args in (every, needed):
        assert (args["dataset"], args["depth"], args["heads"], args["dim_head"], args["epochs"], args["eval_every"],
                args["batch_size"], args["n_sens"], args["sigma"], args["optimizer"], args["lr"]) == \
            ("fake28", 4, 4, 16, 9, 1, 50, max(2, n // 10), [0.1, 1.0], "adam", ["1e-3"])  # a rate per model, as given
    x, y = data["train_x"], data["train_y"]
    assert x.shape == (3 * n, 1, 28, 28) and x.dtype == torch.uint8 and y.shape == (3 * n,)
    assert torch.equal(data["test_x"], x[:n]) and torch.equal(data["test_y"], y[:n])
    rows = x.float().mean((1, 3))  # (3n, 28): each image's row brightness
    bright = rows[torch.arange(3 * n), 2 * y + 4]
    others = (rows.sum(1) - bright) / 27
    assert (rows.argmax(1) == 2 * y + 4).all() and abs((bright - others).mean() - 60) < 3  # 60 grey levels up
    on = torch.zeros(3 * n, 1, 28, 28, dtype=torch.bool)
    on[torch.arange(3 * n), :, 2 * y + 4] = True
    assert (x[on].min(), x[on].max(), x[~on].min(), x[~on].max()) == (60, 219, 0, 159)  # 0-159, and 60 more
    assert set(y.tolist()) == set(range(10))
    for folder, script, same_args in folders:  # each run's results in a temporary folder of its own, gone after
        assert script == "vision" and same_args and not os.path.exists(folder)
    assert folders[0][0] != folders[1][0]


@pytest.mark.parametrize("device, n_inputs, n, language, pairs, trained", [
    ("cuda", None, 1000, 256, 256, 256),  # a GPU's sizes (on stand-ins: no GPU is needed)
    ("cpu", None, 100, 8, 256, 256),  # a CPU's
    ("cpu", 10, 10, 2, 256, 256),  # the smallest full-size run
    ("cpu", 9, 9, 2, 32, 16)])  # and the largest smoke test
def test_run_all_sizes_each_group_for_its_device_in_its_threads_and_prints_as_it_goes(
        tmp_path, monkeypatch, kept_threads, device, n_inputs, n, language, pairs, trained):
    """Without --n-inputs, N is 1000 images on a GPU and 100 on a CPU; the language pairs are 256 on a GPU and N // 12
    (at least 2) on a CPU; from N = 10 on, read_token evaluates 256 pairs and trains on 256. Every group runs in the
    threads --threads asks for, and each figure line is flushed as it is printed (a run stopped halfway has shown
    what it measured, even with its output in a pipe)."""
    seen = {}

    def stub(name):
        def run(*a):
            seen[name] = (list(a), torch.get_num_threads())
            if name == "quickstart":
                torch.set_num_threads(1)  # as the real one leaves this process
            return {f"{name}_figure": 1.0}
        return run

    for name in ["sens_during", "language", "read_token", "read_token_training", "quickstart", "memory"]:
        monkeypatch.setattr(bench, f"bench_{name}", stub(name))
    fake = torch.device(device)
    monkeypatch.setattr(bench, "get_device", lambda name: fake)
    monkeypatch.setattr(bench, "environment", lambda d: {"device": d.type})
    monkeypatch.setattr(bench.torch, "randn", lambda *shape, device: torch.empty(*shape))  # no tensor on a GPU
    printed = printing(monkeypatch, bench)
    torch.set_num_threads(3)
    argv = ["--threads", "2", "--only", "sens_during,language,read_token,quickstart,memory", "--out",
            str(tmp_path / "b.json")]
    bench.run_all(bench.parse_args(argv + (["--n-inputs", str(n_inputs)] if n_inputs else [])))
    assert seen["sens_during"] == ([n, fake], 2) and seen["memory"] == ([fake], 2)  # after the quick start's 1
    assert seen["language"][0][0] == language and seen["language"][0][3] == pairs and seen["language"][1] == 2
    assert seen["read_token"][0][4] == pairs and seen["read_token_training"][0][1] == trained
    figures = [kw for a, kw in printed if "figure" in a[0]]
    assert len(figures) == 6 and all(kw == {"flush": True} for kw in figures)


def test_the_flags_defaults_and_values(tmp_path, monkeypatch):
    """With no flags: the device chosen, the estimator's own chunks, the inputs run_all picks (100 on a CPU, 1,000 on
    a GPU), 7 rounds, the scripts' one thread, every group, the first free out/bench/bench[-k].json. --only splits at
    commas, numbers are integers, and the folder of --out is made before any benchmark runs."""
    monkeypatch.chdir(tmp_path)
    assert vars(bench.parse_args([])) == dict(device="auto", batch_size=None, n_inputs=None, rounds=7, threads=0,
                                              only=None, out=None)
    assert (tmp_path / "out" / "bench").is_dir()
    out = str(tmp_path / "new" / "b.json")
    args = bench.parse_args(["--device", "cpu", "--batch-size", "64", "--n-inputs", "12", "--rounds", "3",
                             "--threads", "1", "--only", "estimator,memory", "--out", out])
    assert vars(args) == dict(device="cpu", batch_size=64, n_inputs=12, rounds=3, threads=1,
                              only=["estimator", "memory"], out=out)
    assert os.path.isdir(tmp_path / "new") and not os.listdir(tmp_path / "new")  # its write check left nothing


def test_the_two_small_models_have_the_sizes_they_are_timed_at():
    """TinyViT: 4x4 patches of 32x32x3 images (64 tokens of 48 numbers) embedded in 64 dimensions, learned positions
    drawn with std 0.02, 2 blocks of 4 heads of 16 with an MLP of 128 and no dropout, mean pooling, 10 classes. TinyMLP:
    784 pixels, two hidden layers of 512 with leaky ReLUs, 10 classes."""
    torch.manual_seed(0)
    vit, mlp = bench.TinyViT(), bench.TinyMLP()
    block = {"0.norm.weight": (64,), "0.norm.bias": (64,), "0.qkv.weight": (3 * 4 * 16, 64), "0.out.0.weight": (64, 64),
             "0.out.0.bias": (64,), "1.net.0.weight": (64,), "1.net.0.bias": (64,), "1.net.1.weight": (128, 64),
             "1.net.1.bias": (128,), "1.net.4.weight": (64, 128), "1.net.4.bias": (64,)}  # attention, then the MLP
    assert {k: tuple(v.shape) for k, v in vit.named_parameters()} == {
        "pos": (1, 64, 64), "embed.weight": (64, 48), "embed.bias": (64,),
        **{f"transformer.layers.{i}.{k}": shape for i in range(2) for k, shape in block.items()},
        "transformer.norm.weight": (64,), "transformer.norm.bias": (64,), "head.weight": (10, 64), "head.bias": (10,)}
    assert [attn.heads for attn, _ in vit.transformer.layers] == [4, 4]
    assert [attn.dropout for attn, _ in vit.transformer.layers] == [0.0, 0.0]  # timed as trained: no dropout
    assert all(m.p == 0.0 for m in vit.modules() if isinstance(m, torch.nn.Dropout))
    assert 0.018 < vit.pos.std().item() < 0.022 and abs(vit.pos.mean().item()) < 0.002
    tokens = torch.randn(3, 64, 48)
    expected = vit.head(vit.transformer(vit.embed(tokens) + vit.pos).mean(1))
    torch.testing.assert_close(vit(tokens), expected, rtol=0, atol=0)
    assert [type(m).__name__ for m in mlp.net] == ["Linear", "LeakyReLU", "Linear", "LeakyReLU", "Linear"]
    assert [tuple(m.weight.shape) for m in mlp.net[::2]] == [(512, 784), (512, 512), (10, 512)]
    tokens = torch.randn(3, 16, 49)
    torch.testing.assert_close(mlp(tokens), mlp.net(tokens.reshape(3, 784)), rtol=0, atol=0)


def test_the_usual_pipelines_dataset_gives_what_torchvisions_mnist_and_cifar10_give():
    """UInt8Images: item i is the transform of a PIL image of image i (grayscale from one channel, as MNIST's; RGB
    from three, channels last, as CIFAR10's) and label i as a Python int."""
    import numpy as np

    g = torch.Generator().manual_seed(0)
    for channels, mode in [(1, "L"), (3, "RGB")]:
        x = torch.randint(0, 256, (2, channels, 4, 5), generator=g, dtype=torch.uint8)
        ds = bench.UInt8Images(x, torch.tensor([3, 7]), lambda img: (img.mode, np.asarray(img)))
        (got_mode, pixels), label = ds[1]
        assert len(ds) == 2 and got_mode == mode and label == 7 and type(label) is int
        assert np.array_equal(pixels, x[1].permute(1, 2, 0).squeeze(2).numpy())
