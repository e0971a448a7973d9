"""parity.py: the task, the exact Fourier reference against known Boolean functions, the estimator against the exact
reference, and a short end-to-end run."""

import json
import math
import os
import re
import time

import pytest
import torch
import torch.nn.functional as F

import parity
import runs
from common import flip, sensitivity
from conftest import divergence_checks, loop_calls, optimizer_steps


def test_task_labels_are_the_parity_of_the_relevant_bits():
    """make_task: k sorted relevant bits; training and test inputs in {-1, +1}, labelled by the parity of those bits
    (balanced); the data seed fixes everything."""
    relevant, (x, y), (xt, yt) = parity.make_task(12, 3, 500, 200, data_seed=0)
    assert len(relevant) == 3 and x.shape == (500, 12, 1) and xt.shape == (200, 12, 1)
    assert relevant.tolist() == sorted(relevant.tolist())  # as metrics.json lists them
    assert set(x.unique().tolist()) == set(xt.unique().tolist()) == {-1.0, 1.0}  # the test inputs too
    assert torch.equal(y, (x[:, relevant, 0].prod(1) > 0).long())
    assert torch.equal(yt, (xt[:, relevant, 0].prod(1) > 0).long())
    assert abs(y.float().mean().item() - 0.5) < 0.1
    again = parity.make_task(12, 3, 500, 200, data_seed=0)
    assert torch.equal(again[0], relevant) and torch.equal(again[1][0], x)  # the data seed fixes everything


@pytest.mark.parametrize("n,fn,expected", [
    (6, lambda x: x[:, [0, 2, 5], 0].prod(1), 3.0),  # a 3-sparse parity: total influence 3
    (5, lambda x: x[:, :3, 0].sum(1).sign(), 1.5),  # majority of 3 bits: each bit is pivotal w.p. 1/2
    (4, lambda x: torch.ones(len(x)), 0.0),  # constant
    (7, lambda x: x[:, 4, 0], 1.0),  # a dictator
])
def test_fourier_sensitivity_of_known_functions(n, fn, expected):
    """sum_S |S| f_hat(S)^2 from the fast Walsh-Hadamard transform, and the estimator on all 2^n inputs, both equal
    the known total influence; Parseval: sum_S f_hat(S)^2 = 1."""
    x = parity.all_inputs(n)
    values = fn(x)
    coeffs = parity.walsh_hadamard(values)
    assert coeffs.pow(2).sum().item() == pytest.approx(1.0)
    degree = torch.tensor([bin(m).count("1") for m in range(2**n)], dtype=torch.float64)
    assert (degree * coeffs**2).sum().item() == pytest.approx(expected)
    s = sensitivity(lambda xb, idx: (fn(xb) > 0).long(), x, flip())
    assert s.mean * n == pytest.approx(expected)


def test_estimator_agrees_with_the_exact_reference_on_a_model():
    """For an (untrained) transformer on n = 10 bits, the estimator over all 2^10 inputs equals sum_S |S| f_hat^2."""
    torch.manual_seed(0)
    model = parity.ParityTransformer(10, 32, 4, 2).eval()
    exact = parity.exact_sensitivity(model, 10, torch.device("cpu"))
    with torch.no_grad():
        s = sensitivity(lambda xb, idx: model(xb), parity.all_inputs(10), flip())
    assert exact > 0  # the model is not constant, so the comparison is not vacuous
    assert s.mean * 10 == pytest.approx(exact, abs=1e-9)


@pytest.mark.slow
def test_end_to_end(tmp_path, monkeypatch):
    made = []
    real_adamw = torch.optim.AdamW
    monkeypatch.setattr(torch.optim, "AdamW", lambda *a, **kw: made.append(kw) or real_adamw(*a, **kw))
    blocks, real_block = [], parity.Block
    monkeypatch.setattr(parity, "Block", lambda *a: blocks.append(a[2:]) or real_block(*a))
    calls = loop_calls(monkeypatch)
    argv = ["--n", "8", "--k", "2", "--steps", "4", "--eval-every", "2", "--n-train", "300", "--n-test", "100",
            "--n-sens", "50", "--weight-decay", "0.3", "--dim-head", "5", "--mlp-dim", "12", "--out-dir",
            str(tmp_path), "--run-name", "t"]
    parity.main(parity.parse_args(argv))
    assert made == [{"lr": 1e-3, "weight_decay": 0.3}]  # the flag reaches the optimizer
    assert blocks and set(blocks) == {(5, 12)}  # --dim-head and --mlp-dim reach every block, each in its place
    data = json.loads((tmp_path / "parity" / "t" / "metrics.json").read_text())
    run = data["runs"]["setting1/seed0"]
    assert [h["step"] for h in run["history"]] == [0, 2, 4]
    assert run["seconds"]["training"] > 0 and run["seconds"]["evaluations"] > 0  # every step timed (--times)
    told = [(step, step % 2 == 0) for step in range(5)] * len(data["runs"])  # what the progress and checkpoints hear
    assert calls["progress"] == [(0, 4, 2)] * len(data["runs"])  # from step 0, 4 steps, evaluating every 2
    assert calls["tick"] == told and calls["checkpoint"] == [(*t, 0) for t in told]
    final = run["final"]
    assert final["sens_count"] == pytest.approx(final["sens"] * 8)
    assert len(final["sens_by_bit"]) == 8 and len(final["relevant_bits"]) == 2
    assert 0 <= final["sens_count_exact"] <= 8
    assert (tmp_path / "parity" / "t" / "parity.png").stat().st_size > 5000


@pytest.mark.parametrize("n", [16, 17])
def test_the_exact_value_up_to_16_bits_and_the_time_of_each_evaluation(tmp_path, n, capsys):
    """n <= 16 bits: the final record holds the exact sensitivity from the Fourier spectrum; 17 bits: none (2^17 inputs
    would be too many). Each evaluation records the seconds since its run started: growing, and within the test's own
    wall time, and prints its line; the run's relevant bits and size come first, once. The run ends with its summary (it
    ended with the figure's name alone)."""
    argv = ["--n", str(n), "--k", "2", "--steps", "2", "--eval-every", "1", "--n-train", "100", "--n-test", "20",
            "--n-sens", "10", "--dim", "8", "--heads", "2", "--out-dir", str(tmp_path)]
    t0 = time.time()
    run = parity.main(parity.parse_args(argv))["runs"]["setting1/seed0"]
    wall = time.time() - t0
    assert ("sens_count_exact" in run["final"]) == (n <= 16)
    times = [h["time"] for h in run["history"]]
    assert 0 <= times[0] <= times[1] <= times[2] == run["final"]["time"] <= wall
    out = capsys.readouterr().out
    assert "\nsetting1/seed0: count " in out and "\nsetting1 (1 seed) | count " in out
    size = re.findall(r"^setting1/seed0: .+ relevant bits \[\d+, \d+\], (\d+) parameters$", out, re.M)  # once
    assert len(size) == 1 and int(size[0]) > 100
    lines = [line for line in out.splitlines() if line.startswith("setting1/seed0 step ")]  # one per evaluation
    assert len(lines) == len(times) and all(" | sens count " in line for line in lines)
    assert "\nwrote " in out and "parity.png" in out  # the figure's path, after the summary


def test_bad_arguments():
    for argv in [["--k", "0"], ["--k", "30"], ["--lr", "0"], ["--setting", "9"], ["--weight-decay", "-1"]]:
        with pytest.raises(SystemExit):
            parity.parse_args(argv)


class Reads(torch.nn.Module):
    """The parity of the given bits, as two logits."""

    def __init__(self, bits):
        super().__init__()
        self.bits = bits

    def forward(self, x):
        v = x[:, self.bits, 0].prod(1)
        return torch.stack([-v, v], 1)


class Gated(torch.nn.Module):
    """Bit 0 where bit 1 is +1, else +1: how many single-bit flips change it depends on the input."""

    def forward(self, x):
        v = torch.where(x[:, 1, 0] > 0, x[:, 0, 0], torch.ones(len(x)))
        return torch.stack([-v, v], 1)


def test_sensitivity_count_and_the_share_on_the_relevant_bits():
    """The parity of the k relevant bits: count k, all of it on them; the parity of one irrelevant bit: count 1,
    none of it on them; normalised = count / n; per-bit profile 1 on the bits read."""
    relevant, (x, _), _ = parity.make_task(10, 3, 200, 10, data_seed=0)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[relevant] = True
    row = parity.measure_sensitivity(Reads(relevant), x, mask, 10)
    assert row["sens_count"] == 3 and row["sens_relevant"] == 3 and row["sens"] == 0.3
    other = int((~mask).nonzero()[0])
    row = parity.measure_sensitivity(Reads([other]), x, mask, 10)
    assert row["sens_count"] == 1 and row["sens_relevant"] == 0 and row["sens_by_bit"][other] == 1
    row = parity.measure_sensitivity(Gated(), x, mask, 10)  # the count varies from input to input: a standard error
    assert row["sens_count_stderr"] == pytest.approx(row["sens_stderr"] * 10) and row["sens_count_stderr"] > 0


def test_test_inputs_are_never_training_inputs():
    """No test input is also a training input, and a training set covering every input is refused."""
    _, (x, _), (xt, _) = parity.make_task(8, 2, 150, 60, data_seed=1)
    code = lambda b: set(((b[..., 0] > 0).long() @ (2 ** torch.arange(8))).tolist())  # noqa: E731
    assert not code(x) & code(xt) and len(xt) == 60
    with pytest.raises(ValueError, match="cover all 16 inputs"):
        parity.make_task(4, 2, 500, 10, data_seed=0)


def test_the_task_depends_only_on_data_seed():
    """The relevant bits, training and test sets come from --data-seed alone, not torch's global generator."""
    torch.manual_seed(1)
    a = parity.make_task(10, 3, 100, 50, data_seed=4)
    torch.manual_seed(2)
    b = parity.make_task(10, 3, 100, 50, data_seed=4)
    c = parity.make_task(10, 3, 100, 50, data_seed=5)
    assert torch.equal(a[0], b[0]) and all(torch.equal(u, v) for u, v in zip(a[1] + a[2], b[1] + b[2]))
    assert not torch.equal(a[2][0], c[2][0])


@pytest.mark.slow
def test_a_short_run_learns_the_parity(tmp_path):
    """300 steps on n = 8, k = 2: test accuracy 1 and Boolean sensitivity exactly k, all on the relevant bits, the
    exact Fourier value agreeing."""
    argv = ["--n", "8", "--k", "2", "--steps", "300", "--eval-every", "300", "--n-train", "150", "--n-test", "50",
            "--n-sens", "100", "--dim", "32", "--batch-size", "32", "--lr", "3e-3", "--out-dir", str(tmp_path)]
    final = parity.main(parity.parse_args(argv))["runs"]["setting1/seed0"]["final"]
    assert final["test_acc"] == 1.0 and final["sens_count"] == 2 and final["sens_relevant"] == 2
    assert final["sens_count_exact"] == pytest.approx(2.0)


def test_the_parity_figure_has_one_column_per_setting_with_its_seeds_averaged(tmp_path, monkeypatch):
    """report.draw_parity: runs of one setting with several seeds share a column, their curves averaged with a band
    (every curve drawn from all of that setting's histories)."""
    import report

    hist = [{"step": t, "train_acc": 0.5, "test_acc": 0.5, "sens_count": 1.0, "sens_relevant": 0.5} for t in (0, 10)]
    runs = {f"setting{s}/seed{seed}": {"model": f"setting{s}", "seed": seed, "history": hist, "final": {}}
            for s, seed in [(1, 0), (1, 1), (1, 2), (3, 0)]}
    drawn = []
    real = report.plot_curves
    monkeypatch.setattr(report, "plot_curves", lambda ax, hists, *a, **kw: drawn.append(len(hists)) or
                        real(ax, hists, *a, **kw))
    paths = report.draw({"script": "parity", "args": {"k": 3}, "runs": runs}, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["parity.png"]
    assert drawn == [3, 3, 3, 3, 1, 1, 1, 1]


def test_spearman_against_known_rankings():
    """Rank correlation: +1 for any increasing relation, -1 for a decreasing one, ties share their mean rank, and a
    constant sequence has none."""
    import report

    assert report.spearman([1, 2, 3, 4], [1, 10, 100, 1000]) == pytest.approx(1.0)
    assert report.spearman([1, 2, 3, 4], [5, 3, 2, 0]) == pytest.approx(-1.0)
    # ranks of [0, 0, 1] are [0.5, 0.5, 2]; against [0, 1, 2] Pearson on the ranks is sqrt(3)/2
    assert report.spearman([0, 1, 2], [0, 0, 1]) == pytest.approx(3**0.5 / 2)
    assert report.spearman([0, 1, 2], [1, 1, 1]) is None and report.spearman([1, 1, 1], [0, 1, 2]) is None
    assert report.spearman([0, 1], [1, 0]) == pytest.approx(-1.0)  # two points are enough; one is not
    assert report.spearman([0], [1]) is None


def test_plateau_readout_of_a_known_history():
    """plateau(): the evaluations before test accuracy first passes 0.55, the count-0 ones among them, its largest
    count, the halves' means, and the first step past 0.95."""
    import report

    counts = [0.0, 0.0, 1.0, 3.0, 0.0, 2.0]  # the plateau: six evaluations, then learning
    hist = [{"step": 100 * i, "test_acc": 0.5, "sens_count": c, "sens_relevant": c / 4} for i, c in enumerate(counts)]
    hist += [{"step": 600, "test_acc": 0.7, "sens_count": 2.5, "sens_relevant": 2.0},
             {"step": 700, "test_acc": 0.99, "sens_count": 3.0, "sens_relevant": 3.0}]
    p = report.plateau(hist)
    assert p["evals"] == 6 and p["zero"] == 3 and p["max"] == 3.0 and p["max_relevant"] == 0.75
    assert p["halves"] == (pytest.approx(1 / 3), pytest.approx(5 / 3)) and p["learned_step"] == 700
    assert p["spearman"] == pytest.approx(report.spearman(range(6), counts))
    assert report.plateau(hist[:6])["learned_step"] is None
    none = report.plateau(hist[6:])  # above chance at its first evaluation: no plateau to read
    assert none["evals"] == none["zero"] == 0 and none["spearman"] is None and none["learned_step"] == 700
    assert all(math.isnan(v) for v in [none["max"], none["max_relevant"], *none["halves"]])


def test_parity_summary_per_run_and_per_setting(capsys):
    """The printed summary: one line per run with its plateau, one per setting with the mean count over seeds and
    how many seeds learned."""
    import report

    def run(setting, seed, acc):
        hist = [{"step": 0, "test_acc": 0.5, "sens_count": 0.0, "sens_relevant": 0.0},
                {"step": 10, "test_acc": acc, "sens_count": 3.0, "sens_relevant": 3.0}]
        final = {"sens_count": 2.0 + seed, "sens_count_stderr": 0.0, "sens_relevant": 1.0, "test_acc": acc}
        return f"setting{setting}/seed{seed}", {"model": f"setting{setting}", "seed": seed, "history": hist,
                                                 "final": final}

    runs = dict([run(4, 0, 0.93), run(4, 1, 1.0), run(4, 2, 1.0)])  # 0.93: not learned
    runs["setting4/seed3"] = {"model": "setting4", "seed": 3, "history": [], "final": {}}  # started, not evaluated
    report.summary({"script": "parity", "runs": runs})
    out = capsys.readouterr().out
    assert "seed3" not in out  # nothing to print of a run without an evaluation
    assert ("setting4/seed0: count 2.000 +- 0.000 (relevant bits 1.000), test acc 0.930; test acc > 0.95 from step "
            "never") in out
    assert ("setting4/seed1: count 3.000 +- 0.000 (relevant bits 1.000), test acc 1.000; test acc > 0.95 from step "
            "10; plateau 1 evaluations: count 0 at 1, max 0.00 (relevant 0.00), Spearman with step undefined, halves "
            "nan -> 0.00") in out  # one evaluation: no first half
    assert ("setting4 (3 seeds) | count 3.000 +- 0.577 | on the relevant bits 1.000 +- 0.000 | test acc > 0.95 at the "
            "end in 2 of 3") in out
    assert "all " not in out  # the line over every setting needs more than one setting


def test_parity_summary_over_every_setting(capsys):
    """With several settings merged, one line over every run: how many learned and their final counts, the share of
    plateau evaluations at count 0 and its largest count, how many rank correlations with the step are positive, and
    how many second halves are above their first."""
    import report

    def run(setting, counts, acc):
        hist = [{"step": 100 * i, "test_acc": 0.5, "sens_count": c, "sens_relevant": c / 4} for i, c in
                enumerate(counts)] + [{"step": 900, "test_acc": acc, "sens_count": 3.0 * (acc > 0.95),
                                       "sens_relevant": 3.0 * (acc > 0.95)}]
        final = {"sens_count": 3.0 if acc > 0.95 else 1.0, "sens_count_stderr": 0.0, "sens_relevant": 3.0,
                 "test_acc": acc}
        return f"setting{setting}/seed0", {"model": f"setting{setting}", "seed": 0, "history": hist, "final": final}

    runs = dict([run(1, [0.0, 0.0, 1.0, 2.0], 1.0), run(3, [2.0, 1.0, 0.0, 0.0], 0.5),
                 run(4, [0.0, 1.0, 2.0, 3.0], 0.5)])  # two of three rise: a count that swapped would read 1 of 3
    report.summary({"script": "parity", "args": {"n": 20, "k": 3, "steps": 900}, "runs": runs})
    out = capsys.readouterr().out.splitlines()[-1]
    assert out == ("all 3 runs (n 20, k 3, 900 steps) | learned (test acc > 0.95 at the end) 1 of 3, their count "
                   "3.000 to 3.000, on the relevant bits 3.000 to 3.000 | plateau: count 0 at 40 to 60% of its "
                   "evaluations, its largest count 2.0 to 3.0 | Spearman with step positive in 2 of 3 (-0.89 to +0.95)"
                   " | second half above the first in 2 of 3")


def test_the_transformer_computes_its_formula():
    """Bits as tokens (the embedding of -1 or +1, plus a learned position), a class token in front, pre-norm blocks of
    softmax(q k^T / sqrt(d_head)) v over each head and a GELU MLP, both added to the residual stream, two logits read
    off the class token. Positions and class token start with std 0.02."""
    torch.manual_seed(0)
    model = parity.ParityTransformer(10, 64, 4, 2).eval()
    assert model.pos.std().item() == pytest.approx(0.02, rel=0.1)  # 704 draws
    assert model.cls.std().item() == pytest.approx(0.02, rel=0.3)  # 64 draws
    with torch.no_grad():
        for p in model.parameters():  # away from LayerNorm's 1 and 0 and from the symmetric start
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randint(0, 2, (5, 10, 1)).float() * 2 - 1

    def embedded(m):  # the class token, then each bit's embedding, plus the positions: (5, 11, 64)
        return torch.cat([m.cls.expand(5, 1, 64), m.bit.weight[(x[..., 0] == 1).long()]], dim=1) + m.pos

    h = embedded(model)
    for block in model.blocks:
        q, k, v = block.qkv(block.ln1(h)).view(5, 11, 3, 4, 16).unbind(2)  # (B, T, heads, d_head) each
        att = torch.einsum("bthe,bshe->bhts", q, k).div(16**0.5).softmax(-1)
        h = h + block.proj(torch.einsum("bhts,bshe->bthe", att, v).reshape(5, 11, 64))
        h = h + block.mlp[2](F.gelu(block.mlp[0](block.ln2(h))))
    out = model(x)
    assert out.shape == (5, 2)
    assert torch.allclose(out, model.head(h[:, 0]), atol=1e-5)
    h = embedded(model)
    assert torch.equal(model.embed(x), h)
    assert model.blocks[-1](h, rows=1).shape == (5, 1, 64)  # the last block computes the class alone
    assert torch.equal(out, model.head(model.blocks[-1](model.blocks[0](h), rows=1)[:, 0]))
    assert torch.equal(model.train()(x), out)  # training too (no dropout)
    grads = []  # and it trains as every token's computation would, up to float rounding
    for logits in [model(x), model.head(model.blocks(embedded(model))[:, 0])]:
        model.zero_grad()
        F.cross_entropy(logits, torch.arange(5) % 2).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert (grads[0] != 0).sum() > 0.9 * len(grads[0]) and torch.allclose(grads[0], grads[1], atol=1e-6)
    for depth in [1, 3]:  # the blocks before the last, and the last, whatever the depth
        deep = parity.ParityTransformer(10, 64, 4, depth).eval()
        assert torch.allclose(deep(x), deep.head(deep.blocks(embedded(deep))[:, 0]), atol=1e-5), depth


def test_flags_at_their_edges_and_over_a_settings_values():
    """--k may equal --n; a --dim that --heads does not divide is fine with --dim-head; --n-sens and --n-eval may take
    every training sample, one more is refused. A flag given overrides its setting's value, --seeds its seed."""
    assert parity.parse_args(["--n", "5", "--k", "5"]).k == 5
    assert parity.parse_args(["--dim", "30", "--heads", "4", "--dim-head", "8"]).dim_head == 8
    assert parity.parse_args(["--n-sens", "20000", "--n-eval", "20000"]).n_sens == 20000
    for bad in [["--dim", "30", "--heads", "4"], ["--n-eval", "20001"], ["--setting", "3", "--n-sens", "10001"]]:
        with pytest.raises(SystemExit):
            parity.parse_args(bad)
    assert parity.setting(parity.parse_args(["--setting", "4"]), 4) == {"n_train": 20000, "batch_size": 128, "dim": 64,
                                                                        "lr": 1e-3, "seeds": [0]}
    given = ["--setting", "4", "--n-train", "500", "--n-sens", "100", "--batch-size", "32", "--dim", "16", "--lr",
             "0.01", "--seeds", "3", "4"]
    assert parity.setting(parity.parse_args(given), 4) == {"n_train": 500, "batch_size": 32, "dim": 16, "lr": 0.01,
                                                           "seeds": [3, 4]}
    assert parity.setting(parity.parse_args(["--setting", "2"]), 2)["seeds"] == [1]


def test_training_replays_by_hand(tmp_path, monkeypatch):
    """Three AdamW steps of one run, replayed here from the flags: the initialisation from --seeds, batches of
    --batch-size drawn with replacement from the generator seeded with --seeds, --lr and --weight-decay; evaluations
    every --eval-every steps and at the last step, each checking the training loss for divergence and measuring the
    sensitivity on the first --n-sens training inputs."""
    checked = divergence_checks(monkeypatch)
    argv = ["--n", "10", "--k", "2", "--steps", "3", "--eval-every", "2", "--n-train", "300", "--n-test", "50",
            "--n-sens", "20", "--dim", "16", "--heads", "2", "--batch-size", "24", "--lr", "3e-3", "--weight-decay",
            "0.2", "--seeds", "5", "--out-dir", str(tmp_path)]
    stepped = optimizer_steps(monkeypatch, torch.optim.AdamW)  # the run's, read before the replay below adds to it
    history = parity.main(parity.parse_args(argv))["runs"]["setting1/seed5"]["history"]
    assert [h["step"] for h in history] == [0, 2, 3] and len(stepped) == 3  # none after the last evaluation
    assert checked == [h["train_loss"] for h in history]
    relevant, (x, y), test = parity.make_task(10, 2, 300, 50, 1234)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[relevant] = True
    runs.seed_all(5)
    model = parity.ParityTransformer(10, 16, 2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.2)
    gen = torch.Generator().manual_seed(5)
    rows = []
    for _ in range(4):
        rows.append({**parity.evaluate(model, {"train": (x, y), "test": test}),
                     **parity.measure_sensitivity(model, x[:20], mask, 10)})  # on the first --n-sens inputs
        model.train()
        b = torch.randint(300, (24,), generator=gen)
        loss = F.cross_entropy(model(x[b]), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert [{k: h[k] for k in rows[0]} for h in history] == [rows[0], rows[2], rows[3]]


def test_what_the_evaluations_measure_on(tmp_path, monkeypatch):
    """Train accuracy on the first 2,000 training inputs (all of fewer; --n-eval sets the number), test accuracy on
    every test input; evaluate() covers sets larger than its chunks of 4,096."""
    sizes = []
    real = parity.evaluate
    monkeypatch.setattr(parity, "evaluate", lambda model, sets: sizes.append({k: len(v[0]) for k, v in sets.items()})
                        or real(model, sets))
    base = ["--n", "13", "--k", "2", "--steps", "1", "--n-test", "30", "--n-sens", "5", "--dim", "8", "--heads", "2",
            "--out-dir", str(tmp_path)]
    for flags, train in [(["--n-train", "2500"], 2000), (["--n-train", "2500", "--n-eval", "50"], 50),
                         (["--n-train", "300"], 300)]:
        sizes.clear()
        parity.main(parity.parse_args(base + flags))
        assert sizes == [{"train": train, "test": 30}] * 2, flags
    torch.manual_seed(0)
    model = parity.ParityTransformer(13, 8, 2, 1).eval()
    x = parity.all_inputs(13)[:5000]
    y = torch.randint(0, 2, (5000,))
    with torch.no_grad():
        logits = model(x)
    row = real(model, {"all": (x, y)})
    assert row["all_loss"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    assert row["all_acc"] == (logits.argmax(1) == y).float().mean().item()


def test_all_settings_run_each_settings_values(tmp_path, monkeypatch):
    """--all-settings: each setting's own training samples, width, learning rate and seed reach the task, the model
    and the optimiser, in a folder named n<n>-k<k>-all."""
    made = []
    real_task, real_model, real_adamw = parity.make_task, parity.ParityTransformer, torch.optim.AdamW
    monkeypatch.setattr(parity, "make_task", lambda n, k, n_train, *a: made.append(("n_train", n_train)) or
                        real_task(n, k, n_train, *a))
    monkeypatch.setattr(parity, "ParityTransformer", lambda n, dim, *a: made.append(("dim", dim)) or
                        real_model(n, dim, *a))
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, lr, **kw: made.append(("lr", lr)) or
                        real_adamw(params, lr=lr, **kw))
    argv = ["--all-settings", "--steps", "1", "--n-test", "20", "--n-sens", "10", "--n-eval", "10", "--out-dir",
            str(tmp_path)]
    data = parity.main(parity.parse_args(argv))
    assert [v for k, v in made if k == "n_train"] == [20000, 20000, 10000, 20000, 20000, 20000]
    assert [v for k, v in made if k == "dim"] == [64, 64, 64, 64, 128, 64]
    assert [v for k, v in made if k == "lr"] == [1e-3] * 5 + [2e-3]
    assert list(data["runs"]) == ["setting1/seed0", "setting2/seed1", "setting3/seed0", "setting4/seed0",
                                  "setting5/seed0", "setting6/seed0"]
    assert (tmp_path / "parity" / "n20-k3-all" / "metrics.json").is_file()
