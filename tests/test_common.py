"""The estimator in common.py against answers known in closed form."""

import math
import re
import types
import warnings

import pytest
import torch

from common import (chunk_seed, default_batch_size, flip, gaussian, paired_differences, patchify, replace, sensitivity,
                    sensitivity_counts, summarise, unpatchify)


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
    s = sensitivity(threshold_model(k), x, gaussian(sigma), reps=reps, batch_size=1000, seed=1)
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


def test_gaussian_noise_is_drawn_in_the_tokens_dtype():
    """The perturbed tokens keep their dtype (a bfloat16 model gets bfloat16 copies, not float32 ones), and the noise
    has std sigma in each dtype."""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        out = gaussian(2.0)(torch.ones(20000, 4, dtype=dtype), g)
        assert out.dtype == dtype
        assert abs(out.double().std().item() - 2.0) < 0.05 and abs(out.double().mean().item() - 1) < 0.05


def test_float64_inputs_stay_float64_in_every_copy():
    """x of float64 (what torch.from_numpy gives): the model gets float64 copies (none rounded to float32, where
    1e-50 would be 0), and a sign flip of token 0 changes the sign read from it: every input flips at position 0."""
    x = torch.tensor([1.0, -1.0, 2.0, -2.0, 1e-50, -3.0], dtype=torch.float64)[:, None, None].repeat(1, 3, 1)
    seen = []
    f = lambda xb, i: seen.append(xb.dtype) or xb[:, 0, 0] > 0
    s = sensitivity(f, x, lambda tokens, g: -tokens, batch_size=4)
    assert set(seen) == {torch.float64} and s.mean == pytest.approx(1 / 3) and s.per_position.tolist() == [1, 0, 0]


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
    exact = sensitivity(f, x, gaussian(1.0), reps=4, seed=1)
    sampled = sensitivity(f, x, gaussian(1.0), positions=3, reps=4, seed=2)
    assert sampled.evaluations == N * 3 * 4
    assert abs(exact.mean - sampled.mean) < 4 * math.hypot(exact.stderr, sampled.stderr)
    assert exact.mean > 0.02  # the check above is not vacuous


def test_sampled_positions_are_uniform_over_each_rows_valid_positions():
    """positions=k draws each copy's position uniformly among its own row's valid positions: with rows of 1, 2 or 3
    valid positions out of 10, every valid position of a row of length L gets k/L of its draws (not the padding's
    share, nor a pile-up on the last valid one)."""
    N, T, k = 300, 10, 60
    lengths = 1 + torch.arange(N) % 3
    mask = torch.arange(T) < lengths[:, None]
    _, trials, _ = sensitivity_counts(lambda xb, idx: torch.zeros(len(xb), dtype=torch.long), torch.zeros(N, T, 1),
                                      gaussian(1.0), mask=mask, positions=k, seed=0)
    assert torch.equal(trials.sum(1), torch.full((N,), k)) and not trials[~mask].any()
    for L in [2, 3]:
        rows = trials[lengths == L][:, :L].sum(0).double()  # draws at each valid position, summed over the rows
        n = rows.sum()
        assert ((rows - n / L).abs() < 5 * (n * (1 / L) * (1 - 1 / L)).sqrt()).all(), (L, rows)


def test_batch_size_does_not_change_the_answer():
    """The same answer for any chunk size, and no warning: the last chunk (450 copies in chunks of 7 leave 2) takes
    the front of the chunk buffer, as index_select's out= must have the result's shape (torch resizes a larger one,
    with a deprecation warning)."""
    x = torch.randint(0, 2, (50, 9, 1)).float() * 2 - 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = sensitivity(parity_model([0, 3]), x, flip(), batch_size=7)
    b = sensitivity(parity_model([0, 3]), x, flip(), batch_size=10_000)
    assert a.mean == b.mean and torch.equal(a.per_position, b.per_position)

    x = torch.randn(300, 6, 2, generator=torch.Generator().manual_seed(0))
    f = lambda xb, idx: (xb[:, :, 0].sum(1) > 0).long()
    a = sensitivity(f, x, gaussian(0.5), reps=3, batch_size=13, seed=1)
    b = sensitivity(f, x, gaussian(0.5), reps=3, batch_size=5000, seed=2)
    assert abs(a.mean - b.mean) < 4 * math.hypot(a.stderr, b.stderr)


def test_f_never_sees_more_than_one_chunk():
    """Memory is bounded by batch_size: f is called on at most batch_size rows whatever N*T*reps is."""
    seen = []
    f = lambda xb, idx: seen.append(len(xb)) or (xb[:, 0, 0] > 0).long()
    s = sensitivity(f, torch.randn(100, 20, 2), gaussian(1.0), reps=5, batch_size=64)
    assert max(seen) == 64 and s.evaluations == 100 * 20 * 5


def test_fixed_seed_is_reproducible():
    """The same seed gives the same noise (for gaussian and replace), another seed other noise."""
    x = torch.randn(60, 8, 3)
    f = lambda xb, idx: xb.sum(1)  # 3 logits
    vocab = torch.randn(5, 3)
    for perturb in [gaussian(0.3), replace(vocab)]:
        runs = [sensitivity(f, x, perturb, positions=2, reps=2, seed=s) for s in [7, 7, 8]]
        assert runs[0].mean == runs[1].mean and torch.equal(runs[0].per_input, runs[1].per_input)
        assert not torch.equal(runs[0].per_input, runs[2].per_input)


def test_no_seed_draws_one_from_the_global_generator():
    """seed=None: the noise follows torch's global generator (the same under the same torch.manual_seed) and is new
    at every call: 60 global seeds, 60 different noises (a seed drawn from a small range would repeat)."""
    x = torch.randn(64, 1, 1, generator=torch.Generator().manual_seed(0))
    f = lambda xb, idx: torch.cat([xb[:, 0], -xb[:, 0]], 1)  # the sign of x: flips where the noise crosses 0

    def drawn(k):
        torch.manual_seed(k)
        return tuple(sensitivity(f, x, gaussian(1.0)).per_input.tolist())
    with torch.random.fork_rng():
        assert drawn(3) == drawn(3)
        assert len({drawn(k) for k in range(60)}) == 60


def test_predict_reads_every_form_of_output():
    """argmax of (B, C >= 2) logits (not argmin: with 3 classes they differ), score > 0 for (B, 1) and float (B,)
    (0 is class 0), integer and bool labels as they are."""
    from common import predict

    assert predict(torch.tensor([[0.0, 2.0, 1.0], [3.0, -1.0, 0.0]]), 2).tolist() == [1, 0]
    assert predict(torch.tensor([[0.5], [0.0], [-2.0]]), 3).tolist() == [True, False, False]
    assert predict(torch.tensor([0.5, 0.0, -2.0]), 3).tolist() == [True, False, False]
    assert predict(torch.tensor([2, 0, 1]), 3).tolist() == [2, 0, 1]
    assert predict(torch.tensor([True, False]), 2).tolist() == [True, False]


def test_replace_draws_rows_of_the_vocabulary():
    """Replacing with a uniform one-hot token: a model reading token 0's first coordinate flips w.p. (V-1)/V."""
    V, N, reps = 4, 300, 10
    vocab = torch.eye(V)
    x = vocab[torch.zeros(N, 3, dtype=torch.long)]  # every token is e_0
    f = lambda xb, idx: (xb[:, 0, 0] > 0.5).long()
    s = sensitivity(f, x, replace(vocab), reps=reps, seed=0)
    p = (V - 1) / V
    assert abs(s.per_position[0].item() - p) < 4 * math.sqrt(p * (1 - p) / (N * reps))
    assert torch.equal(s.per_position[1:], torch.zeros(2))


def test_patchify_layout_and_round_trip():
    images = torch.randn(5, 3, 24, 8)  # batch 5, 3 channels, 6 x 2 patches of 4 x 4: no two sizes equal
    tokens = patchify(images, 4)
    assert tokens.shape == (5, 12, 3 * 16)
    assert torch.equal(tokens[:, 0], images[:, :, :4, :4].flatten(1))  # top-left patch first
    assert torch.equal(tokens[:, 1], images[:, :, :4, 4:8].flatten(1))  # then along the row
    assert torch.equal(unpatchify(tokens, 4, (3, 24, 8)), images)


@pytest.mark.parametrize("call", [
    lambda: gaussian(-0.1),
    lambda: gaussian(float("nan")),
    lambda: gaussian(float("inf")),
    lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), batch_size=0),
    lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), batch_size=-2),
    lambda: sensitivity(lambda xb, i: xb[:1, 0], torch.randn(4, 3, 2), gaussian(1)),  # wrong number of rows
    lambda: sensitivity(lambda xb, i: xb, torch.randn(4, 3, 2), gaussian(1)),  # (B, T, D): not a prediction
    lambda: sensitivity(lambda xb, i: xb[:, :, :0].sum(-1)[:, :0], torch.randn(4, 3, 2), gaussian(1)),  # (B, 0)
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), mask=torch.ones(4, 2, dtype=bool)),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), reps=0),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), positions=0),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 3, 2), gaussian(1), mask=torch.zeros(4, 3, dtype=bool)),
    lambda: sensitivity(lambda xb, i: xb[:, 0], torch.randn(4, 6), gaussian(1)),
    lambda: patchify(torch.randn(1, 3, 32, 32), 5),
    lambda: patchify(torch.randn(1, 3, 32, 30), 4),  # the height divides, the width does not
    lambda: unpatchify(torch.randn(1, 64, 48), 4, (3, 32, 30)),
    lambda: unpatchify(torch.randn(1, 64, 47), 4, (3, 32, 32)),  # 64 patches, but not of 3 * 4 * 4 values
    lambda: replace(torch.randn(5)),
    lambda: replace(torch.zeros(0, 3)),
])
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("shape", [(0, 3, 2), (4, 0, 2)])
def test_empty_inputs_are_named_before_any_work(shape):
    """No inputs or no positions: our message, not torch's about an empty list deep inside."""
    with pytest.raises(ValueError, match=r"x must be a non-empty \(N, T, D\) tensor, got shape"):
        sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(shape), gaussian(1))


@pytest.mark.parametrize("form", ["logits (B, 2)", "score (B, 1)", "score (B,)", "labels (B,) long",
                                  "labels (B,) bool"])
def test_binary_outputs_are_read_by_shape_and_dtype(form):
    """The threshold unit's flip rate Phi(-a/sigma) whichever way f reports it: (B, C >= 2) -> argmax, (B, 1) or a
    float (B,) -> score > 0, integer or bool (B,) -> labels. (Argmax of (B, 1) would give 0; floats read as labels,
    1.)"""
    N, T, k, a, sigma, reps = 400, 3, 1, 0.4, 0.8, 10
    x = torch.randn(N, T, 1, generator=torch.Generator().manual_seed(0))
    x[:, k, 0] = a
    score = lambda xb: xb[:, k, 0] - 0.0  # noqa: E731
    f = {"logits (B, 2)": lambda xb, i: torch.stack([torch.zeros(len(xb)), score(xb)], 1),
         "score (B, 1)": lambda xb, i: score(xb)[:, None],
         "score (B,)": lambda xb, i: score(xb),
         "labels (B,) long": lambda xb, i: (score(xb) > 0).long(),
         "labels (B,) bool": lambda xb, i: score(xb) > 0}[form]
    s = sensitivity(f, x, gaussian(sigma), reps=reps, seed=3)
    p = phi(-a / sigma)
    assert abs(s.per_position[k].item() - p) < 4 * math.sqrt(p * (1 - p) / (N * reps))
    assert s.per_position[0] == 0 and s.per_position[2] == 0


def test_non_finite_values_raise_with_counts():
    """NaN inputs, and f returning NaN/inf on clean inputs or on perturbed copies, are errors naming how many rows,
    never a sensitivity of 0."""
    x = torch.randn(10, 4, 2)
    bad = x.clone()
    bad[3, 1, 0] = bad[3, 2, 1] = float("nan")  # two values of one input
    with pytest.raises(ValueError, match="non-finite values in 1 of its 10 inputs"):
        sensitivity(lambda xb, i: xb[:, 0], bad, gaussian(1))
    nan_rows = lambda xb, i: torch.where((i < 2)[:, None], float("nan"), xb[:, 0])  # noqa: E731
    with pytest.raises(ValueError, match="for 2 of the 10 clean inputs"):
        sensitivity(nan_rows, x, gaussian(1))
    x = torch.zeros(10, 4, 2)
    blows_up = lambda xb, i: torch.where((xb.abs() > 0).any(-1).any(-1)[:, None], float("inf"), xb[:, 0])  # noqa
    with pytest.raises(ValueError, match=r"0 of the 10 clean inputs and 40 perturbed copies"):
        sensitivity(blows_up, x, gaussian(1), seed=0)


def test_ranks_split_the_work_and_sum_to_the_single_process_counts():
    """Chunk c runs on rank c mod W with noise seeded by (seed, c): the counts of W simulated ranks sum exactly to
    one process's, for the exact and the sampled-position modes."""
    x = torch.randn(37, 6, 2, generator=torch.Generator().manual_seed(0))
    f = lambda xb, idx: (xb[:, :, 0].sum(1) > 0).long()  # noqa: E731
    for kw in [dict(reps=3), dict(positions=2, reps=2)]:
        flips, trials, n = sensitivity_counts(f, x, gaussian(0.7), batch_size=16, seed=5, **kw)
        for world in [2, 3]:
            parts = [sensitivity_counts(f, x, gaussian(0.7), batch_size=16, seed=5, rank=r, world=world, **kw)
                     for r in range(world)]
            assert all(p[0].sum() < flips.sum() for p in parts)  # each rank did only part of the work
            assert torch.equal(sum(p[0] for p in parts), flips) and torch.equal(sum(p[1] for p in parts), trials)
            assert all(p[2] == n for p in parts)
        single = sensitivity(f, x, gaussian(0.7), batch_size=16, seed=5, **kw)
        assert single.mean == summarise(flips, trials, n).mean
    with pytest.raises(ValueError, match="rank"):
        sensitivity_counts(f, x, gaussian(0.7), rank=2, world=2)


def test_tell_position_passes_each_copys_position_sorted():
    """With tell_position=True, f gets pos (None for the clean pass), equal to the one perturbed token, ascending
    within each chunk, and the copies of one position in input order (a stable sort: torch's CPU sort is not stable
    from some 50 keys on, so the chunks of 60 would mix them)."""
    x = torch.zeros(20, 7, 1)

    def f(xb, idx, pos):
        if pos is not None:
            assert torch.equal((xb[:, :, 0] != 0).float().argmax(1), pos)
            assert torch.equal(pos, pos.sort().values)
            assert torch.equal(pos * len(x) + idx, (pos * len(x) + idx).sort().values)
        return (xb[:, :, 0].sum(1) > 0).long()

    for kw in [dict(batch_size=9), dict(batch_size=9, positions=3), dict(batch_size=60, positions=3, reps=2)]:
        s = sensitivity(f, x, gaussian(1.0), seed=0, tell_position=True, **kw)
        assert 0.3 < s.mean < 0.7


def test_stderr_is_the_standard_deviation_over_inputs_over_sqrt_n():
    """With a parity on bit 0 and inputs of lengths 1, 2, 4, 5, the per-input flip rates are 1/len exactly; the
    standard error is their sample standard deviation (n - 1) divided by sqrt(n); one input has none (NaN)."""
    lengths = torch.tensor([1, 2, 4, 5])
    mask = torch.arange(5) < lengths[:, None]
    s = sensitivity(parity_model([0]), torch.ones(4, 5, 1), flip(), mask=mask)
    rates = [1, 1 / 2, 1 / 4, 1 / 5]
    mean = sum(rates) / 4
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / 3)
    assert s.stderr == pytest.approx(sd / 2, rel=1e-9) and s.mean == pytest.approx(mean, rel=1e-9)
    one = sensitivity(parity_model([0]), torch.ones(1, 5, 1), flip())
    assert math.isnan(one.stderr) and one.mean == 0.2


def test_a_one_token_vocabulary_is_allowed():
    """replace() from a single-row vocabulary always writes that row: sensitivity 0 for inputs made of it."""
    vocab = torch.eye(3)[:1]
    s = sensitivity(lambda xb, idx: (xb[:, 0, 0] > 0.5).long(), vocab[torch.zeros(5, 2, dtype=torch.long)],
                    replace(vocab), seed=0)
    assert s.mean == 0


@pytest.mark.parametrize("kwargs,message", [(dict(batch_size=0), "batch_size must be >= 1 (or None for the default)"),
                                            (dict(reps=0), "reps must be >= 1, got 0"),
                                            (dict(positions=0), "positions must be >= 1"),
                                            (dict(mask=torch.zeros(4, 3, dtype=torch.bool)), "no True position")])
def test_bad_arguments_say_what_is_wrong(kwargs, message):
    """Each bad argument is refused with its own message, before any work (not by some later failure)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), **kwargs)


def test_paired_differences_against_hand_computed_values():
    """Per seed: the mean over inputs of (model - reference) and its standard error over inputs; over the seeds the
    mean of those means and its standard error over seeds; the reference itself is not listed, a model without the
    reference's seed is skipped, and one seed has no standard error over seeds."""
    per_input = {("vit", 0): {"1": [0.1, 0.2, 0.3]}, ("mlp", 0): {"1": [0.2, 0.4, 0.3]},
                 ("vit", 1): {"1": [0.0, 0.0, 0.2]}, ("mlp", 1): {"1": [0.1, 0.1, 0.1]},
                 ("mlp", 2): {"1": [9.0, 9.0, 9.0]}, ("cnn", 0): {"1": [0.1, 0.2, 0.3]}}
    out = paired_differences(per_input, "vit")
    assert out["reference"] == "vit" and set(out["models"]) == {"mlp", "cnn"}
    d = out["models"]["mlp"]["diff"]["1"]
    assert d["per_seed"]["seed0"] == pytest.approx([0.1, math.sqrt(0.01) / math.sqrt(3)])
    assert d["per_seed"]["seed1"] == pytest.approx([1 / 30, math.sqrt(0.04 / 3) / math.sqrt(3)])
    # in float64 throughout: float32 would round these means by about 1e-8 of themselves
    assert d["mean"] == pytest.approx((0.1 + 1 / 30) / 2, rel=1e-12) and d["seeds"] == 2
    assert d["stderr"] == pytest.approx(abs(0.1 - 1 / 30) / math.sqrt(2) / math.sqrt(2), rel=1e-12)
    assert "seed2" not in d["per_seed"]
    c = out["models"]["cnn"]["diff"]["1"]
    assert c["mean"] == 0 and c["seeds"] == 1 and math.isnan(c["stderr"])


@pytest.mark.parametrize("call,error,message", [
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], [[[1.0]]], gaussian(1)), TypeError, "x must be a torch.Tensor"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2).numpy(), gaussian(1)), TypeError, "x must"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), mask=[[True] * 3] * 4),
     TypeError, "mask must be a torch.Tensor"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), positions=2.5), TypeError,
     "positions must be an integer"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), reps=1.5), TypeError,
     "reps must be an integer"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), batch_size=2.5), TypeError,
     "batch_size must be an integer"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), gaussian(1), reps=True), TypeError,
     "reps must be an integer, got True"),  # a bool is an int to Python, never a number of draws here
    (lambda: sensitivity(lambda xb, i: torch.cat([xb[:, 0, 0], xb[:1, 0, 0]]), torch.randn(4, 3, 2), gaussian(1)),
     ValueError, "f returned output of shape (5,) for a batch of 4 rows"),  # one row too many
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2).index_fill(0, torch.tensor([1]), math.inf),
                         gaussian(1)), ValueError, "x holds non-finite values in 1 of its 4 inputs"),  # inf, not NaN
    (lambda: gaussian("abc"), TypeError, "sigma must be a number"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randint(0, 5, (4, 3, 2)), gaussian(1)), TypeError,
     "gaussian(sigma) needs floating-point tokens (embeddings, not ids), got torch.int64"),  # token ids
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), 0.1, seed=0), TypeError,
     "perturb must be callable (gaussian(sigma), replace(vocab), flip()), got 0.1"),
    (lambda: sensitivity(None, torch.randn(4, 3, 2), gaussian(0.1)), TypeError, "f must be callable"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), replace(torch.randn(5, 3))), ValueError,
     "vocab rows have width 3, the tokens of x 2"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0, 0], torch.randn(4, 3, 2), lambda t, g: t[:, :1]), ValueError,
     "the perturbation returned shape"),
    (lambda: sensitivity(lambda xb, i: xb[:, 0].tolist(), torch.randn(4, 3, 2), gaussian(1)), TypeError,
     "f must return a tensor of logits, scores or labels, got list"),
    (lambda: sensitivity(lambda xb, i: (xb[:, 0], None), torch.randn(4, 3, 2), gaussian(1)), TypeError, "got tuple"),
    (lambda: sensitivity(lambda xb, i: None, torch.randn(4, 3, 2), gaussian(1)), TypeError, "got NoneType"),
    (lambda: patchify([[1.0]], 4), ValueError, "images must be a (B, C, H, W) tensor"),
    (lambda: patchify(torch.zeros(1, 1, 8, 8), 2.5), ValueError, "patch size 2.5 must divide"),
    (lambda: patchify(torch.zeros(1, 1, 8, 8), 0), ValueError, "patch size 0 must divide"),
    (lambda: unpatchify(torch.zeros(1, 16, 4), 0, (1, 8, 8)), ValueError, "patch size 0 must divide"),
    (lambda: unpatchify(torch.zeros(1, 4, 9), 3, (1, 8, 8)), ValueError, "patch size 3 must divide"),
])
def test_the_input_contract_names_what_is_wrong(call, error, message):
    """Arguments of the wrong type or shape are refused at entry with a message naming the argument, not by an
    internal TypeError, AttributeError or IndexError later."""
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value)


def test_labels_with_a_kept_dimension_are_labels_and_a_model_in_train_mode_is_refused():
    """f returning integer labels of shape (B, 1) (an argmax with keepdim=True) gives the same sensitivity as (B,);
    a model whose predictions change on the same inputs (dropout left on) is refused, not measured as flips."""
    x = torch.randn(300, 1, 1, generator=torch.Generator().manual_seed(0))
    labels = lambda xb, idx: torch.stack([torch.zeros(len(xb)), xb[:, 0, 0]], 1).argmax(1)  # noqa: E731
    a = sensitivity(labels, x, gaussian(1.0), reps=4, seed=0)
    b = sensitivity(lambda xb, idx: labels(xb, idx)[:, None], x, gaussian(1.0), reps=4, seed=0)
    assert a.mean == b.mean and a.mean > 0.1
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(4, 3)).train()
    with pytest.raises(ValueError, match="model.eval"):
        sensitivity(lambda xb, idx: net(xb), torch.randn(200, 2, 2), gaussian(0.0), seed=0)
    assert sensitivity(lambda xb, idx: net.eval()(xb), torch.randn(200, 2, 2), gaussian(0.0), seed=0).mean == 0


def test_the_train_mode_check_tolerates_one_changed_prediction_in_a_hundred():
    """The clean predictions of the first chunk are computed twice: more changed than max(1, 1% of the chunk) is a
    model in train mode and refused; up to that many (a near-tie on a GPU) are let through."""
    def flaky(changed):  # labels 0, but `changed` of them 1 on the second call (the check), as dropout would
        calls = []

        def f(xb, idx):
            calls.append(1)
            y = torch.zeros(len(xb), dtype=torch.long)
            y[:changed if len(calls) == 2 else 0] = 1
            return y
        return f

    for n, allowed in [(50, 1), (100, 1), (1000, 10)]:  # 50: 1% rounds to 0, the floor of 1 holds
        x = torch.zeros(n, 2, 1)
        assert sensitivity(flaky(allowed), x, flip(), batch_size=n).mean == 0
        with pytest.raises(ValueError, match="model.eval"):
            sensitivity(flaky(allowed + 1), x, flip(), batch_size=n)


def test_default_batch_size_follows_its_budgets():
    """Rows per chunk: on a CPU 600,000 floats over each row's T * (T + D); on CUDA 2^24 floats (64 MB) over its
    T * D; never fewer than 64 rows nor more than 16,384."""
    cuda = types.SimpleNamespace(type="cuda")
    assert default_batch_size(torch.zeros(1, 64, 48)) == 600_000 // (64 * 112)  # 83
    assert default_batch_size(torch.zeros(1, 4, 4)) == 16384  # 18,750 capped
    assert default_batch_size(torch.zeros(1, 256, 3072)) == 64  # 0 raised to the floor
    assert default_batch_size(types.SimpleNamespace(shape=(1, 64, 48), device=cuda)) == 2**24 // (64 * 48)  # 5,461


def test_a_position_draw_at_the_top_of_its_range_stays_on_a_valid_position(monkeypatch):
    """positions=k picks the u-th valid position with u = floor(U * n_valid): a uniform draw that comes out as 1.0
    (a generator's closed upper end, or rounding) picks the last valid position, never a masked one."""
    real = torch.rand
    monkeypatch.setattr(torch, "rand", lambda n, generator=None, device=None: torch.ones(n, device=device))
    mask = torch.tensor([[True, True, False]] * 4)
    s = sensitivity(lambda xb, i: xb[:, 1, 0] > 0, torch.ones(4, 3, 1), flip(), mask=mask, positions=2, seed=0)
    monkeypatch.setattr(torch, "rand", real)
    pp = s.per_position.tolist()
    assert math.isnan(pp[0]) and pp[1] == 1.0 and math.isnan(pp[2])  # the second of the two valid ones, every time


def test_the_u_th_draw_is_the_u_th_valid_position_in_order(monkeypatch):
    """positions=k maps u = floor(U * n_valid) to the row's u-th valid position counted from the start: the same
    positions for a seed on any device (an unstable sort of the mask, as torch's is on a CPU from some 100 positions
    on, would map u to some other valid one)."""
    real, told = torch.rand, []
    monkeypatch.setattr(torch, "rand", lambda n, generator=None, device=None: torch.full((n,), 0.5, device=device))
    mask = torch.stack([torch.arange(300) % 3 == 0, torch.arange(300) % 5 != 0])  # 100 and 240 valid positions

    def f(xb, idx, pos):
        if pos is not None:
            told.extend(zip(idx.tolist(), pos.tolist()))
        return xb[:, 0, 0] > 0

    sensitivity(f, torch.ones(2, 300, 1), flip(), mask=mask, positions=3, seed=0, tell_position=True)
    monkeypatch.setattr(torch, "rand", real)
    valid = [mask[n].nonzero().squeeze(1).tolist() for n in range(2)]
    assert sorted(told) == [(0, valid[0][50])] * 3 + [(1, valid[1][120])] * 3 == [(0, 150)] * 3 + [(1, 151)] * 3


def test_a_key_the_reference_lacks_is_not_paired_and_the_chunk_seeds_never_change():
    """paired_differences compares a model with the reference only at the keys both were measured at. chunk_seed, the
    noise seed of each chunk, is a fixed function of (seed, chunk) below 2^63, and chunk c of a measurement with seed s
    draws its noise from chunk_seed(s, c): the same seed re-measures the same noise in any later version."""
    out = paired_differences({("a", 0): {"0.1": [1.0, 0.0], "0.5": [1.0, 1.0]}, ("b", 0): {"0.1": [0.0, 0.0]}}, "b")
    assert list(out["models"]["a"]["diff"]) == ["0.1"] and out["models"]["a"]["diff"]["0.1"]["mean"] == 0.5
    assert chunk_seed(0, 1) == 0xBF58476D1CE4E5B9 - 2**63 and chunk_seed(1, 0) == 0x9E3779B97F4A7C15 - 2**63
    assert chunk_seed(5, 3) == (5 * 0x9E3779B97F4A7C15 + 3 * 0xBF58476D1CE4E5B9) % 2**63 > 2**62
    seeds = []  # each chunk's generator, as the perturbation sees it: 8 copies in 4 chunks of 2
    sensitivity(lambda xb, idx: xb[:, 0], torch.zeros(4, 2, 1),
                lambda tokens, g: seeds.append(g.initial_seed()) or tokens + 1, batch_size=2, seed=5)
    assert seeds == [chunk_seed(5, c) for c in range(4)]
