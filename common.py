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

import json
import math
import os
import random
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

# -----------------------------------------------------------------------------
# perturbations: each maps the (M, D) tokens being perturbed to their perturbed values


def gaussian(sigma):
    """Add isotropic noise N(0, sigma^2 I); sigma is a standard deviation."""
    if not sigma >= 0:  # also rejects NaN
        raise ValueError(f"sigma must be a standard deviation >= 0, got {sigma}")

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
    stderr: float  # standard error of `mean` over inputs
    per_position: torch.Tensor  # (T,) flip rate at each position over the inputs where it is valid; NaN if never
    per_input: torch.Tensor  # (N,) flip rate of each input, averaged over its valid positions
    evaluations: int  # number of perturbed forward passes


def predict(out):
    """Class labels from f's output: argmax of (B, C) logits, or the (B,) labels themselves."""
    return out.argmax(-1) if out.ndim == 2 else out


def default_batch_size(x):
    """Rows per chunk: about 64 MB of input on CUDA. On a CPU a chunk runs fastest while its activations stay in
    cache, so we budget 600k floats for each row's T*D input plus a T*T attention map (on 2 cores a small ViT runs
    10k rows/s at 100 rows but 6k at 512, while an MLP keeps gaining up to 600 rows)."""
    _, T, D = x.shape
    rows = 2**24 // (T * D) if x.device.type == "cuda" else 600_000 // (T * (T + D))
    return min(max(rows, 64), 16384)


def sensitivity(f, x, perturb, *, mask=None, reps=1, positions=None, batch_size=None, generator=None):
    """Estimate the token-wise sensitivity of f on x (N, T, D), perturbing one token per copy.

    f(x_batch, idx) returns logits (B, C) or labels (B,) for a (B, T, D) batch; idx (B,) are the rows of x the copies
    came from. Put the model in eval mode first (dropout would count as flips). mask (N, T) bool marks the positions
    that may be perturbed. positions=None perturbs every valid position `reps` times (exact per-position profile);
    positions=k samples k valid positions per input per rep, uniformly with replacement (unbiased, cheaper for long
    inputs). batch_size: rows per chunk, default_batch_size(x) if None. generator: a torch.Generator on x's device,
    for reproducible noise.
    """
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
    batch_size = batch_size or default_batch_size(x)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n_valid = mask.sum(1)  # (N,)
    if not bool((n_valid > 0).all()):  # one host sync, before the loop
        raise ValueError("mask has a row with no True position: every input needs a position to perturb")

    with torch.inference_mode():
        # clean predictions, once
        clean = torch.cat([predict(f(x[i:i + batch_size], torch.arange(i, min(i + batch_size, N), device=x.device)))
                           for i in range(0, N, batch_size)])
        if positions is None:
            flat_valid = mask.flatten().nonzero().squeeze(1)  # (V,) flat n*T+t of every valid position
            n_jobs = len(flat_valid) * reps
        else:
            # valid positions first in each row, so the u-th valid position of row n is order[n, u]
            order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)  # (N, T)
            n_jobs = N * positions * reps
        flips = torch.zeros(N * T, dtype=torch.long, device=x.device)
        trials = torch.zeros(N * T, dtype=torch.long, device=x.device)
        buf = torch.empty(min(batch_size, n_jobs), T, D, dtype=x.dtype, device=x.device)  # reused by every chunk
        for start in range(0, n_jobs, batch_size):
            job = torch.arange(start, min(start + batch_size, n_jobs), device=x.device)
            if positions is None:
                cell = flat_valid[job % len(flat_valid)]  # job -> (rep, valid position)
                n, t = cell // T, cell % T
            else:
                n = job // (positions * reps)  # job -> (input, draw)
                u = (torch.rand(len(job), generator=generator, device=x.device) * n_valid[n]).long()
                t = order[n, torch.minimum(u, n_valid[n] - 1)]  # the min guards against float rounding up
                cell = n * T + t
            xb = torch.index_select(x, 0, n, out=buf[:len(job)])  # (B, T, D) copies of the clean inputs
            flat = xb.view(-1, D)  # (B*T, D); row b*T + t is token t of copy b
            which = torch.arange(len(job), device=x.device) * T + t
            flat.index_copy_(0, which, perturb(flat.index_select(0, which), generator))
            changed = predict(f(xb, n)) != clean.index_select(0, n)
            flips.index_add_(0, cell, changed.long())
            trials.index_add_(0, cell, torch.ones_like(cell))

    flips, trials = flips.view(N, T).double().cpu(), trials.view(N, T).double().cpu()
    per_input = flips.sum(1) / trials.sum(1)
    per_position = flips.sum(0) / trials.sum(0)  # 0/0 = NaN where never valid
    stderr = per_input.std().item() / math.sqrt(N) if N > 1 else float("nan")
    return Sensitivity(per_input.mean().item(), stderr, per_position.float(), per_input.float(), n_jobs)


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
# plumbing every script repeats: device, seeding, the results file


def get_device(name="auto"):
    """'auto' -> cuda when available, else cpu; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was asked for, but no CUDA device is available")
    return torch.device(name)


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def write_json(path, obj):
    """Write obj as JSON atomically: a temp file in the same folder, then rename (a crash leaves the old file)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=1, allow_nan=True)
        os.replace(tmp, path)
    except BaseException:
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
    return {"torch": torch.__version__, "device": name, "git_commit": commit}


def start_run(script, args, default_name):
    """What every script's main does first: the device, a fresh out/<script>/<run> folder, its metrics.json."""
    device = get_device(args.device)
    folder = new_run_dir(script, args.run_name or default_name, args.out_dir)
    results = Results(folder, vars(args), device)
    print(f"writing {folder}")
    return device, folder, results


class Results:
    """The metrics.json every script writes, saved atomically after every change so Ctrl-C loses nothing:
    {"args": {...}, "env": {...}, "runs": {"<model>/seed<k>": {"history": [{...}, ...], "final": {...}}}}"""

    def __init__(self, run_dir, args, device):
        self.path = os.path.join(run_dir, "metrics.json")
        self.data = {"args": dict(args), "env": environment(device), "runs": {}}
        self.save()

    def _run(self, run):
        return self.data["runs"].setdefault(run, {"history": [], "final": {}})

    def log(self, run, row):
        self._run(run)["history"].append(row)
        self.save()

    def final(self, run, values):
        self._run(run)["final"].update(values)
        self.save()

    def save(self):
        write_json(self.path, self.data)


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


def load_results(path):
    """Read a metrics.json (or the folder holding it); a missing or corrupt file is a ValueError that says so."""
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
    return data
