"""grokking.py: the dataset, the model (its last-position shortcut against the full computation), the float64 loss,
the phase detection and a short end-to-end run."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import grokking
import report
import runs
from common import gaussian, sensitivity
from conftest import divergence_checks, loop_calls, optimizer_steps, spy


def test_dataset_has_every_pair_and_a_fixed_30_percent_split():
    tokens, labels, train = grokking.make_data(13, 0.3, seed=0)
    assert tokens.shape == (169, 3) and (tokens[:, 2] == 13).all()
    assert {(a, b) for a, b in tokens[:, :2].tolist()} == {(a, b) for a in range(13) for b in range(13)}
    assert torch.equal(labels, (tokens[:, 0] + tokens[:, 1]) % 13)
    assert train.sum() == int(0.3 * 169)
    assert torch.equal(grokking.make_data(13, 0.3, seed=0)[2], train)
    assert not torch.equal(grokking.make_data(13, 0.3, seed=1)[2], train)


def full_forward(model, tokens, residual=True):
    """The textbook computation: causal attention and MLP at every position, logits read at the last one (without
    the residual stream: each layer's output alone)."""
    x = model.embed(tokens) + model.W_pos  # (B, 3, d)
    q = torch.einsum("btd,hde->bhte", x, model.W_Q)
    k = torch.einsum("btd,hde->bhte", x, model.W_K)
    v = torch.einsum("btd,hde->bhte", x, model.W_V)
    att = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    att = att.masked_fill(~torch.tril(torch.ones(3, 3, dtype=torch.bool)), float("-inf")).softmax(-1)
    attn_out = torch.einsum("bhte,hed->btd", att @ v, model.W_O)
    x = x + attn_out if residual else attn_out
    mlp_out = F.relu(x @ model.W_in + model.b_in) @ model.W_out + model.b_out
    x = x + mlp_out if residual else mlp_out
    return x[:, -1] @ model.W_U


def test_last_position_shortcut_equals_the_full_computation():
    """The '=' position alone gives the logits of the whole forward pass, with and without the residual stream
    (biases drawn away from their zero initialisation, so that their signs show)."""
    torch.manual_seed(0)
    tokens, _, _ = grokking.make_data(13, 0.3, seed=0)
    for residual in [True, False]:
        model = grokking.OneLayerTransformer(13, 32, 4, 64, residual=residual)
        with torch.no_grad():
            model.b_in.normal_()
            model.b_out.normal_()
        out = model(tokens)
        assert out.shape == (169, 13)
        assert torch.allclose(out, full_forward(model, tokens, residual), atol=1e-5), residual
        assert model(tokens[:5]).shape == (5, 13)


def test_initialisation_scales():
    """Gaussian weights of std d_model^-1/2 (embeddings, positions, queries, keys, values, MLP input, unembedding),
    (heads * d_head)^-1/2 (attention output) and d_mlp^-1/2 (MLP output); zero biases."""
    torch.manual_seed(0)
    model = grokking.OneLayerTransformer(97, 64, 2, 512)  # heads * d_head = 64 = d_model: 2 heads of 32
    scales = {"W_E": 64, "W_pos": 64, "W_Q": 64, "W_K": 64, "W_V": 64, "W_O": 64, "W_in": 64, "W_out": 512, "W_U": 64}
    for name, fan in scales.items():
        assert getattr(model, name).std().item() == pytest.approx(fan**-0.5, rel=0.12), name
    assert not model.b_in.any() and not model.b_out.any()


def test_loss_is_float64_where_float32_underflows():
    """A confident, correct prediction: float32 cross-entropy rounds to exactly 0, float64 keeps the tiny loss."""
    logits = torch.tensor([[20.0, 0.0, 0.0]])  # loss = log(1 + 2 e^-20) = 4.1e-9
    labels = torch.tensor([0])
    assert F.cross_entropy(logits, labels).item() == 0.0
    loss = grokking.loss_fn(logits, labels)
    assert loss.dtype == torch.float64 and loss.item() == pytest.approx(2 * math.exp(-20), rel=1e-6)


def test_phases():
    hist = [{"epoch": e, "train_acc": tr, "test_acc": te} for e, tr, te in
            [(0, 0.1, 0.0), (100, 1.0, 0.05), (200, 1.0, 0.5), (250, 1.0, 0.93), (300, 1.0, 0.97)]]
    assert report.phases(hist) == (100, 300)
    assert report.phases(hist[:2]) == (100, None)


def test_grokking_claim_measures_the_fall_from_memorisation(capsys):
    """The claims count the sensitivity's fall from its value at memorisation, not from the start: here it rises
    from 0.15 to 0.6 at epoch 100, is 0.5 at memorisation (epoch 200), 0.08 at 400 and 0.04 at 500; epoch 0's 0.15 is
    below half of both but comes before memorisation. The weight norm is 10% below its value at memorisation from
    500."""
    rows = [(0, 0.1, 0.0, 0.15, 50), (100, 0.9, 0.0, 0.6, 50), (200, 1.0, 0.0, 0.5, 50), (300, 1.0, 0.1, 0.3, 46),
            (400, 1.0, 0.6, 0.08, 46), (500, 1.0, 0.97, 0.04, 45)]
    hist = [dict(epoch=e, train_acc=tr, test_acc=te, sens=s, weight_norm=w) for e, tr, te, s, w in rows]
    report.grokking_claim({"runs": {"p/seed0": {"history": hist}, "p/seed1": {"history": []}}})  # seed1: no line
    assert capsys.readouterr().out == (
        "p/seed0: memorised at epoch 200 (sensitivity 0.500); sensitivity halves by 400, a tenth by 500; weight norm "
        "10% below memorisation's by 500; test acc > 0.5 from 400, > 0.95 (grokked) from 500\n")
    assert report.fell_to(hist, None, "sens", 0.5) is None  # never memorised: nothing to fall from


def test_figure_draws_each_seed_to_its_own_last_epoch(tmp_path, drawn):
    """Seeds grok (and under --stop-after-grok end) at different epochs: the figure draws each run whole, not a mean
    cut at the shortest run's end."""
    def run(last):
        return {"history": [dict(epoch=e, train_acc=1.0, test_acc=e / last, train_loss=1.0, test_loss=1.0, sens=0.1,
                                 sens_joint=0.2, weight_norm=50.0) for e in range(0, last + 1, 100)]}

    report.draw({"script": "grokking", "runs": {"p/seed0": run(500), "p/seed1": run(1200)}}, str(tmp_path))
    accuracy = drawn[0].axes[0]
    curves = [line for line in accuracy.lines if len(line.get_xdata()) > 2]  # (not the phases' vertical lines)
    assert sorted(max(line.get_xdata()) for line in curves) == [500, 500, 1200, 1200]  # train and test of each seed
    phases = sorted((line.get_xdata()[0], line.get_linestyle()) for line in accuracy.lines if line not in curves)
    assert phases == [(0, ":"), (0, ":"), (500, "--"), (1200, "--")]  # memorised (train acc 1), grokked (test > 0.95)
    assert accuracy.get_xscale() == "symlog" and accuracy.get_xlim()[0] == 0
    assert accuracy.get_title() == "accuracy (2 seeds)"
    assert [t.get_text() for t in accuracy.get_legend().get_texts()] == ["train", "test"]  # one entry per quantity
    colours = [tuple(line.get_color()) for line in curves]  # train of each seed, then test of each
    assert colours[0] == colours[1] != colours[2] == colours[3]  # ... and one colour per quantity


@pytest.mark.slow
def test_end_to_end(tmp_path, monkeypatch):
    """Two seeds of 4 epochs: metrics.json's keys, evaluations every 2 epochs, every epoch timed, a checkpoint every
    --save-every epochs, each epoch's call saying whether it evaluates."""
    calls = loop_calls(monkeypatch)
    argv = ["--p", "11", "--epochs", "4", "--eval-every", "2", "--dim", "16", "--heads", "2", "--mlp-dim", "32",
            "--seeds", "0", "1", "--save-every", "4", "--out-dir", str(tmp_path), "--run-name", "t"]
    grokking.main(grokking.parse_args(argv))
    folder = tmp_path / "grokking" / "t"
    data = json.loads((folder / "metrics.json").read_text())
    assert set(data["runs"]) == {"p11/seed0", "p11/seed1"}
    run = data["runs"]["p11/seed0"]
    assert [h["epoch"] for h in run["history"]] == [0, 2, 4]
    for key in ["sens", "sens_stderr", "sens_joint", "train_acc", "test_acc", "weight_norm", "epoch_memorised",
                "epoch_grokked"]:
        assert key in run["final"]
    assert 0 <= run["final"]["sens"] <= 1 and run["final"]["weight_norm"] > 0
    assert run["seconds"]["training"] > 0 and run["seconds"]["evaluations"] > 0  # every epoch timed (--times)
    told = [(epoch, epoch % 2 == 0) for epoch in range(5)] * 2  # two seeds: what the progress and checkpoints hear
    assert calls["progress"] == [(0, 4, 2)] * 2  # from epoch 0, 4 epochs, evaluating every 2
    assert calls["tick"] == told and calls["checkpoint"] == [(*t, 4) for t in told]
    assert (folder / "checkpoint.pt").exists() and (folder / "grokking.png").stat().st_size > 5000


def test_bad_arguments():
    for argv in [["--sigma", "-1"], ["--frac-train", "1.5"], ["--dim", "30", "--heads", "4"], ["--p", "1"],
                 ["--frac-train", "1"], ["--p", "3", "--frac-train", "0.1"]]:  # no test pair; int(0.9): no train pair
        with pytest.raises(SystemExit):
            grokking.parse_args(argv)
    assert grokking.parse_args(["--p", "3", "--frac-train", "0.12"]).p == 3  # one training pair of the nine
    assert grokking.parse_args(["--p", "2", "--frac-train", "0.5"]).p == 2  # the smallest p: two pairs of four


class Both(torch.nn.Module):
    """A stand-in with the model's interface: class 1 iff the first coordinate of a's and of b's embedding are both
    positive (all embeddings start at 0.5); with read="=", the answer reads only the '=' token instead."""

    def __init__(self, read="ab"):
        super().__init__()
        self.read = read

    def embed(self, tokens):
        return torch.full((len(tokens), 3, 4), 0.5)

    def forward_embedded(self, e):
        score = e[:, 2, 0] if self.read == "=" else torch.minimum(e[:, 0, 0], e[:, 1, 0])
        return torch.stack([torch.zeros_like(score), score], 1)


def test_token_wise_and_joint_sensitivity_have_their_closed_forms():
    """Token-wise (the paper's): a, then b, perturbed alone, each flips w.p. p = Phi(-0.5 / sigma), so the mean is p.
    Joint (the authors' code): both at once flip w.p. 1 - (1 - p)^2. The '=' token is never perturbed."""
    tokens = torch.zeros(400, 3, dtype=torch.long)
    sigma = 0.8
    row = grokking.measure_sensitivity(Both(), tokens, sigma, 5, seed=0)
    p = 0.5 * (1 + math.erf(-0.5 / sigma / math.sqrt(2)))
    assert abs(row["sens"] - p) < 4 * math.sqrt(p * (1 - p) / 4000)
    joint = 1 - (1 - p) ** 2
    assert abs(row["sens_joint"] - joint) < 4 * math.sqrt(joint * (1 - joint) / 2000)
    # 5 draws per (pair, position): the standard error of the binomial flip rates, and the same noise on every call
    assert row["sens_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / (2 * 5 * 400)), rel=0.25)
    assert grokking.measure_sensitivity(Both(), tokens, sigma, 5, seed=0) == row
    assert row["sens_joint"] > row["sens"] + 0.1  # they differ on this model
    eq = grokking.measure_sensitivity(Both("="), tokens, 100.0, 5, seed=0)
    assert eq["sens"] == 0 and eq["sens_joint"] == 0


def test_evaluate_weight_norm_and_sets():
    """The weight norm is sqrt(sum of every parameter squared); loss and accuracy are computed on the training pairs
    and on the other pairs separately."""
    torch.manual_seed(0)
    model = grokking.OneLayerTransformer(11, 16, 2, 32)
    tokens, labels, train = grokking.make_data(11, 0.3, seed=0)
    row = grokking.evaluate(model, tokens, labels, train)
    assert row["weight_norm"] == pytest.approx(math.sqrt(sum((p.double() ** 2).sum().item()
                                                             for p in model.parameters())), rel=1e-6)
    logits = model(tokens)
    for name, m in [("train", train), ("test", ~train)]:
        assert row[f"{name}_acc"] == pytest.approx((logits[m].argmax(1) == labels[m]).float().mean().item())
        assert row[f"{name}_loss"] == pytest.approx(F.cross_entropy(logits[m].double(), labels[m]).item())
    assert train.sum() == 36 and (~train).sum() == 121 - 36  # disjoint and complete


@pytest.mark.slow
def test_a_short_run_memorises(tmp_path):
    """300 full-batch AdamW epochs on (a + b) mod 11: the training pairs are memorised (accuracy 1, found as the
    memorisation epoch) while the held-out pairs are not."""
    argv = ["--p", "11", "--epochs", "300", "--eval-every", "100", "--dim", "32", "--heads", "2", "--mlp-dim", "64",
            "--lr", "1e-2", "--out-dir", str(tmp_path)]
    final = grokking.main(grokking.parse_args(argv))["runs"]["p11/seed0"]["final"]
    assert final["train_acc"] == 1.0 and final["test_acc"] < 0.5 and final["epoch_memorised"] <= 300


def test_grokked_for_counts_epochs_since_test_accuracy_first_passed_95_percent():
    hist = [{"epoch": e, "train_acc": 1.0, "test_acc": te} for e, te in [(0, 0.0), (100, 0.96), (200, 0.5), (300, 1.0)]]
    assert grokking.grokked_for(hist[:2], 0) and not grokking.grokked_for(hist[:2], 1)
    assert grokking.grokked_for(hist, 200) and not grokking.grokked_for(hist, 201)  # from the first crossing on
    assert not grokking.grokked_for(hist[:1], 0) and not grokking.grokked_for(hist, None)


@pytest.mark.slow
def test_stop_after_grok_ends_the_run_that_many_epochs_after_grokking(tmp_path, monkeypatch):
    """--stop-after-grok N: the run ends at the first evaluation N epochs after it grokked, with the numbers of the
    full run up to there (here "grokked" is faked as epoch 4: a real task groks only after thousands of epochs)."""
    monkeypatch.setattr(report, "phases", lambda h: (0, next((x["epoch"] for x in h if x["epoch"] >= 4), None)))
    base = ["--p", "11", "--epochs", "20", "--eval-every", "2", "--dim", "16", "--heads", "2", "--mlp-dim", "32",
            "--out-dir", str(tmp_path)]
    full = grokking.main(grokking.parse_args(base + ["--run-name", "full"]))["runs"]["p11/seed0"]
    stopped = grokking.main(grokking.parse_args(base + ["--run-name", "stopped", "--stop-after-grok", "4"]))
    run = stopped["runs"]["p11/seed0"]
    assert [h["epoch"] for h in run["history"]] == [0, 2, 4, 6, 8]
    assert run["final"]["epoch_end"] == 8 and run["final"]["epoch_grokked"] == 4
    assert full["final"]["epoch_end"] == 20 and len(full["history"]) == 11
    drop = lambda h: {k: v for k, v in h.items() if k != "time"}  # noqa: E731
    assert [drop(h) for h in run["history"]] == [drop(h) for h in full["history"][:5]]
    assert run["final"]["sens"] == full["history"][4]["sens"]


def test_summary_names_each_runs_phases_and_where_its_sensitivity_was_read(capsys):
    """report.py's summary of a grokking folder: per finished run the epochs of memorisation and grokking and the
    final sensitivity with the epoch it was measured at (runs written before --stop-after-grok have no epoch_end)."""
    final = {"epoch_memorised": 200, "epoch_grokked": 500, "sens": 0.04, "epoch_end": 1500}
    runs = {"p/seed0": {"history": [], "final": final},
            "p/seed1": {"history": [], "final": {k: v for k, v in final.items() if k != "epoch_end"}},
            "p/seed2": {"history": [], "final": {}}}  # unfinished: no line
    report.summary({"script": "grokking", "runs": runs})
    assert capsys.readouterr().out.splitlines() == [
        "p/seed0: memorised at epoch 200, grokked at 500, sensitivity at epoch 1500 0.0400",
        "p/seed1: memorised at epoch 200, grokked at 500, sensitivity 0.0400"]


def test_the_flags_reach_the_optimizer_and_the_model(tmp_path, monkeypatch, capsys):
    """--lr and --weight-decay reach AdamW with Nanda et al.'s betas (0.9, 0.98); --no-residual reaches the model;
    each evaluation records the seconds since the run started and prints its line; the figure's path ends the run."""
    made = {}
    monkeypatch.setattr(torch.optim, "AdamW", spy(made, "opt", torch.optim.AdamW))
    monkeypatch.setattr(grokking, "OneLayerTransformer", spy(made, "model", grokking.OneLayerTransformer))
    argv = ["--p", "11", "--epochs", "2", "--eval-every", "1", "--dim", "16", "--heads", "2", "--mlp-dim", "32",
            "--lr", "0.003", "--weight-decay", "0.5", "--no-residual", "--out-dir", str(tmp_path)]
    hist = grokking.main(grokking.parse_args(argv))["runs"]["p11/seed0"]["history"]
    assert made == {"opt": {"lr": 0.003, "weight_decay": 0.5, "betas": (0.9, 0.98)}, "model": {"residual": False}}
    assert 0 <= hist[0]["time"] <= hist[-1]["time"] < 600
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("p11/seed0 epoch ")]
    assert len(lines) == len(hist) and all(" | sens " in line for line in lines) and "\nwrote " in out


def test_both_sensitivities_are_the_estimators_with_their_arguments():
    """measure_sensitivity is the estimator on the number embeddings with --reps draws and the run's seed: token-wise
    with the '=' position masked out, joint with a and b as one token and '=' put back for each copy's own pair."""
    torch.manual_seed(0)
    model = grokking.OneLayerTransformer(7, 16, 2, 32).eval()
    tokens = grokking.make_data(7, 0.5, seed=0)[0][:20]
    row = grokking.measure_sensitivity(model, tokens, 0.7, 3, seed=4)
    with torch.no_grad():
        e = model.embed(tokens)
        mask = torch.tensor([[True, True, False]]).expand(20, 3)
        tok = sensitivity(lambda xb, idx: model.forward_embedded(xb), e, gaussian(0.7), mask=mask, reps=3, seed=4)
        joint = sensitivity(lambda xb, idx: model.forward_embedded(torch.cat([xb.view(len(xb), 2, -1), e[idx, 2:]], 1)),
                            e[:, :2].reshape(20, 1, -1), gaussian(0.7), reps=3, seed=4)
    assert row == {"sens": tok.mean, "sens_stderr": tok.stderr, "sens_joint": joint.mean,
                   "sens_joint_stderr": joint.stderr}
    assert 0 < tok.mean < 1 and 0 < joint.mean < 1  # not vacuous: some copies flip, some do not


def test_training_replays_by_hand(tmp_path, monkeypatch):
    """Three full-batch AdamW epochs of one run, replayed here from the flags: the initialisation from --seeds, every
    training pair each epoch; evaluations every --eval-every epochs and at the last, each checking the training loss
    for divergence and measuring the sensitivity on the training pairs with the run's seed. With --stop-after-grok
    the progress line's time to the end is an upper bound."""
    checked, early = divergence_checks(monkeypatch), []
    real_progress = runs.Results.progress
    monkeypatch.setattr(runs.Results, "progress", lambda self, *a, **kw: early.append(kw.get("early")) or
                        real_progress(self, *a, **kw))
    argv = ["--p", "7", "--frac-train", "0.5", "--epochs", "3", "--eval-every", "2", "--dim", "16", "--heads", "2",
            "--mlp-dim", "32", "--lr", "0.01", "--seeds", "3", "--sigma", "0.7", "--reps", "2", "--out-dir",
            str(tmp_path)]
    stepped = optimizer_steps(monkeypatch, torch.optim.AdamW)  # the run's, read before the replay below adds to it
    history = grokking.main(grokking.parse_args(argv))["runs"]["p7/seed3"]["history"]
    assert [h["epoch"] for h in history] == [0, 2, 3] and len(stepped) == 3  # none after the last evaluation
    assert checked == [h["train_loss"] for h in history] and early == [False]
    tokens, labels, train = grokking.make_data(7, 0.5, 598)
    runs.seed_all(3)
    model = grokking.OneLayerTransformer(7, 16, 2, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=1.0, betas=(0.9, 0.98))
    rows = []
    for _ in range(4):
        rows.append({**grokking.evaluate(model, tokens, labels, train),
                     **grokking.measure_sensitivity(model, tokens[train], 0.7, 2, seed=3)})
        loss = grokking.loss_fn(model(tokens[train]), labels[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert [{k: h[k] for k in rows[0]} for h in history] == [rows[0], rows[2], rows[3]]
    grokking.main(grokking.parse_args(argv[:-2] + ["--stop-after-grok", "5", "--out-dir", str(tmp_path)]))
    assert early == [False, True]
