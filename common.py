"""The token-wise sensitivity estimator shared by every experiment, plus the few lines each script would repeat.

Sensitivity (Def. 4.1, Eq. 2 of Vasudeva et al., ICLR 2025) of a classifier f on inputs x of T tokens:

    S(f) = E_x (1/T) sum_t E_noise 1[argmax f(x) != argmax f(x with token t perturbed)]

For +-1 bits with perturb = flip() this is the Boolean average sensitivity of Eq. 1 divided by n.

The estimator never materialises the N*T*reps perturbed copies: it enumerates (input, position, draw) jobs
arithmetically, builds `batch_size` perturbed copies at a time on the device, and accumulates the flip counts on
the device, so memory is bounded by one chunk and the loop never waits for the host.

    s = sensitivity(lambda xb, idx: model(xb), patchify(images, 4), gaussian(0.1))
    print(f"{s.mean:.4f} +- {s.stderr:.4f}")
"""

import argparse
import contextlib
import copy
import json
import math
import os
import pickle
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

# -----------------------------------------------------------------------------
# perturbations: each maps the (M, D) tokens being perturbed to their perturbed values


def gaussian(sigma):
    """Add isotropic noise N(0, sigma^2 I); sigma is a standard deviation."""
    if not 0 <= sigma < math.inf:  # also rejects NaN
        raise ValueError(f"sigma must be a finite standard deviation >= 0, got {sigma}")

    def perturb(tokens, generator):
        noise = torch.randn(tokens.shape, generator=generator, device=tokens.device, dtype=tokens.dtype)
        return tokens + sigma * noise

    return perturb


def replace(vocab):
    """Replace the token by a uniformly random row of the (V, D) vocabulary (the synthetic task's P)."""
    if vocab.ndim != 2 or len(vocab) == 0:
        raise ValueError(f"vocab must be a non-empty (V, D) tensor, got shape {tuple(vocab.shape)}")

    def perturb(tokens, generator):
        i = torch.randint(len(vocab), (len(tokens),), generator=generator, device=vocab.device)
        return vocab[i].to(tokens.device, tokens.dtype)

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
    """Class labels from f's output, read by its shape and dtype: (B, C >= 2) logits -> argmax; (B, 1) or a floating
    (B,) score -> the binary class score > 0; an integer or bool (B,) -> the labels themselves."""
    if out.ndim == 0 or out.shape[0] != rows:
        raise ValueError(f"f returned output of shape {tuple(out.shape)} for a batch of {rows} rows; it must return "
                         f"one row per input: (B, C) logits, (B, 1) or (B,) scores, or (B,) labels")
    if out.ndim == 2 and out.shape[1] >= 2:
        return out.argmax(-1)
    if out.ndim == 2 and out.shape[1] == 1:
        return out[:, 0] > 0
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
    """The noise seed of one chunk: a fixed function of (seed, chunk), so a chunk draws the same noise whichever
    process (rank) runs it."""
    return (seed * 0x9E3779B97F4A7C15 + chunk * 0xBF58476D1CE4E5B9) % 2**63


def sensitivity(f, x, perturb, *, mask=None, reps=1, positions=None, batch_size=None, seed=None, tell_position=False):
    """Estimate the token-wise sensitivity of f on x (N, T, D), perturbing one token per copy.

    f(x_batch, idx) returns, for a (B, T, D) batch, logits (B, C), a binary score (B, 1) or (B,) float (class =
    score > 0), or labels (B,) int/bool; idx (B,) are the rows of x the copies came from. With tell_position=True f is
    called as f(x_batch, idx, pos), pos (B,) the position each copy perturbs (None for the clean inputs), and each
    chunk's copies come sorted by position (for models that reuse the clean prefix before it). Put the model in eval
    mode first (dropout would count as flips). mask (N, T) bool marks the positions that may be perturbed.
    positions=None perturbs every valid position `reps` times (exact per-position profile); positions=k samples k valid
    positions per input per rep, uniformly with replacement (unbiased, cheaper for long inputs). batch_size: rows per
    chunk, default_batch_size(x) if None. seed: chunk c draws its noise from a generator seeded by (seed, c), so a
    seed gives the same noise whatever the number of ranks; None draws the seed from torch's global generator.

    Under torch.distributed (initialised), chunk c runs on rank c mod world_size and the counts are summed with one
    all_reduce: every rank must call this at the same point, and all get the same result. Raises ValueError for
    non-finite x, or when f returns non-finite values or the wrong number of rows.
    """
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
    if x.ndim != 3 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x must be a non-empty (N, T, D) tensor, got shape {tuple(x.shape)}")
    N, T, D = x.shape
    if mask is None:
        mask = torch.ones(N, T, dtype=torch.bool, device=x.device)
    if mask.shape != (N, T):
        raise ValueError(f"mask must have shape (N, T) = {(N, T)} to match x, got {tuple(mask.shape)}")
    mask = mask.to(x.device, torch.bool)
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if positions is not None and positions < 1:
        raise ValueError(f"positions must be None (all) or >= 1, got {positions}")
    batch_size = default_batch_size(x) if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (or None for the default), got {batch_size}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world), got rank {rank} of {world}")
    n_valid = mask.sum(1)  # (N,)
    if not bool((n_valid > 0).all()):  # host syncs, before the loop
        raise ValueError("mask has a row with no True position: every input needs a position to perturb")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).flatten(1).any(1).sum())
        raise ValueError(f"x holds non-finite values in {bad} of its {N} inputs")
    if seed is None:
        seed = int(torch.randint(2**62, (1,)))
    gen = torch.Generator(x.device)
    call = (lambda xb, n, t: f(xb, n, t)) if tell_position else (lambda xb, n, t: f(xb, n))

    with torch.inference_mode():
        # clean predictions, once, on every rank (each rank's chunks may use any input)
        clean, bad_clean = [], torch.zeros((), dtype=torch.long, device=x.device)
        for i in range(0, N, batch_size):
            n = torch.arange(i, min(i + batch_size, N), device=x.device)
            out = f(x[i:i + batch_size], n, None) if tell_position else f(x[i:i + batch_size], n)
            clean.append(predict(out, len(n)))
            bad_clean += not_finite(out)
        clean = torch.cat(clean)
        if positions is None:
            # valid (position, input) cells in position-major order: a chunk holds copies of one or two positions
            flat_valid = mask.t().flatten().nonzero().squeeze(1)  # (V,) t*N + n
            n_jobs = len(flat_valid) * reps
        else:
            # valid positions first in each row, so the u-th valid position of row n is order[n, u]
            order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)  # (N, T)
            n_jobs = N * positions * reps
        flips = torch.zeros(N * T, dtype=torch.long, device=x.device)
        trials = torch.zeros(N * T, dtype=torch.long, device=x.device)
        bad = torch.zeros((), dtype=torch.long, device=x.device)
        buf = torch.empty(min(batch_size, n_jobs), T, D, dtype=x.dtype, device=x.device)  # reused by every chunk
        for c, start in enumerate(range(0, n_jobs, batch_size)):
            if c % world != rank:
                continue
            gen.manual_seed(chunk_seed(seed, c))
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
            flat.index_copy_(0, which, perturb(flat.index_select(0, which), gen))
            out = call(xb, n, t)
            bad += not_finite(out)
            changed = predict(out, len(job)) != clean.index_select(0, n)
            cell = n * T + t
            flips.index_add_(0, cell, changed.long())
            trials.index_add_(0, cell, torch.ones_like(cell))
    if bad_clean or bad:  # host sync, after the loop
        raise ValueError(f"f returned non-finite outputs for {int(bad_clean)} of the {N} clean inputs and "
                         f"{int(bad)} perturbed copies: no sensitivity can be read from them")
    return flips.view(N, T), trials.view(N, T), n_jobs


def summarise(flips, trials, evaluations):
    """Sensitivity from (N, T) flip and trial counts."""
    flips, trials = flips.double().cpu(), trials.double().cpu()
    N = len(flips)
    per_input = flips.sum(1) / trials.sum(1)
    per_position = flips.sum(0) / trials.sum(0)  # 0/0 = NaN where never valid
    stderr = per_input.std().item() / math.sqrt(N) if N > 1 else float("nan")
    return Sensitivity(per_input.mean().item(), stderr, per_position.float(), per_input.float(), evaluations)


# -----------------------------------------------------------------------------
# images as tokens: non-overlapping p x p patches


def patchify(images, p):
    """(B, C, H, W) -> (B, T, C*p*p), T = (H/p)*(W/p) patches in row-major grid order."""
    B, C, H, W = images.shape
    if p < 1 or H % p or W % p:
        raise ValueError(f"patch size {p} must divide the image height {H} and width {W}")
    x = images.reshape(B, C, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)


def unpatchify(tokens, p, image_shape):
    """Exact inverse of patchify: (B, T, C*p*p) -> (B, C, H, W) with image_shape = (C, H, W)."""
    C, H, W = image_shape
    if p < 1 or H % p or W % p:
        raise ValueError(f"patch size {p} must divide the image height {H} and width {W}")
    if tokens.shape[1:] != ((H // p) * (W // p), C * p * p):
        raise ValueError(f"tokens of shape {tuple(tokens.shape)} do not tile a {image_shape} image in {p}x{p} patches")
    B = tokens.shape[0]
    x = tokens.reshape(B, H // p, W // p, C, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, C, H, W)


# -----------------------------------------------------------------------------
# plumbing every script repeats: threads, device, seeding, the command-line front door, the results file


def set_threads(n):
    """torch's intra-op threads for this process; n = 0 means the default policy. The scripts' small matrices make
    torch's threads spin against any other load on the machine (bench.py's shared_cpu_slowdown measures it), so the
    default is one thread per process: run seeds side by side as separate processes to use more cores."""
    if n < 0:
        raise ValueError(f"--threads must be >= 0 (0: the default policy), got {n}")
    torch.set_num_threads(n or 1)
    return torch.get_num_threads()


def get_device(name="auto"):
    """'auto' -> cuda when available, else cpu; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was asked for, but no CUDA device is available (try --device cpu)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device: use auto, cpu, cuda or cuda:<index>") from None


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2) instead of the whole usage text before it, and no abbreviated
    flags (else a prefix of a flag, say --see, would silently mean the whole one, --seeds)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (--help lists the flags)\n")


def check_args(p, args, *, positive=(), nonnegative=()):
    """One-line parser errors naming the flag for a value that is not finite, or below 1 (int) / not above 0 (float)
    for the flags in `positive`, or below 0 for those in `nonnegative`. Lists (--seeds, --sigma) are checked
    element-wise; None means "not given" and passes."""
    for names, strict in [(positive, True), (nonnegative, False)]:
        for name in names:
            value = getattr(args, name)
            for v in value if isinstance(value, list) else [value]:
                if v is not None and not (math.isfinite(v) and (v > 0 if strict else v >= 0)):
                    bound = "> 0" if strict else ">= 0"
                    p.error(f"--{name.replace('_', '-')} must be "
                            f"{'>= 1' if isinstance(v, int) and strict else 'a finite number ' + bound}, got {v}")


def subset_size(flag, n, available, what):
    """n, or all `available` when n is None; a ValueError naming the flag when n asks for more than there are."""
    if n is None:
        return available
    if n > available:
        raise ValueError(f"{flag} {n} asks for more than the {available} {what}")
    return n


def cli(main, parse_args, argv=None):
    """Run a script's main as a command. Expected failures become one line on stderr and an exit code instead of a
    traceback (TRACEBACK=1 in the environment shows it): bad input, a missing or corrupt file, no CUDA (2); a
    diverged run, whose metrics.json says so (3);
    Ctrl-C, after which metrics.json keeps what was measured and says "interrupted": true (130). Under torchrun the
    process group is left at the end, and rank 0 alone reports a divergence or an interruption."""
    script = os.path.basename(sys.modules[main.__module__].__file__)
    code, message = 0, None
    try:
        data = main(parse_args(argv))
        diverged = [run for run, r in (data or {}).get("runs", {}).items() if r.get("diverged")]
        if diverged:
            code, message = 3, f"{len(diverged)} run(s) diverged ({', '.join(diverged)}); metrics.json marks them"
    except KeyboardInterrupt as e:
        code, message = 130, "interrupted" + (f"; {e.args[0]} keeps every evaluation so far, and the folder's "
                                              "checkpoint.pt what --resume continues from" if e.args else "")
    except torch.OutOfMemoryError:
        code, message = 2, "out of memory; lower --batch-size (or the estimator's chunk)"
    except (ValueError, OSError, EOFError) as e:
        if os.environ.get("TRACEBACK"):  # a developer's bug can raise these too: TRACEBACK=1 shows where
            raise
        if isinstance(e, OSError) and e.filename is not None and e.strerror:
            e = f"{e.strerror}: {e.filename}"
        print(f"{script}: {e}", file=sys.stderr)  # every rank: the error may be its own
        code = 2
    finally:
        rank = ranks()[0]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if message and rank == 0:
        print(f"{script}: {message}", file=sys.stderr)
    if code:
        sys.exit(code)


def strict_json(obj):
    """obj with every non-finite float replaced by None, so that the file is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def write_json(path, obj, replace=True):
    """Write obj as strict JSON (NaN and inf as null) atomically: a temp file in the same folder, then rename, so a
    crash leaves the old file. The file gets the permissions of any other new file (0644 under the usual umask).
    replace=False refuses to replace an existing file (FileExistsError)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(strict_json(obj), fh, indent=1, allow_nan=False)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path exists
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def new_run_dir(script, run_name, out_dir="out"):
    """out/<script>/<run_name>/, made fresh: an existing folder is never reused, a -2, -3, ... suffix is added."""
    base = os.path.join(out_dir, script, run_name)
    path, k = base, 1
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            k += 1
            path = f"{base}-{k}"


def environment(device):
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"torch": torch.__version__, "device": name, "threads": torch.get_num_threads(), "git_commit": commit}


def setup(args):
    """What every script's main does first: the thread policy (--threads), then the device (--device). Under torchrun
    (several processes) it also joins the process group: nccl with one GPU per process (LOCAL_RANK) on CUDA, gloo on
    a CPU; the other ranks' stdout is silenced, so that rank 0 alone prints."""
    set_threads(args.threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
        if cuda:  # one GPU per process; never set on a CPU run (gloo has no device to set)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
        if torch.distributed.get_rank() > 0:
            sys.stdout = open(os.devnull, "w")
        if cuda:
            return torch.device("cuda", torch.cuda.current_device())
    return get_device(args.device)


def ranks():
    """(rank, number of processes): (0, 1) outside torchrun."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def all_sum(*values):
    """The sums over ranks of some numbers (floats); themselves outside torchrun."""
    rank, world = ranks()
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device="cuda" if torch.distributed.get_backend() == "nccl" else "cpu")
    torch.distributed.all_reduce(t)
    return tuple(t.tolist())


def resumed_args(args, script):
    """For --resume FOLDER: the arguments that run was started with, except --resume, --threads and --device, which
    come from this command. The run continues with what it was doing, in that folder."""
    saved = load_results(args.resume, script)["args"]
    keep = {"resume": args.resume, "threads": args.threads, "device": args.device, "plot": None}
    return argparse.Namespace(**{**saved, **keep})


def start_run(script, args, default_name, device):
    """A fresh out/<script>/<run> folder and its metrics.json, after the data are in place (so a missing dataset
    leaves no empty run folder); with --resume, the run folder given, its metrics and checkpoint. Under torchrun rank
    0 alone creates the folder and writes in it, and every rank gets its path."""
    rank, world = ranks()
    folder = None
    if rank == 0:
        folder = args.resume or new_run_dir(script, args.run_name or default_name, args.out_dir)
    if world > 1:
        box = [folder]
        torch.distributed.broadcast_object_list(box, src=0)
        folder = box[0]
    results = Results(folder, script, vars(args), device, write=rank == 0, resume=bool(args.resume))
    threads = torch.get_num_threads()
    print(f"{'resuming' if args.resume else 'writing'} {folder} | device {device} | {threads} thread"
          f"{'s' if threads > 1 else ''}" + (f" | {world} processes" if world > 1 else ""))
    return folder, results


# -----------------------------------------------------------------------------
# the state of a training run, for --resume


def rng_state(generators=()):
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "generators": [g.get_state() for g in generators]}


def set_rng_state(state, generators=()):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for g, s in zip(generators, state["generators"]):
        g.set_state(s)


def snapshot(step, model, opt, generators=(), **extra):
    """A copy of the training state after `step` steps of the loop (its own unit): model, optimizer, every random
    generator that training draws from (Python, NumPy, torch's, CUDA's and the given ones), and `extra` tensors."""
    return {"step": step, "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(opt.state_dict()), "rng": rng_state(generators), **extra}


def restore(snap, model, opt, generators=()):
    """Put a snapshot back: training then continues exactly as the interrupted run would have."""
    model.load_state_dict(snap["model"])
    opt.load_state_dict(snap["optimizer"])
    set_rng_state(snap["rng"], generators)
    return snap["step"]


DIVERGED_FACTOR = 100  # a training loss this many times its initial value (at least 1) means the run diverged


class Results:
    """The metrics.json every script writes, saved atomically after every change so Ctrl-C loses nothing:
    {"script": ..., "args": {...}, "env": {...}, "runs": {"<model>/seed<k>": {"history": [{...}], "final": {...}}}}
    A run whose loss became non-finite holds "diverged": {"step": ..., "loss": null}; an interrupted invocation
    holds "interrupted": true. Beside it, checkpoint.pt holds the latest training state (see checkpoint()).
    write=False (torchrun ranks other than 0) keeps everything in memory only; resume=True reads the folder's
    metrics.json and checkpoint.pt and continues them."""

    def __init__(self, run_dir, script, args, device, write=True, resume=False):
        self.folder, self.write = run_dir, write
        self.path = os.path.join(run_dir, "metrics.json")
        self.first_loss = {}  # run -> its first logged training loss, for diverged()
        self.latest = None  # (run, snapshot) of the latest training state, written by Ctrl-C
        self.resume_point = None
        if resume:
            self.data = load_results(self.path, script)
            self.data.pop("interrupted", None)
            self.data.setdefault("resumed", []).append(environment(device))
            ckpt = os.path.join(run_dir, "checkpoint.pt")
            if os.path.exists(ckpt):
                try:
                    saved = torch.load(ckpt, map_location=device, weights_only=False)
                    self.resume_point = saved["run"], saved["state"]
                except (RuntimeError, EOFError, KeyError, pickle.UnpicklingError) as e:
                    raise ValueError(f"{ckpt} is not a readable checkpoint ({e})") from None
        else:
            self.data = {"script": script, "args": dict(args), "env": environment(device), "runs": {}}
        self.save()

    def _run(self, run):
        return self.data["runs"].setdefault(run, {"history": [], "final": {}})

    def log(self, run, row):
        self._run(run)["history"].append(row)
        self.save()

    def final(self, run, values):
        self._run(run)["final"].update(values)
        self.save()

    def finished(self, run, key=None):
        """Whether a resumed run already has its final numbers (final[key] when given) or diverged: it is not trained
        again."""
        r = self.data["runs"].get(run, {})
        return bool(r.get("diverged") or (key in r.get("final", {}) if key else r.get("final")))

    def resume(self, run, key):
        """The checkpoint's snapshot if it belongs to `run` (else None, and the run starts afresh). The run's history
        rows from that step on (`key`: the history's loop unit) are dropped: they are measured again."""
        if self.resume_point is None or self.resume_point[0] != run:
            self._run(run)["history"] = []
            return None
        snap = self.resume_point[1]
        history = self._run(run)["history"] = [h for h in self._run(run)["history"] if h[key] < snap["step"]]
        if history:  # the divergence limit keeps referring to the run's first loss
            self.first_loss[run] = history[0]["train_loss"]
        return snap

    def checkpoint(self, run, step, evaluating, save_every, model, opt, generators=(), **extra):
        """Called at the top of every step of a training loop: at an evaluation, or every save_every steps, keep a
        snapshot of the state after `step` steps as the latest (Ctrl-C inside recording() writes it), and every
        save_every steps also write it to checkpoint.pt now (atomically: a temp file, renamed)."""
        saving = bool(save_every) and step % save_every == 0
        if evaluating or saving:
            self.latest = (run, snapshot(step, model, opt, generators, **extra))
        if saving:
            self.write_checkpoint()

    def write_checkpoint(self):
        if self.latest is None or not self.write:
            return
        path = os.path.join(self.folder, "checkpoint.pt")
        torch.save({"run": self.latest[0], "state": self.latest[1]}, path + ".tmp")
        os.replace(path + ".tmp", path)

    def diverged(self, run, step, loss, unit="step"):
        """Whether the training `loss` (a float) shows the run diverged: non-finite, or above DIVERGED_FACTOR times
        its first value in this run (the loss at initialisation; at least 1), which a bounded model such as an LSTM
        reaches instead of inf. If so the run is marked diverged at `step` in metrics.json and one line says so.
        Training loops call this at every logged step and after the last one, before measuring anything, so that no
        sensitivity is ever reported for a diverged model."""
        first = self.first_loss.setdefault(run, loss)
        limit = DIVERGED_FACTOR * max(first, 1.0) if math.isfinite(first) else math.inf
        if math.isfinite(loss) and loss <= limit:
            return False
        self._run(run)["diverged"] = {"step": step, "loss": loss}
        self.save()
        why = "not finite" if not math.isfinite(loss) else f"over {DIVERGED_FACTOR}x the initial {first:.3g}"
        if self.write:
            print(f"{run} diverged at {unit} {step} (training loss {loss:.4g}: {why}): stopped, no sensitivity "
                  "reported; lower --lr", file=sys.stderr)
        return True

    @contextlib.contextmanager
    def recording(self):
        """Ctrl-C inside marks metrics.json "interrupted": true and writes the latest training state to
        checkpoint.pt before it propagates (cli() then exits 130); `--resume <folder>` continues from there."""
        try:
            yield self
        except KeyboardInterrupt:
            self.data["interrupted"] = True
            self.save()
            self.write_checkpoint()
            raise KeyboardInterrupt(self.path) from None

    def save(self):
        if self.write:
            write_json(self.path, self.data)


def pm(mean, stderr, n=None):
    """'+0.0123 +- 0.0045 (3 seeds)': a paired difference with its standard error (none shown for one seed)."""
    se = f" +- {stderr:.4f}" if stderr is not None and math.isfinite(stderr) else ""
    return f"{mean:+.4f}{se}" + (f" ({n} seed{'s' if n != 1 else ''})" if n is not None else "")


def model_of(run):
    """The model part of a run name "<model>/seed<k>"."""
    return run.split("/")[0]


def paired_differences(runs, reference, field="per_image"):
    """Paired model comparisons from the runs' final[field] = {key: per-input sensitivities}, measured with the same
    noise on the same inputs by every model: for every model against `reference`, at each key, per seed the mean over
    inputs of (model - reference) with its standard error over inputs, and over the seeds both have the mean of those
    means with its standard error over seeds (null with one seed). Run names are "<model>/seed<k>"."""
    finals = {run: r["final"] for run, r in runs.items() if r["final"].get(field)}
    out = {"reference": reference, "models": {}}
    for m in dict.fromkeys(model_of(run) for run in finals):
        if m == reference:
            continue
        diff = {}
        for run, f in finals.items():
            other = f"{reference}/{run.split('/', 1)[1]}"
            if model_of(run) != m or other not in finals:
                continue
            for key, values in f[field].items():
                if key in finals[other][field]:
                    d = torch.tensor(values, dtype=torch.float64) - torch.tensor(finals[other][field][key],
                                                                                   dtype=torch.float64)
                    se = (d.std() / math.sqrt(len(d))).item()
                    diff.setdefault(key, {})[run.split("/", 1)[1]] = [d.mean().item(), se]
        res = {}
        for key, per_seed in diff.items():
            means = torch.tensor([v[0] for v in per_seed.values()], dtype=torch.float64)
            se = (means.std() / math.sqrt(len(means))).item() if len(means) > 1 else math.nan
            res[key] = {"mean": means.mean().item(), "stderr": se, "seeds": len(means), "per_seed": per_seed}
        out["models"][m] = {"diff": res}
    return out


def plot_curves(ax, histories, x_key, y_key, label, **kw):
    """Mean over seeds of y_key against x_key, with a +-1 std band; histories are the runs' "history" lists."""
    rows = [[(h[x_key], h[y_key]) for h in hist if h.get(y_key) is not None] for hist in histories]
    n = min(len(r) for r in rows)
    if n == 0:
        return
    xs = np.array([x for x, _ in rows[0][:n]], dtype=float)
    ys = np.array([[y for _, y in r[:n]] for r in rows], dtype=float)  # (seeds, points)
    mean, std = ys.mean(0), ys.std(0)
    line, = ax.plot(xs, mean, label=label, **kw)
    if len(ys) > 1:
        ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path):
    """Lay out, write as PNG and close a matplotlib figure; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_combined(script, data, args, plot):
    """Write results combined from several --plot folders to a new run folder (the sources are never written to)
    and draw its figures there."""
    folder = new_run_dir(script, args.run_name or "combined", args.out_dir)
    write_json(os.path.join(folder, "metrics.json"), data)
    print("wrote", os.path.join(folder, "metrics.json"), *plot(data, folder))
    return data


def merge_results(folders, script):
    """One metrics dict from several run folders of `script` (seeds or models run as separate processes): their runs
    merged (a run in two folders is a ValueError), the first folder's args, and the list of sources."""
    out = {"script": script, "sources": list(folders), "runs": {}}
    for folder in folders:
        data = load_results(folder, script)
        out.setdefault("args", data["args"])
        for run, r in data["runs"].items():
            if run in out["runs"]:
                raise ValueError(f"{run} is in more than one of the folders ({folder})")
            out["runs"][run] = r
    return out


def load_results(path, script=None):
    """Read a metrics.json (or the folder holding it); a missing or corrupt file, or one written by another script
    than `script`, is a ValueError that says so."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.json")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"no results file at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid metrics.json ({e})") from None
    if not isinstance(data, dict) or "runs" not in data:
        raise ValueError(f"{path} is not a metrics.json written by this repository (no 'runs')")
    if script is not None and data.get("script", script) != script:
        raise ValueError(f"{path} was written by {data['script']}.py, not {script}.py: redraw it with that script")
    return data
