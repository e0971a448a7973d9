"""The token-wise sensitivity estimator shared by every experiment, and what a user imports to measure a model.

Sensitivity (Def. 4.1, Eq. 2 of Vasudeva et al., ICLR 2025) of a classifier f on inputs x of T tokens:

    S(f) = E_x (1/T) sum_t E_noise 1[argmax f(x) != argmax f(x with token t perturbed)]

For +-1 bits with perturb = flip() this is the Boolean average sensitivity of Eq. 1 divided by n. The estimator never
materialises the N*T*reps perturbed copies: it builds `batch_size` of them at a time on the device and counts their
flips there, so memory is one chunk and the loop never waits for the host. It needs torch alone (from another folder:
pip install -e /path/to/repo, or PYTHONPATH=/path/to/repo):

    s = sensitivity(lambda xb, idx: model(unpatchify(xb, 4, images.shape[1:])), patchify(images, 4), gaussian(0.1))
    print(f"{s.mean:.4f} +- {s.stderr:.4f}")"""

import math
import numbers
from dataclasses import dataclass

import torch

# -----------------------------------------------------------------------------
# perturbations: each maps the (M, D) tokens being perturbed to their perturbed values


def gaussian(sigma):
    """Add isotropic noise N(0, sigma^2 I); sigma is a standard deviation."""
    if not isinstance(sigma, numbers.Real):
        raise TypeError(f"sigma must be a number (a standard deviation), got {type(sigma).__name__}")
    if not 0 <= sigma < math.inf:  # also rejects NaN
        raise ValueError(f"sigma must be a finite standard deviation >= 0, got {sigma}")

    def perturb(tokens, generator):  # tokens (M, D): the one token of each of M copies
        if not tokens.is_floating_point():  # torch's own error would name a kernel, not the argument
            raise TypeError(f"gaussian(sigma) needs floating-point tokens (embeddings, not ids), got {tokens.dtype}")
        return tokens + sigma * torch.randn(tokens.shape, generator=generator, device=tokens.device, dtype=tokens.dtype)

    return perturb


def replace(vocab):
    """Replace the token by a uniformly random row of the (V, D) vocabulary (the synthetic task's P)."""
    if not isinstance(vocab, torch.Tensor) or vocab.ndim != 2 or len(vocab) == 0:
        raise ValueError(f"vocab must be a non-empty (V, D) tensor, got {getattr(vocab, 'shape', type(vocab))}")

    def perturb(tokens, generator):
        if vocab.shape[1] != tokens.shape[1]:
            raise ValueError(f"replace: vocab rows have width {vocab.shape[1]}, the tokens of x {tokens.shape[1]}")
        i = torch.randint(len(vocab), (len(tokens),), generator=generator, device=vocab.device)  # one row per copy
        return vocab[i].to(tokens.device, tokens.dtype)  # possibly the token itself: a replacement that changes nothing

    return perturb


def flip():
    """Flip a +-1 Boolean bit: x -> -x (Eq. 1)."""
    return lambda tokens, generator: -tokens


# -----------------------------------------------------------------------------
# the estimator


@dataclass
class Sensitivity:
    mean: float  # mean over inputs of that input's flip rate averaged over its valid positions
    stderr: float  # standard error of `mean` over inputs (NaN for a single input)
    per_position: torch.Tensor  # (T,) flip rate at each position over the inputs where it is valid; NaN if never
    per_input: torch.Tensor  # (N,) flip rate of each input, averaged over its valid positions
    evaluations: int  # number of perturbed forward passes


def predict(out, rows):
    """Class labels from f's output, read by its shape and dtype: (B, C >= 2) logits -> argmax; a floating (B, 1) or
    (B,) score -> score > 0; integer or bool (B,) or (B, 1) -> the labels themselves."""
    if not isinstance(out, torch.Tensor):  # a tuple (logits, aux), a list, None: say so, not an AttributeError
        raise TypeError(f"f must return a tensor of logits, scores or labels, got {type(out).__name__}")
    if out.ndim == 0 or out.shape[0] != rows:
        raise ValueError(f"f returned output of shape {tuple(out.shape)} for a batch of {rows} rows; it must return "
                         f"one row per input: (B, C) logits, (B, 1) or (B,) scores, or (B,) labels")
    if out.ndim == 2 and out.shape[1] >= 2:
        return out.argmax(-1)
    if out.ndim == 2 and out.shape[1] == 1:  # a score, or labels with the dimension kept (argmax(keepdim=True))
        return out[:, 0] > 0 if out.is_floating_point() else out[:, 0]
    if out.ndim == 1:
        return out > 0 if out.is_floating_point() else out
    raise ValueError(f"f returned output of shape {tuple(out.shape)}: expected (B, C) logits, (B, 1) or (B,) scores, "
                     "or (B,) labels")


def not_finite(out):
    """How many rows of f's output hold a non-finite value (a 0-dim device tensor: no host sync)."""
    if not out.is_floating_point():
        return torch.zeros((), dtype=torch.long, device=out.device)
    return (~torch.isfinite(out)).reshape(len(out), -1).any(1).sum()


def default_batch_size(x):
    """Rows per chunk: about 64 MB of input on CUDA. On a CPU a chunk runs fastest while its activations stay in
    cache, so we budget 600k floats for each row's T*D input plus a T*T attention map (on 2 cores a small ViT runs
    10k rows/s at 100 rows but 6k at 512, while an MLP keeps gaining up to 600 rows)."""
    _, T, D = x.shape
    rows = 2**24 // (T * D) if x.device.type == "cuda" else 600_000 // (T * (T + D))
    return min(max(rows, 64), 16384)


def chunk_seed(seed, chunk):
    """The noise seed of one chunk, a function of (seed, chunk): the same noise whichever rank runs the chunk."""
    return (seed * 0x9E3779B97F4A7C15 + chunk * 0xBF58476D1CE4E5B9) % 2**63


def sensitivity(f, x, perturb, *, mask=None, reps=1, positions=None, batch_size=None, seed=None, tell_position=False):
    """Estimate the token-wise sensitivity of f on x (N, T, D), perturbing one token per copy.

    f(x_batch, idx) returns, for a (B, T, D) batch, logits (B, C), a binary score (B, 1) or (B,) float (class =
    score > 0), or labels (B,) int/bool; idx (B,) are the rows of x the copies came from. With tell_position=True f is
    called as f(x_batch, idx, pos), pos (B,) the position each copy perturbs (None for the clean inputs), and each
    chunk's copies come stably sorted by position (for models that reuse the clean prefix). Put the model in eval
    mode first. mask (N, T) bool marks the positions that may be perturbed.
    positions=None perturbs every valid position `reps` times (exact per-position profile); positions=k samples k valid
    positions per input per rep, uniformly with replacement (unbiased, cheaper for long inputs). batch_size: rows per
    chunk, default_batch_size(x) if None. seed: chunk c draws its noise from a generator seeded by (seed, c), so a
    seed gives the same noise whatever the number of ranks; None draws the seed from torch's global generator.

    Under torch.distributed (initialised), chunk c runs on rank c mod world_size and the counts are summed with one
    all_reduce: every rank calls this at the same point, and all get the same result. Bad arguments raise TypeError
    or ValueError naming them; so do f returning non-finite values, the wrong number of rows, or different predictions
    for the same inputs (a model in train mode)."""
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    flips, trials, evaluations = sensitivity_counts(f, x, perturb, mask=mask, reps=reps, positions=positions,
                                                    batch_size=batch_size, seed=seed, tell_position=tell_position,
                                                    rank=rank, world=world)
    if world > 1:
        both = torch.stack([flips, trials])
        torch.distributed.all_reduce(both)
        flips, trials = both
    return summarise(flips, trials, evaluations)


def sensitivity_counts(f, x, perturb, *, mask=None, reps=1, positions=None, batch_size=None, seed=None,
                       tell_position=False, rank=0, world=1):
    """The work of `sensitivity` for one rank of `world`: the (N, T) flip and trial counts of the chunks c with
    c mod world == rank, and the total number of perturbed evaluations (all ranks). Summing the counts of ranks
    0..world-1 gives exactly the single-process counts."""
    for name, v, what in [("f", f, "f(x_batch, idx)"), ("perturb", perturb, "gaussian(sigma), replace(vocab), flip()")]:
        if not callable(v):  # a float where gaussian(0.1) belongs, say: named here, not a TypeError deep inside
            raise TypeError(f"{name} must be callable ({what}), got {v!r}")
    for name, v, kind in [("x", x, torch.Tensor), ("mask", mask, (torch.Tensor, type(None))), ("reps", reps, int),
                          ("positions", positions, (int, type(None))), ("batch_size", batch_size, (int, type(None)))]:
        if not isinstance(v, kind) or isinstance(v, bool):
            raise TypeError(f"{name} must be {'a torch.Tensor' if name in ('x', 'mask') else 'an integer'}, got {v!r}")
        if isinstance(v, int) and v < 1:  # checked here, before any work: each with its own message
            raise ValueError(f"{name} must be >= 1{'' if name == 'reps' else ' (or None for the default)'}, got {v}")
    if x.ndim != 3 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x must be a non-empty (N, T, D) tensor, got shape {tuple(x.shape)}")
    N, T, D = x.shape
    mask = torch.ones(N, T, dtype=torch.bool, device=x.device) if mask is None else mask
    if mask.shape != (N, T):
        raise ValueError(f"mask must have shape (N, T) = {(N, T)} to match x, got {tuple(mask.shape)}")
    mask = mask.to(x.device, torch.bool)
    batch_size = default_batch_size(x) if batch_size is None else batch_size
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world), got rank {rank} of {world}")
    n_valid = mask.sum(1)  # (N,)
    if not bool((n_valid > 0).all()):  # host syncs, before the loop
        raise ValueError("mask has a row with no True position: every input needs a position to perturb")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).flatten(1).any(1).sum())
        raise ValueError(f"x holds non-finite values in {bad} of its {N} inputs")
    seed = int(torch.randint(2**62, (1,))) if seed is None else seed  # None: from torch's global generator
    gen = torch.Generator(x.device)
    call = (lambda xb, n, t: f(xb, n, t)) if tell_position else (lambda xb, n, t: f(xb, n))  # f's two signatures

    with torch.inference_mode():
        # clean predictions, once, on every rank (each rank's chunks may use any input)
        clean, bad_clean = [], torch.zeros((), dtype=torch.long, device=x.device)
        for i in range(0, N, batch_size):
            n = torch.arange(i, min(i + batch_size, N), device=x.device)
            out = call(x[i:i + batch_size], n, None)
            clean.append(predict(out, len(n)))
            bad_clean += not_finite(out)
        clean = torch.cat(clean)
        n = torch.arange(min(batch_size, N), device=x.device)  # the first chunk again: does f give the same answer?
        again = predict(call(x[:len(n)], n, None), len(n))
        if (again != clean[:len(n)]).sum() > max(1, len(n) // 100):  # a rare near-tie may flip on a GPU, dropout not
            raise ValueError("f gives different predictions for the same inputs: a model in train mode (dropout)? "
                             "Call model.eval() first; its flips would count as sensitivity")
        if positions is None:
            # valid (position, input) cells in position-major order: a chunk holds copies of one or two positions
            flat_valid = mask.t().flatten().nonzero().squeeze(1)  # (V,) t*N + n
            n_jobs = len(flat_valid) * reps
        else:
            # valid positions first in each row, so the u-th valid position of row n is order[n, u]
            order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)  # (N, T)
            n_jobs = N * positions * reps
        flips = torch.zeros(N * T, dtype=torch.long, device=x.device)  # per (input, position): prediction changed
        trials = torch.zeros(N * T, dtype=torch.long, device=x.device)  # per (input, position): copies evaluated
        bad = torch.zeros((), dtype=torch.long, device=x.device)  # non-finite outputs, counted without a host sync
        buf = torch.empty(min(batch_size, n_jobs), T, D, dtype=x.dtype, device=x.device)  # reused by every chunk
        for c, start in enumerate(range(0, n_jobs, batch_size)):
            if c % world != rank:  # another rank's chunk
                continue
            gen.manual_seed(chunk_seed(seed, c))  # the chunk's noise depends on (seed, c) alone
            job = torch.arange(start, min(start + batch_size, n_jobs), device=x.device)
            if positions is None:
                cell = flat_valid[job % len(flat_valid)]  # job -> (rep, valid cell)
                n, t = cell % N, cell // N
            else:
                n = job // (positions * reps)  # job -> (input, draw)
                u = (torch.rand(len(job), generator=gen, device=x.device) * n_valid[n]).long()
                t = order[n, torch.minimum(u, n_valid[n] - 1)]  # the min guards against float rounding up
                if tell_position:
                    t, by_t = torch.sort(t, stable=True)
                    n = n[by_t]
            xb = torch.index_select(x, 0, n, out=buf[:len(job)])  # (B, T, D) copies of the clean inputs
            flat = xb.view(-1, D)  # (B*T, D); row b*T + t is token t of copy b
            which = torch.arange(len(job), device=x.device) * T + t
            new = perturb(flat.index_select(0, which), gen)  # (B, D): each copy's one perturbed token
            if new.shape != (len(job), D):
                raise ValueError(f"the perturbation returned shape {tuple(new.shape)} for {(len(job), D)} tokens")
            flat.index_copy_(0, which, new)
            out = call(xb, n, t)
            bad += not_finite(out)
            changed = predict(out, len(job)) != clean.index_select(0, n)  # Eq. 2's indicator, per copy
            cell = n * T + t  # where each copy's count goes
            flips.index_add_(0, cell, changed.long())
            trials.index_add_(0, cell, torch.ones_like(cell))
    if bad_clean or bad:  # host sync, after the loop
        raise ValueError(f"f returned non-finite outputs for {int(bad_clean)} of the {N} clean inputs and "
                         f"{int(bad)} perturbed copies: no sensitivity can be read from them")
    return flips.view(N, T), trials.view(N, T), n_jobs


def summarise(flips, trials, evaluations):
    """Sensitivity from (N, T) flip and trial counts."""
    flips, trials = flips.double(), trials.double()  # float64: exact counts, exact rates, reduced on their device
    N = len(flips)  # (copying the N*T counts to the host took 13 of an H200's 17 ms at N*T = 10^6, no model)
    per_input = (flips.sum(1) / trials.sum(1)).cpu()  # each input's flip rate over its own (valid) positions
    per_position = (flips.sum(0) / trials.sum(0)).cpu()  # 0/0 = NaN where never valid
    stderr = per_input.std().item() / math.sqrt(N) if N > 1 else float("nan")
    return Sensitivity(per_input.mean().item(), stderr, per_position.float(), per_input.float(), evaluations)


# -----------------------------------------------------------------------------
# images as tokens: non-overlapping p x p patches


def patchify(images, p):
    """(B, C, H, W) -> (B, T, C*p*p), T = (H/p)*(W/p) patches in row-major grid order."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    B, C, H, W = images.shape
    if not isinstance(p, int) or p < 1 or H % p or W % p:
        raise ValueError(f"patch size {p} must divide the image height {H} and width {W}")
    x = images.reshape(B, C, H // p, p, W // p, p)  # (B, C, grid row, pixel row, grid column, pixel column)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)  # patch-major, then C, p, p


def unpatchify(tokens, p, image_shape):
    """Exact inverse of patchify: (B, T, C*p*p) -> (B, C, H, W) with image_shape = (C, H, W)."""
    C, H, W = image_shape
    if p < 1 or H % p or W % p:
        raise ValueError(f"patch size {p} must divide the image height {H} and width {W}")
    if tokens.shape[1:] != ((H // p) * (W // p), C * p * p):
        raise ValueError(f"tokens of shape {tuple(tokens.shape)} do not tile a {image_shape} image in {p}x{p} patches")
    x = tokens.reshape(len(tokens), H // p, W // p, C, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(len(tokens), C, H, W)


# -----------------------------------------------------------------------------
# paired comparisons of models measured on the same inputs with the same noise


def paired_differences(per_input, reference):
    """Paired comparisons of models measured on the same inputs with the same noise (the same `seed` of sensitivity).
    per_input = {(model, seed): {key: Sensitivity.per_input}}, key naming what was measured (a sigma, say). For every
    model against `reference`, at each key: per seed, the mean over inputs of (model - reference) and its standard
    error; over the seeds both have, the mean of those means and its standard error (NaN with one seed). Returns
    {"reference", "models": {model: {"diff": {key: {"mean", "stderr", "seeds", "per_seed": {"seed<k>": [m, se]}}}}}}."""
    out = {"reference": reference, "models": {}}
    for model in dict.fromkeys(m for m, _ in per_input):
        if model == reference:
            continue
        diff = {}  # key -> seed -> [mean, stderr] of the paired differences over inputs
        for (m, seed), values in per_input.items():
            ref = per_input.get((reference, seed))
            if m != model or ref is None:
                continue
            for key in values:
                if key in ref:
                    d = torch.tensor(values[key], dtype=torch.float64) - torch.tensor(ref[key], dtype=torch.float64)
                    diff.setdefault(key, {})[f"seed{seed}"] = [d.mean().item(), (d.std() / math.sqrt(len(d))).item()]
        res = {}
        for key, per_seed in diff.items():
            means = torch.tensor([v[0] for v in per_seed.values()], dtype=torch.float64)
            se = (means.std() / math.sqrt(len(means))).item() if len(means) > 1 else math.nan
            res[key] = {"mean": means.mean().item(), "stderr": se, "seeds": len(means), "per_seed": per_seed}
        out["models"][model] = {"diff": res}
    return out
