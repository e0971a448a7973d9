"""Is Boolean sensitivity a progress measure for learning a sparse parity? (App. A.6 of the paper.)

A two-layer transformer learns y = prod_{i in S} x_i on n bits x in {-1, +1}^n with |S| = k. The Boolean sensitivity
(Eq. 1: how many single-bit flips change the prediction, averaged over inputs) of the target is exactly k. The paper
reports that while the test accuracy still sits at 50% the model's sensitivity rises towards k, so that it shows the
hidden progress; the per-bit profile shows whether it concentrates on the k relevant bits (in our runs it does so only
as accuracy jumps; see the README). The paper's sizes were lost; n = 20, k = 3 and the six settings below are our
choice (all flags).

    python parity.py                         # setting 1: n=20, k=3, 8000 steps of batch 256, about 10 minutes
    python parity.py --all-settings          # the six settings of the Fig. 26-style grid, six times that
    python parity.py --n 12 --k 3            # n <= 16 also gets the exact sensitivity from the Fourier spectrum
"""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import report
from common import flip, sensitivity
from runs import (ArgumentParser, Run, add_run_flags, cli, given, nonnegative_float, parse, positive_float,
                  positive_int, restore, seed, seed_all, setup, start_run)

# (train samples, batch size, embedding dim, lr, seed): the six settings of the grid [decided]. With n = 20, k = 3,
# batch 64 at lr 1e-3 did not learn in 15,000 steps on our CPU; batch 256 with AdamW weight decay 0.1 did in 6,000.
SETTINGS = {
    1: dict(n_train=20000, batch_size=256, dim=64, lr=1e-3, seed=0),
    2: dict(n_train=20000, batch_size=256, dim=64, lr=1e-3, seed=1),
    3: dict(n_train=10000, batch_size=256, dim=64, lr=1e-3, seed=0),
    4: dict(n_train=20000, batch_size=128, dim=64, lr=1e-3, seed=0),
    5: dict(n_train=20000, batch_size=256, dim=128, lr=1e-3, seed=0),
    6: dict(n_train=20000, batch_size=256, dim=64, lr=2e-3, seed=0),
}


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    g = p.add_argument_group("task")
    g.add_argument("--n", type=positive_int, default=20, help="number of bits")
    g.add_argument("--k", type=positive_int, default=3, help="number of relevant bits (the parity's degree)")
    g.add_argument("--setting", type=int, default=1, choices=list(SETTINGS), help="preset of the grid (SETTINGS)")
    g.add_argument("--all-settings", action="store_true", help="run all six settings and draw the grid")
    g.add_argument("--n-train", type=positive_int, default=None, help="training samples (default: the setting's)")
    g.add_argument("--n-test", type=positive_int, default=2000, help="test samples")
    g.add_argument("--data-seed", type=seed, default=1234, help="seed of the relevant bits and the data")
    g = p.add_argument_group("model")
    g.add_argument("--dim", type=positive_int, default=None, help="embedding width (default: the setting's)")
    g.add_argument("--depth", type=positive_int, default=2, help="transformer blocks")
    g.add_argument("--heads", type=positive_int, default=4, help="attention heads")
    g.add_argument("--dim-head", type=positive_int, default=None, help="width of one head (default: dim / heads)")
    g.add_argument("--mlp-dim", type=positive_int, default=None, help="hidden width of the MLP (default: 4 * dim)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=positive_float, default=None, help="Adam learning rate (default: the setting's)")
    g.add_argument("--batch-size", type=positive_int, default=None, help="samples per step (default: the setting's)")
    g.add_argument("--weight-decay", type=nonnegative_float, default=0.1, help="AdamW's decoupled weight decay (0: "
                   "plain Adam)")
    g.add_argument("--steps", type=positive_int, default=8000, help="Adam steps")
    g.add_argument("--seeds", type=seed, nargs="+", default=None,
                   help="initialisation/order seeds, each run in turn (default: the setting's seed)")
    g = p.add_argument_group("sensitivity")
    g.add_argument("--eval-every", type=positive_int, default=200, help="Adam steps between evaluations (and at the "
                   "end)")
    g.add_argument("--n-sens", type=positive_int, default=1000, help="training inputs the sensitivity is measured on")
    g.add_argument("--n-eval", type=positive_int, default=None,
                   help="training inputs the train accuracy/loss is measured on (default: 2000, or all if fewer)")
    add_run_flags(p, unit="steps", default_name="n<n>-k<k>-setting<s> or n<n>-k<k>-all")
    args = parse(p, "parity", argv)
    if args.all_settings and given(argv, "--setting"):
        p.error("--all-settings runs all six settings: drop --setting, or drop --all-settings")
    if not 1 <= args.k <= args.n:
        p.error(f"need 1 <= --k <= --n, got --k {args.k} --n {args.n}")
    for s in list(SETTINGS) if args.all_settings else [args.setting]:
        hp = setting(args, s)
        if hp["dim"] % args.heads and args.dim_head is None:
            p.error(f"--dim {hp['dim']} must be a multiple of --heads {args.heads} (or give --dim-head)")
        for flag, n in [("--n-sens", args.n_sens), ("--n-eval", args.n_eval)]:
            if n is not None and n > hp["n_train"]:
                p.error(f"{flag} {n} asks for more than the {hp['n_train']} training samples of setting {s}")
    return args


def setting(args, s):
    """The hyper-parameters of setting s, with any flag given on the command line taking precedence; seeds is the
    list of seeds to run (--seeds, or the setting's one seed)."""
    out = dict(SETTINGS[s])
    for key in ["n_train", "batch_size", "dim", "lr"]:
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    out["seeds"] = args.seeds if args.seeds is not None else [out.pop("seed")]
    out.pop("seed", None)  # the setting's own seed is replaced by --seeds when given
    return out


# -----------------------------------------------------------------------------
# data


def make_task(n, k, n_train, n_test, data_seed):
    """The k relevant bits, training inputs drawn uniformly (repeats allowed), and test inputs none of which is a
    training input: x (N, n, 1) in {-1, +1}, y (N,) in {0, 1}. Everything from data_seed alone."""
    g = torch.Generator().manual_seed(data_seed)
    relevant = torch.randperm(n, generator=g)[:k].sort().values  # the hidden set S
    code = lambda bits: (bits[..., 0] > 0).long() @ (2 ** torch.arange(n))  # noqa: E731  each input as an integer
    x = torch.randint(0, 2, (n_train, n, 1), generator=g).float() * 2 - 1  # uniform over {-1, +1}^n
    seen, test = set(code(x).tolist()), []
    if len(seen) == 2**n:
        raise ValueError(f"--n-train {n_train} inputs cover all {2**n} inputs of {n} bits: none is left to test on")
    while sum(len(t) for t in test) < n_test:  # draw, and drop what training holds (a repeat in test is allowed)
        t = torch.randint(0, 2, (2 * n_test, n, 1), generator=g).float() * 2 - 1
        test.append(t[torch.tensor([c not in seen for c in code(t).tolist()], dtype=torch.bool)])
    xt = torch.cat(test)[:n_test]
    return relevant, (x, (parity(x, relevant) > 0).long()), (xt, (parity(xt, relevant) > 0).long())


def parity(x, relevant):
    """prod_{i in relevant} x_i, in {-1, +1}."""
    return x[:, relevant, 0].prod(1)


# -----------------------------------------------------------------------------
# model: a two-layer transformer over the bits


class Block(nn.Module):
    """Pre-norm transformer block: softmax self-attention over the bits, then a GELU MLP."""

    def __init__(self, dim, heads, dim_head, mlp_dim):
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * heads * dim_head), nn.Linear(heads * dim_head, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x, rows=None):  # rows: compute the first `rows` tokens only (None: all)
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)  # B,nh,T,hs
        q = q[:, :, :rows]  # the queries of the rows computed, over every token's keys
        att = ((q @ k.transpose(-2, -1)) * self.dim_head**-0.5).softmax(-1)  # (B, nh, rows, T)
        x = x[:, :rows] + self.proj((att @ v).transpose(1, 2).reshape(B, q.shape[2], -1))  # heads joined
        return x + self.mlp(self.ln2(x))  # pre-norm MLP


class ParityTransformer(nn.Module):
    """Bits as tokens: an embedding of the bit's value plus a learned position, a class token, two blocks."""

    def __init__(self, n, dim, heads, depth, dim_head=None, mlp_dim=None):
        super().__init__()
        self.bit = nn.Embedding(2, dim)  # the value -1 or +1
        self.pos = nn.Parameter(0.02 * torch.randn(1, n + 1, dim))  # which bit a token is (and the class token)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, dim))  # read by the head: it attends to the bits
        self.blocks = nn.Sequential(*[Block(dim, heads, dim_head or dim // heads, mlp_dim or 4 * dim)
                                      for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2))

    def embed(self, x):  # x (B, n, 1) in {-1, +1} -> (B, n + 1, dim): the class token, then the bits
        tok = self.bit((x[..., 0] > 0).long())  # (B, n, dim)
        return torch.cat([self.cls.expand(len(x), -1, -1), tok], dim=1) + self.pos

    def forward(self, x):
        # the last block computes the class token alone, all the head reads: the same logits and gradients as every
        # token's computation up to float rounding, a training step 1.3-1.8x faster (bench.py)
        return self.head(self.blocks[-1](self.blocks[:-1](self.embed(x)), rows=1)[:, 0])  # two logits from the class


# -----------------------------------------------------------------------------
# exact reference for small n: the Fourier spectrum of the model's truth table


def all_inputs(n):
    """All 2^n points of {-1, +1}^n as (2^n, n, 1); row i has bit j = +1 iff bit j of i is 0."""
    i = torch.arange(2**n)
    bits = (i[:, None] >> torch.arange(n)) & 1  # (2^n, n): the binary digits of each i
    return (1 - 2 * bits).float()[..., None]


def walsh_hadamard(values):
    """Fourier coefficients f_hat(S) = E_x f(x) chi_S(x) of a function given on all_inputs(n), by the fast
    Walsh-Hadamard transform; entry m is the coefficient of S = {j : bit j of m is 1}."""
    h = values.double().clone()
    n = h.numel().bit_length() - 1
    for j in range(n):  # one butterfly per bit: n * 2^n operations instead of 4^n
        h = h.view(-1, 2, 2**j)  # pairs of entries that differ in bit j only
        h = torch.stack([h[:, 0] + h[:, 1], h[:, 0] - h[:, 1]], dim=1)
    return h.flatten() / 2**n


def exact_sensitivity(model, n, device):
    """Average Boolean sensitivity sum_S |S| f_hat(S)^2 of the model's +-1 prediction over all 2^n inputs."""
    x = all_inputs(n).to(device)
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + 8192]).argmax(1) for i in range(0, len(x), 8192)])  # its whole truth table
    coeffs = walsh_hadamard((pred * 2 - 1).cpu())  # of the +-1 prediction
    degree = torch.tensor([bin(m).count("1") for m in range(2**n)], dtype=torch.float64)  # |S| of each coefficient
    return (degree * coeffs**2).sum().item()


# -----------------------------------------------------------------------------
# training


@torch.no_grad()
def evaluate(model, sets):
    """Loss and accuracy on each set."""
    model.eval()
    row = {}
    for name, (x, y) in sets.items():
        logits = torch.cat([model(x[i:i + 4096]) for i in range(0, len(x), 4096)])  # in chunks: bounded memory
        row[f"{name}_loss"] = F.cross_entropy(logits, y).item()
        row[f"{name}_acc"] = (logits.argmax(1) == y).float().mean().item()
    return row


@torch.no_grad()
def measure_sensitivity(model, sens_x, relevant_mask, n):
    """Boolean sensitivity on sens_x: normalised (/ n), as a count (Eq. 1), per bit, and on the k relevant bits."""
    model.eval()
    row = {}
    s = sensitivity(lambda xb, idx: model(xb), sens_x, flip(), seed=0)  # flips draw no noise
    row["sens"], row["sens_stderr"] = s.mean, s.stderr  # normalised by n
    row["sens_count"], row["sens_count_stderr"] = s.mean * n, s.stderr * n  # Eq. 1: flips summed over the bits
    row["sens_relevant"] = s.per_position[relevant_mask].sum().item()  # of which on the k relevant bits
    row["sens_by_bit"] = s.per_position.tolist()  # does it concentrate on the relevant bits?
    return row


def train_one(args, s, seed, task, results, device):
    """Train setting s with one seed on task = make_task(...) of that setting."""
    hp = setting(args, s)
    relevant, train, test = task
    x_train, y_train = (t.to(device) for t in train)  # (N, n, 1) bits in {-1, +1}, (N,) parity in {0, 1}
    n_eval = args.n_eval or min(2000, len(x_train))
    # train accuracy on a fixed subset (evaluating all 20,000 every 200 steps would cost more than training)
    sets = {"train": (x_train[:n_eval], y_train[:n_eval]), "test": tuple(t.to(device) for t in test)}
    sens_x = x_train[: args.n_sens]
    relevant_mask = torch.zeros(args.n, dtype=torch.bool)  # (n,) True on the k bits the parity reads
    relevant_mask[relevant] = True
    run = Run(f"setting{s}", seed)
    if results.finished(run):
        return None
    seed_all(seed)  # the initialisation depends on the seed alone
    model = ParityTransformer(args.n, hp["dim"], args.heads, args.depth, args.dim_head, args.mlp_dim).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], weight_decay=args.weight_decay)  # the decay helps it learn
    print(f"{run}: {hp} relevant bits {relevant.tolist()}, {sum(p.numel() for p in model.parameters())} parameters")
    gen = torch.Generator(device).manual_seed(seed)  # the minibatch order, kept in checkpoints
    start = restore(snap, model, opt, [gen]) if (snap := results.resume(run, "step")) else 0
    progress = results.progress(run, start, args.steps, args.eval_every)  # a line every --progress-every seconds
    t0, loss = time.time(), None
    for step in range(start, args.steps + 1):
        evaluating = step % args.eval_every == 0 or step == args.steps
        progress.tick(step, evaluating, loss)
        results.checkpoint(run, step, evaluating, args.save_every, model, opt, [gen])  # for --resume
        if evaluating:
            row = {"step": step, **evaluate(model, sets)}
            if results.diverged(run, step, row["train_loss"]):
                return None
            # the claim: during the 50% plateau this rises towards k, the target's own sensitivity
            row.update(measure_sensitivity(model, sens_x, relevant_mask, args.n), time=time.time() - t0)
            results.log(run, row)
            print(f"{run} step {step:5d} | train acc {row['train_acc']:.3f} | test acc {row['test_acc']:.3f} | "
                  f"sens count {row['sens_count']:.3f} +- {row['sens_count_stderr']:.3f} (on relevant bits "
                  f"{row['sens_relevant']:.3f}) | {row['time']:.0f}s")
        if step == args.steps:
            break
        model.train()
        b = torch.randint(len(x_train), (hp["batch_size"],), generator=gen, device=device)  # with replacement
        loss = F.cross_entropy(model(x_train[b]), y_train[b])  # two classes: parity 0 or 1
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    final = {k: row[k] for k in ["sens", "sens_stderr", "sens_count", "sens_count_stderr", "sens_relevant",
                                 "train_acc", "test_acc", "sens_by_bit"]}
    final["relevant_bits"] = relevant.tolist()
    final["time"] = row["time"]
    if args.n <= 16:  # 2^n inputs are few enough to read the exact value off the Fourier spectrum
        final["sens_count_exact"] = exact_sensitivity(model.eval(), args.n, device)
    results.final(run, final)
    return final


# -----------------------------------------------------------------------------


def main(args):
    which = list(SETTINGS) if args.all_settings else [args.setting]
    name = f"n{args.n}-k{args.k}-" + ("all" if args.all_settings else f"setting{args.setting}")
    device = setup(args)
    # the data first: a task that cannot be made (no input left to test on) leaves no run folder behind
    tasks = {s: make_task(args.n, args.k, setting(args, s)["n_train"], args.n_test, args.data_seed) for s in which}
    folder, results = start_run("parity", args, name, device)
    try:
        with results.recording():  # Ctrl-C or SIGTERM: metrics kept, checkpoint written
            for s in which:
                for seed in setting(args, s)["seeds"]:
                    train_one(args, s, seed, tasks[s], results, device)
        report.summary(results.data)  # per run and setting: the final count, and the plateau before learning
    finally:  # also after Ctrl-C: draw what there is (python report.py redraws it)
        if not args.no_figures and (paths := report.draw(results.data, folder)):
            print("wrote", *paths)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
