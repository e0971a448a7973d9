"""synthetic.py: the data generator's invariants, the candidate functions' sensitivities against hand-computed values,
and a short end-to-end run."""

import json
import math
import os
import time

import pytest
import torch

import report
import synthetic
from common import replace, sensitivity
from conftest import loop_calls, optimizer_steps, synthetic_final
from runs import seed_all


def test_generator_invariants():
    """Balanced labels; each sequence has exactly n_s sparse tokens from S_y, alpha*n_f frequent ones from F_y, the
    rest of the frequent slots from F_-y, the others irrelevant; the OOD set swaps only the sparse set."""
    vocab = synthetic.Vocab(2, 10, 20)
    g = torch.Generator().manual_seed(0)
    sizes = dict(n=20, n_sparse=3, n_frequent=9, alpha=5 / 9)
    ids, y = synthetic.make_data(vocab, size=4000, generator=g, **sizes)
    assert ids.shape == (4000, 20) and set(y.tolist()) == {-1, 1}
    assert abs((y == 1).float().mean().item() - 0.5) < 0.03
    kind, sign = vocab.kind[ids], vocab.sign[ids]
    agree = sign == y[:, None]
    assert ((kind == 0) & agree).sum(1).eq(3).all() and (kind == 0).sum(1).eq(3).all()
    assert ((kind == 1) & agree).sum(1).eq(5).all() and ((kind == 1) & ~agree).sum(1).eq(4).all()
    assert (kind == 2).sum(1).eq(20 - 3 - 9).all()
    assert len({tuple(r) for r in (kind == 0).int().tolist()}) > 100  # slots are shuffled, not fixed

    ids_ood, y_ood = synthetic.make_data(vocab, size=4000, generator=g, ood=True, **sizes)
    kind, sign = vocab.kind[ids_ood], vocab.sign[ids_ood]
    assert ((kind == 0) & (sign == -y_ood[:, None])).sum(1).eq(3).all()  # sparse tokens vote for the other label
    assert ((kind == 1) & (sign == y_ood[:, None])).sum(1).eq(5).all()  # the frequent vote is unchanged


def test_vocabulary_direction_vectors():
    """Token ids run S+, S-, F+, F-, R; v_sparse = 1_{S+} - 1_{S-}, v_frequent = 1_{F+} - 1_{F-}, v_irrelevant = 1_R,
    and an irrelevant token votes for neither label (sign 0)."""
    vocab = synthetic.Vocab(2, 3, 4)
    assert vocab.d == 2 * 2 + 2 * 3 + 4
    assert vocab.v_sparse.tolist() == [1, 1, -1, -1] + [0] * 10
    assert vocab.v_frequent.tolist() == [0] * 4 + [1, 1, 1, -1, -1, -1] + [0] * 4
    assert vocab.v_irrelevant.tolist() == [0] * 10 + [1] * 4
    assert vocab.sign.tolist() == [1, 1, -1, -1, 1, 1, 1, -1, -1, -1, 0, 0, 0, 0]
    moved = vocab.to("meta")  # (a device without data: what a GPU run gets, on any machine)
    assert {getattr(moved, name).device.type for name in ["kind", "sign", "v_sparse", "v_frequent",
                                                          "v_irrelevant"]} == {"meta"}
    assert vocab.kind.device.type == "cpu" and moved.d == vocab.d  # a copy: the vocabulary itself stays


def test_candidate_sensitivities_match_hand_computation():
    """|S|=1, |F|=2, |R|=2 (d=8), n=5, n_s=1, n_f=2, alpha=1. Replacing one token by a uniform vocabulary token:
    - sparse vote (margin 1): the sparse slot flips unless the new token is S_y (7/8); each of the 4 other slots flips
      if the new token is S_-y (1/8): (7/8 + 4/8) / 5 = 0.275.
    - frequent vote (margin 2): an F_y slot flips (ties) if the new token is F_-y (2/8), no other slot can flip:
      2 * (2/8) / 5 = 0.1."""
    vocab = synthetic.Vocab(1, 2, 2)
    onehot = torch.eye(vocab.d)
    ids, _ = synthetic.make_data(vocab, n=5, n_sparse=1, n_frequent=2, alpha=1.0, size=500,
                                 generator=torch.Generator().manual_seed(0))
    x = onehot[ids]
    for kind, expected in [(0, 0.275), (1, 0.1)]:
        s = sensitivity(synthetic.vote_classifier(vocab, kind), x, replace(onehot), reps=40,
                        seed=kind)
        se = math.sqrt(expected * (1 - expected) / (500 * 5 * 40))
        assert abs(s.mean - expected) < 4 * se, (kind, s.mean, expected)


def test_preset_orderings_match_the_formula():
    """The presets' candidate sensitivities, from the formula of the docstring above with d = 44, n = 20:
    sparse-lower: sparse 0, frequent (5 (1 - 10/44) + 11 * 10/44) / 20; frequent-lower: frequent 0, sparse
    (1 - 2/44 + 19 * 2/44) / 20."""
    vocab = synthetic.Vocab(2, 10, 20)
    onehot = torch.eye(vocab.d)
    for case, low, high, expected in [("sparse-lower", 0, 1, (5 * (1 - 10 / 44) + 11 * 10 / 44) / 20),
                                      ("frequent-lower", 1, 0, (1 - 2 / 44 + 19 * 2 / 44) / 20)]:
        ids, _ = synthetic.make_data(vocab, n=20, size=400, generator=torch.Generator().manual_seed(1),
                                     **synthetic.CASES[case])
        s_low = sensitivity(synthetic.vote_classifier(vocab, low), onehot[ids], replace(onehot), reps=5)
        s_high = sensitivity(synthetic.vote_classifier(vocab, high), onehot[ids], replace(onehot), reps=5)
        assert s_low.mean == 0
        assert abs(s_high.mean - expected) < 0.02, (case, s_high.mean, expected)


def test_model_shapes_and_head():
    """The shapes, attention rows that sum to 1, and every weight drawn from N(0, init_std^2) (Eq. 3's small
    initialisation)."""
    torch.manual_seed(0)
    for std in [0.1, 0.01]:
        model = synthetic.AttentionClassifier(44, 40, std)
        weights = [model.W, model.W_V, model.theta]
        assert [tuple(w.shape) for w in weights] == [(44, 44), (44, 40), (40,)]
        assert [w.std().item() / std for w in weights] == pytest.approx([1, 1, 1], abs=0.3)  # theta: 40 draws
    model = synthetic.AttentionClassifier(44, 8, 0.1)
    x = torch.eye(44)[torch.randint(44, (7, 20))]
    assert model(x).shape == (7,)
    att = model.attention(x)
    assert att.shape == (7, 20, 20) and torch.allclose(att.sum(-1), torch.ones(7, 20))
    assert model.head_in_token_space().shape == (44,)


def test_bad_sizes_are_rejected():
    for argv in [["--alpha", "0.3"], ["--n", "5", "--n-frequent", "9"], ["--alpha", "0.6", "--n-frequent", "9"],
                 ["--lr", "-1"], ["--n-sens", "10", "--n-train", "5"]]:
        with pytest.raises(SystemExit):
            synthetic.parse_args(argv)


@pytest.mark.slow
def test_end_to_end(tmp_path, capsys, monkeypatch):
    """A 4-step run of both presets writes metrics.json with the documented keys, evaluations every --eval-every
    steps and at the end (the progress lines told which steps evaluate, whose times report.py --times splits), and
    the figure, and prints the summary; report.py redraws it and says where."""
    calls = loop_calls(monkeypatch)
    args = synthetic.parse_args(["--steps", "4", "--eval-every", "3", "--seeds", "0", "1", "--n-train", "200",
                                 "--n-test", "100", "--n-sens", "50", "--out-dir", str(tmp_path)])
    data = synthetic.main(args)
    printed = capsys.readouterr().out  # the run ends with the summary report.py prints (the README's quick start)
    assert "\nsparse-lower (2 seeds) | ood_acc " in printed and "\nfrequent-lower (2 seeds) | ood_acc " in printed
    folder = tmp_path / "synthetic" / "cases"
    on_disk = json.loads((folder / "metrics.json").read_text())
    assert on_disk["runs"].keys() == data["runs"].keys() == {
        "sparse-lower/seed0", "sparse-lower/seed1", "frequent-lower/seed0", "frequent-lower/seed1"}
    final = on_disk["runs"]["sparse-lower/seed0"]["final"]
    for key in ["sens", "sens_stderr", "train_acc", "test_acc", "ood_acc", "sens_sparse_fn", "sens_frequent_fn",
                "align_sparse", "align_frequent", "align_irrelevant"]:
        assert isinstance(final[key], float), key
    assert final["sens_sparse_fn"] == 0 and final["sens_frequent_fn"] > 0.2
    assert [h["step"] for h in on_disk["runs"]["sparse-lower/seed0"]["history"]] == [0, 3, 4]
    told = [(0, True), (1, False), (2, False), (3, True), (4, True)] * 4  # two presets, two seeds
    assert calls["progress"] == [(0, 4, 3)] * 4  # from step 0, 4 steps, evaluating every 3
    assert calls["tick"] == told and calls["checkpoint"] == [(*t, 0) for t in told]  # --save-every 0: at evaluations
    seconds = on_disk["runs"]["sparse-lower/seed0"]["seconds"]
    assert seconds["training"] > 0 and seconds["evaluations"] > 0  # every step timed (report.py --times reads it)
    assert os.path.getsize(folder / "synthetic.png") > 10_000
    os.remove(folder / "synthetic.png")
    capsys.readouterr()
    report.main(report.parse_args([str(folder)]))  # redrawn from metrics.json alone
    assert os.path.getsize(folder / "synthetic.png") > 10_000
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {folder / 'synthetic.png'}"


def test_training_and_its_measurements_replay_by_hand(tmp_path, capsys, monkeypatch):
    """Two SGD steps of one run, replayed here from the flags: the same minibatches (the order generator seeded
    with --seeds), the mean logistic loss, fresh gradients each step, so the same training loss at steps 1 and 2;
    the model's sensitivity with --reps and the seed 10,000 + seed at every evaluation, the two candidate functions'
    with --reps and the seed itself. A sum in place of the mean, a missing zero_grad or another seed or reps fails.
    Each evaluation records its time since the run started and prints its line."""
    argv = ["--case", "frequent-lower", "--steps", "2", "--eval-every", "1", "--seeds", "3", "--reps", "3",
            "--lr", "0.2", "--n-train", "200", "--n-test", "50", "--n-sens", "40", "--out-dir", str(tmp_path)]
    args = synthetic.parse_args(argv)
    stepped = optimizer_steps(monkeypatch, torch.optim.SGD)  # 2, none after the last evaluation
    t0 = time.time()
    run = synthetic.main(args)["runs"]["frequent-lower/seed3"]
    wall = time.time() - t0
    monkeypatch.undo()
    assert len(stepped) == 2
    times = [h["time"] for h in run["history"]]  # seconds since the run started, at each evaluation
    assert 0 <= times[0] <= times[1] <= times[2] <= wall
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("frequent-lower/seed3 step ")]
    assert len(lines) == len(times) and all(" | sens " in line for line in lines)

    [(_, sizes)] = synthetic.settings(args)
    vocab = synthetic.Vocab(args.sparse_set, args.frequent_set, args.irrelevant_set)
    onehot = torch.eye(vocab.d)
    sets = synthetic.make_sets(vocab, args, sizes)
    (ids, y), sens_x = sets["train"], onehot[sets["train"][0][:40]]
    seed_all(3)
    model = synthetic.AttentionClassifier(vocab.d, args.dim_head, args.init_std)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    order = torch.Generator().manual_seed(3)
    for step in [1, 2]:
        b = torch.randint(200, (args.batch_size,), generator=order)
        opt.zero_grad()
        torch.nn.functional.softplus(-y[b] * model(onehot[ids[b]])).mean().backward()
        opt.step()
        row = run["history"][step]
        assert row["step"] == step
        assert row["train_loss"] == synthetic.evaluate(model, vocab, onehot, sets, sens_x)["train_loss"]
    assert run["history"][1]["train_loss"] != run["history"][2]["train_loss"]  # the model moved at each step
    with torch.no_grad():
        own = sensitivity(lambda xb, idx: model(xb), sens_x, replace(onehot), reps=3, seed=10_003)
    assert (run["final"]["sens"], run["final"]["sens_stderr"]) == (own.mean, own.stderr)
    for kind, name in [(0, "sparse"), (1, "frequent")]:
        cand = sensitivity(synthetic.vote_classifier(vocab, kind), sens_x, replace(onehot), reps=3, seed=3)
        assert run["final"][f"sens_{name}_fn"] == cand.mean
    # not vacuous: the sensitivities move with the seed and the number of replacements (in this case the sparse
    # vote is the sensitive candidate)
    for f, key in [(synthetic.vote_classifier(vocab, 0), "sens_sparse_fn"), (lambda xb, idx: model(xb), "sens")]:
        with torch.no_grad():
            other = [sensitivity(f, sens_x, replace(onehot), reps=r, seed=s).mean
                     for r, s in [(2, 3), (2, 10_003), (3, 4), (3, 10_004), (3, 3), (3, 10_003)]]
        assert len(set(other)) == len(other) and run["final"][key] in other


def test_evaluate_gives_the_known_accuracy_loss_alignment_and_attention_mass():
    """A model whose head in token space is v_sparse and whose key-query matrix is 0 (uniform attention): it scores
    the sparse vote, so it is right on every test sequence and wrong on every OOD one; its alignments are 1 with
    v_sparse and 0 with the others; the attention mass on each kind is that kind's share of the n tokens; the loss is
    the mean softplus(-y * score)."""
    vocab = synthetic.Vocab(2, 10, 20)
    onehot = torch.eye(vocab.d)
    args = synthetic.parse_args(["--n-train", "300", "--n-test", "200", "--n-sens", "100"])
    sets = synthetic.make_sets(vocab, args, dict(n=20, **synthetic.CASES["sparse-lower"]))
    model = synthetic.AttentionClassifier(vocab.d, vocab.d, 0.1)
    with torch.no_grad():
        model.W.zero_()
        model.W_V.copy_(torch.eye(vocab.d))
        model.theta.copy_(vocab.v_sparse)
    sens_x = onehot[sets["train"][0][:100]]
    row = synthetic.evaluate(model, vocab, onehot, sets, sens_x)
    assert row["train_acc"] == row["test_acc"] == 1.0 and row["ood_acc"] == 0.0
    assert row["align_sparse"] == pytest.approx(1.0) and abs(row["align_frequent"]) < 1e-6
    assert abs(row["align_irrelevant"]) < 1e-6
    assert [row[f"att_{k}"] for k in ["sparse", "frequent", "irrelevant"]] == pytest.approx([3 / 20, 9 / 20, 8 / 20])
    ids, y = sets["train"]
    score = synthetic.vote(vocab, ids, 0).float() / 20  # the sparse vote, averaged over the 20 queries' means
    assert row["train_loss"] == pytest.approx(torch.nn.functional.softplus(-y * score).mean().item(), rel=1e-5)


def test_the_data_depend_only_on_data_seed():
    """--seeds changes initialisation and order, never the data: make_sets reads --data-seed alone."""
    vocab = synthetic.Vocab(2, 10, 20)
    sizes = dict(n=20, **synthetic.CASES["sparse-lower"])
    a = synthetic.make_sets(vocab, synthetic.parse_args(["--seeds", "0"]), sizes)
    b = synthetic.make_sets(vocab, synthetic.parse_args(["--seeds", "5"]), sizes)
    c = synthetic.make_sets(vocab, synthetic.parse_args(["--data-seed", "7"]), sizes)
    assert all(torch.equal(a[k][0], b[k][0]) and torch.equal(a[k][1], b[k][1]) for k in a)
    assert not torch.equal(a["train"][0], c["train"][0])
    g = torch.Generator().manual_seed(1234)  # one generator, drawn for train, test and OOD in that order
    drawn = [synthetic.make_data(vocab, size=n, generator=g, ood=ood, **sizes)
             for n, ood in [(4000, False), (2000, False), (2000, True)]]
    assert all(torch.equal(u, v) for k, d in zip(a, drawn) for u, v in zip(a[k], d))


@pytest.mark.slow
def test_a_short_run_learns_the_less_sensitive_feature(tmp_path):
    """300 SGD steps: in sparse-lower the model relies on the sparse tokens (OOD accuracy near 0), in frequent-lower
    on the frequent ones (OOD accuracy near 1); either way its sensitivity ends below the more sensitive candidate's."""
    argv = ["--steps", "300", "--eval-every", "150", "--seeds", "0", "--n-sens", "200", "--out-dir", str(tmp_path)]
    data = synthetic.main(synthetic.parse_args(argv))
    sparse, frequent = data["runs"]["sparse-lower/seed0"]["final"], data["runs"]["frequent-lower/seed0"]["final"]
    assert sparse["test_acc"] > 0.95 and sparse["ood_acc"] < 0.1
    assert frequent["test_acc"] > 0.95 and frequent["ood_acc"] > 0.9
    assert sparse["sens"] < sparse["sens_frequent_fn"] - 0.1 and frequent["sens"] < frequent["sens_sparse_fn"] - 0.05


def test_claim_holds_where_every_seed_learns_the_less_sensitive_feature(capsys):
    """report.synthetic_claim: per preset and setting, mean +- s.e. over seeds (the mean alone for one seed), then the
    count of settings where every seed's OOD accuracy shows the feature (0: sparse, 1: frequent) whose candidate
    function is the less sensitive one, and that function is indeed below the other."""
    import report

    def runs(**settings):  # {label: [final of each seed]}
        return {"script": "synthetic", "runs": {f"{label}/seed{s}": {"model": label.replace("_", "-"), "seed": s,
                                                                      "history": [], "final": f}
                                                for label, finals in settings.items() for s, f in enumerate(finals)}}

    held = runs(sparse_lower=[synthetic_final(0.0, 0.0, 0.3), synthetic_final(0.0, 0.0, 0.32)],
                frequent_lower=[synthetic_final(1.0, 0.09, 0.0)])
    report.synthetic_claim(held)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("sparse-lower (2 seeds) | ood_acc 0.000 +- 0.000 | test_acc 1.000 +- 0.000 |")
    assert out[0].endswith("sens_frequent_fn 0.310 +- 0.010")  # the standard error over seeds, 0.02 / 2
    assert out[1].startswith("frequent-lower (1 seed) | ood_acc 1.000 | test_acc 1.000 |")
    assert out[-1] == "the model learns the lower-sensitivity feature in every seed in 2 of 2 settings"
    # one seed learned the other feature; the 'lower' candidate is not lower; no finished seed
    for broken in [runs(sparse_lower=[synthetic_final(0.0, 0.0, 0.3), synthetic_final(1.0, 0.0, 0.3)]),
                   runs(sparse_lower=[synthetic_final(0.0, 0.4, 0.3)]),
                   runs(sparse_lower=[{}])]:
        report.synthetic_claim(broken)
        assert capsys.readouterr().out.splitlines()[-1].endswith(" in 0 of 1 settings")


def test_sizes_at_their_edges_and_the_fig12_settings():
    """On their bounds, n_s + n_f = n (no irrelevant token), alpha = 1, --n-sens = --n-train and one-hot sets just
    under 4 GB are accepted; alpha = 0.5 (the frequent vote would tie), alpha * n_f 0.05 off a whole number and one
    sequence more than fits in 4 GB are refused, and so are no sparse or no frequent slot and more slots than n.
    alpha * n_f = 0.58 * 50 = 28.999999999999996 is 29 tokens of F_y.
    --fig12 adds three settings per case, each named by what it changes."""
    for argv in [["--n", "12"], ["--alpha", "1", "--n-frequent", "9"], ["--n-sens", "4000"],
                 ["--n-train", "1220161"]]:  # 1,220,161 sequences of 20 one-hot tokens of width 44: 2^32 - 576 bytes
        synthetic.parse_args(argv)
    for argv in [["--alpha", "0.5", "--n-frequent", "10"], ["--alpha", "0.55", "--n-frequent", "9"],
                 ["--n-train", "1220162"]]:
        with pytest.raises(SystemExit):
            synthetic.parse_args(argv)
    for sizes in [dict(n_sparse=0), dict(n_frequent=0), dict(n_sparse=3, n_frequent=10)]:  # a preset edited by hand
        with pytest.raises(ValueError, match="need n_s >= 1, n_f >= 1 and n_s"):
            synthetic.check_sizes({"n": 12, "n_sparse": 1, "n_frequent": 10, "alpha": 1.0, **sizes})
    vocab = synthetic.Vocab(2, 10, 20)
    ids, y = synthetic.make_data(vocab, n=60, n_sparse=3, n_frequent=50, alpha=0.58, size=50,
                                 generator=torch.Generator().manual_seed(0))
    assert ((vocab.kind[ids] == 1) & (vocab.sign[ids] == y[:, None])).sum(1).eq(29).all()
    labels = [label for label, _ in synthetic.settings(synthetic.parse_args(["--fig12"]))]
    assert labels == ["sparse-lower", "sparse-lower:n=30", "sparse-lower:n_sparse=4",
                      "sparse-lower:n_frequent=7,alpha=0.571", "frequent-lower", "frequent-lower:n=30",
                      "frequent-lower:n_frequent=8", "frequent-lower:alpha=0.9"]


def test_a_zero_score_predicts_minus_and_the_attention_mass_is_over_keys():
    """A score of exactly 0 predicts label -; the attention mass of a kind is what the queries give to keys of that
    kind: a key-query matrix that favours the sparse tokens as keys puts almost all of it there, although only 3 of
    the 20 queries are sparse tokens."""
    vocab = synthetic.Vocab(2, 10, 20)
    onehot = torch.eye(vocab.d)
    args = synthetic.parse_args(["--n-train", "300", "--n-test", "200", "--n-sens", "100"])
    sets = synthetic.make_sets(vocab, args, dict(n=20, **synthetic.CASES["sparse-lower"]))
    model = synthetic.AttentionClassifier(vocab.d, 4, 0.1)
    with torch.no_grad():
        model.theta.zero_()  # every score 0
        model.W.zero_()
        model.W[:, :4] = 20.0  # every query, whatever its token, scores the 4 sparse ids high as keys
    row = synthetic.evaluate(model, vocab, onehot, sets, onehot[sets["train"][0][:100]])
    for name in ["train", "test", "ood"]:
        assert row[f"{name}_acc"] == (sets[name][1] == -1).float().mean().item()
    assert row["att_sparse"] > 0.99 and row["att_frequent"] + row["att_irrelevant"] < 0.01


def test_the_summary_has_a_line_per_case_with_finished_seeds(capsys):
    """report.py's summary of a synthetic run: per case, the mean +- s.e. over its finished seeds; no line for a
    case none of whose seeds has finished (a run stopped early)."""
    import report

    keys = ["ood_acc", "test_acc", "align_sparse", "align_frequent", "sens", "sens_sparse_fn", "sens_frequent_fn"]
    final = dict.fromkeys(keys, 0.5)
    runs = {"sparse-lower/seed0": {"history": [], "final": final},
            "sparse-lower/seed1": {"history": [], "final": dict(final, ood_acc=1.0)},
            "frequent-lower/seed0": {"history": [{"step": 0}], "final": {}}}
    report.summary({"script": "synthetic", "runs": runs})
    out = capsys.readouterr().out
    assert "sparse-lower (2 seeds) | ood_acc 0.750 +- 0.250 | test_acc 0.500 +- 0.000 | align_sparse" in out
    assert "frequent-lower" not in out
