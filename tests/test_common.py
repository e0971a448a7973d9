"""The estimator in common.py against answers known in closed form, and the plumbing every script shares."""

import json
import math
import os

import pytest
import torch

from common import (Results, flip, gaussian, load_results, new_run_dir, patchify, replace, sensitivity, unpatchify,
                    write_json)


def threshold_model(k):
    """Class 1 iff x[:, k, 0] > 0, as two logits."""
    return lambda xb, idx: torch.stack([torch.zeros(len(xb)), xb[:, k, 0]], dim=1)


def parity_model(bits):
    """Label (product of the chosen +-1 bits > 0) of (B, n, 1) inputs."""
    return lambda xb, idx: (xb[:, bits, 0].prod(1) > 0).long()


def phi(z):
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def test_threshold_flip_rate_matches_gaussian_tail():
    """Flip probability of a threshold at distance a under N(0, sigma^2) noise is Phi(-a/sigma), at position k only."""
    N, T, D, k, a, sigma, reps = 500, 6, 3, 2, 0.4, 0.8, 20
    x = torch.randn(N, T, D, generator=torch.Generator().manual_seed(0))
    x[:, k, 0] = a
    g = torch.Generator().manual_seed(1)
    s = sensitivity(threshold_model(k), x, gaussian(sigma), reps=reps, batch_size=1000, generator=g)
    p = phi(-a / sigma)
    se = math.sqrt(p * (1 - p) / (N * reps))
    assert abs(s.per_position[k].item() - p) < 4 * se
    others = torch.cat([s.per_position[:k], s.per_position[k + 1:]])
    assert torch.equal(others, torch.zeros(T - 1))
    assert s.mean == pytest.approx(s.per_position[k].item() / T, rel=1e-6)
    assert s.evaluations == N * T * reps
    assert s.per_input.shape == (N,) and s.per_position.shape == (T,)


@pytest.mark.parametrize("n,bits", [(8, [1]), (10, [0, 4, 9]), (12, [2, 3, 5, 7, 11])])
def test_sparse_parity_has_boolean_sensitivity_k(n, bits):
    """A k-sparse parity flips on every one of its k bits and on no other: mean exactly k/n, per input too."""
    x = torch.randint(0, 2, (64, n, 1), generator=torch.Generator().manual_seed(0)).float() * 2 - 1
    s = sensitivity(parity_model(bits), x, flip(), batch_size=100)
    assert s.mean == len(bits) / n
    assert s.stderr == 0
    expected = torch.zeros(n)
    expected[bits] = 1
    assert torch.equal(s.per_position, expected)
    assert torch.equal(s.per_input, torch.full((64,), len(bits) / n))


def test_constant_model_has_zero_sensitivity():
    x = torch.randn(40, 5, 4)
    s = sensitivity(lambda xb, idx: torch.ones(len(xb), 3), x, gaussian(10.0), reps=3)
    assert s.mean == 0 and s.stderr == 0
    assert torch.equal(s.per_position, torch.zeros(5))


def test_masked_positions_are_never_perturbed():
    """f sees only copies that differ from their clean row (found through idx) in one valid position at most."""
    N, T, D = 30, 7, 2
    x = torch.randn(N, T, D)
    lengths = torch.randint(1, T + 1, (N,), generator=torch.Generator().manual_seed(0))
    lengths[0] = T - 2  # the last two positions are valid nowhere
    lengths[lengths > T - 2] = T - 2
    mask = torch.arange(T) < lengths[:, None]

    def f(xb, idx):
        changed = (xb != x[idx]).any(-1)  # (B, T)
        assert (changed.sum(1) <= 1).all()
        assert not (changed & ~mask[idx]).any()
        return (xb.sum((1, 2)) > 0).long()  # sensitive to every position

    for positions in [None, 3]:
        s = sensitivity(f, x, gaussian(5.0), mask=mask, positions=positions, reps=2, batch_size=17)
        assert torch.isnan(s.per_position[T - 2:]).all()
        assert not torch.isnan(s.per_position[:T - 2]).any()
        assert s.mean > 0


def test_mean_is_average_over_each_inputs_valid_positions():
    """With a parity on bit 0 and inputs of different lengths, input n has sensitivity exactly 1 / length_n."""
    lengths = torch.tensor([1, 2, 4, 5])
    x = torch.ones(4, 5, 1)
    mask = torch.arange(5) < lengths[:, None]
    s = sensitivity(parity_model([0]), x, flip(), mask=mask)
    assert torch.allclose(s.per_input, 1 / lengths.float())
    assert s.mean == pytest.approx((1 / lengths.float()).mean().item())
    assert s.evaluations == int(lengths.sum())


def test_sampled_positions_agree_with_exact():
    """positions=k is unbiased: it agrees with the all-positions estimate within the errors of both."""
    N, T = 400, 10
    x = torch.randn(N, T, 1, generator=torch.Generator().manual_seed(0))
    f = lambda xb, idx: (xb[:, :4, 0].sum(1) > 0).long()  # reads the first 4 tokens
    exact = sensitivity(f, x, gaussian(1.0), reps=4, generator=torch.Generator().manual_seed(1))
    sampled = sensitivity(f, x, gaussian(1.0), positions=3, reps=4, generator=torch.Generator().manual_seed(2))
    assert sampled.evaluations == N * 3 * 4
    assert abs(exact.mean - sampled.mean) < 4 * math.hypot(exact.stderr, sampled.stderr)
    assert exact.mean > 0.02  # the check above is not vacuous


def test_batch_size_does_not_change_the_answer():
    x = torch.randint(0, 2, (50, 9, 1)).float() * 2 - 1
    a = sensitivity(parity_model([0, 3]), x, flip(), batch_size=7)
    b = sensitivity(parity_model([0, 3]), x, flip(), batch_size=10_000)
    assert a.mean == b.mean and torch.equal(a.per_position, b.per_position)

    x = torch.randn(300, 6, 2, generator=torch.Generator().manual_seed(0))
    f = lambda xb, idx: (xb[:, :, 0].sum(1) > 0).long()
    a = sensitivity(f, x, gaussian(0.5), reps=3, batch_size=13, generator=torch.Generator().manual_seed(1))
    b = sensitivity(f, x, gaussian(0.5), reps=3, batch_size=5000, generator=torch.Generator().manual_seed(2))
    assert abs(a.mean - b.mean) < 4 * math.hypot(a.stderr, b.stderr)


def test_f_never_sees_more_than_one_chunk():
    """Memory is bounded by batch_size: f is called on at most batch_size rows whatever N*T*reps is."""
    seen = []
    f = lambda xb, idx: seen.append(len(xb)) or (xb[:, 0, 0] > 0).long()
    s = sensitivity(f, torch.randn(100, 20, 2), gaussian(1.0), reps=5, batch_size=64)
    assert max(seen) == 64 and s.evaluations == 100 * 20 * 5


def test_fixed_generator_is_reproducible():
    x = torch.randn(60, 8, 3)
    f = lambda xb, idx: xb.sum(1)  # 3 logits
    runs = [sensitivity(f, x, gaussian(0.3), positions=2, reps=2, generator=torch.Generator().manual_seed(7))
            for _ in range(2)]
    assert runs[0].mean == runs[1].mean and torch.equal(runs[0].per_input, runs[1].per_input)


def test_replace_draws_rows_of_the_vocabulary():
    """Replacing with a uniform one-hot token: a model reading token 0's first coordinate flips w.p. (V-1)/V."""
    V, N, reps = 4, 300, 10
    vocab = torch.eye(V)
    x = vocab[torch.zeros(N, 3, dtype=torch.long)]  # every token is e_0
    f = lambda xb, idx: (xb[:, 0, 0] > 0.5).long()
    s = sensitivity(f, x, replace(vocab), reps=reps, generator=torch.Generator().manual_seed(0))
    p = (V - 1) / V
    assert abs(s.per_position[0].item() - p) < 4 * math.sqrt(p * (1 - p) / (N * reps))
    assert torch.equal(s.per_position[1:], torch.zeros(2))


def test_patchify_layout_and_round_trip():
    images = torch.randn(3, 2, 12, 8)
    tokens = patchify(images, 4)
    assert tokens.shape == (3, 6, 2 * 16)
    assert torch.equal(tokens[:, 0], images[:, :, :4, :4].flatten(1))  # top-left patch first
    assert torch.equal(tokens[:, 1], images[:, :, :4, 4:8].flatten(1))  # then along the row
    assert torch.equal(unpatchify(tokens, 4, (2, 12, 8)), images)


@pytest.mark.parametrize("call", [
    lambda: gaussian(-0.1),
    lambda: gaussian(float("nan")),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), mask=torch.ones(4, 2, dtype=bool)),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(0, 3, 2), gaussian(1)),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), reps=0),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), positions=0),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), mask=torch.zeros(4, 3, dtype=bool)),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 6), gaussian(1)),
    lambda: patchify(torch.randn(1, 3, 32, 32), 5),
    lambda: unpatchify(torch.randn(1, 64, 48), 4, (3, 32, 30)),
    lambda: replace(torch.randn(5)),
])
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_results_file_shape_and_atomic_rewrite(tmp_path):
    res = Results(str(tmp_path), {"lr": 0.1}, "cpu")
    res.log("vit/seed0", {"epoch": 0, "sens": 0.5})
    res.final("vit/seed0", {"sens": 0.4, "sens_stderr": 0.01})
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["args"] == {"lr": 0.1} and data["env"]["device"] == "cpu"
    run = data["runs"]["vit/seed0"]
    assert run == {"history": [{"epoch": 0, "sens": 0.5}], "final": {"sens": 0.4, "sens_stderr": 0.01}}
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


def test_run_dir_is_never_reused(tmp_path):
    a = new_run_dir("vision", "vit", out_dir=str(tmp_path))
    b = new_run_dir("vision", "vit", out_dir=str(tmp_path))
    assert a != b and b.endswith("vit-2") and os.path.isdir(a) and os.path.isdir(b)
