"""Does one self-attention layer prefer the low-sensitivity solution? (Sec. 4.1, Figs. 3 and 12 of the paper.)

Each sequence carries its label twice: in a few "sparse" tokens (all n_s of them from S_y) and in a majority vote of
many "frequent" tokens (alpha * n_f from F_y, the rest from F_-y). Both features predict the label perfectly on the
training data. The OOD test set draws the sparse tokens from the *other* label's set, so its accuracy falls to ~0 if
and only if the model relies on the sparse tokens. The two presets make one or the other solution the less sensitive
one (to replacing one token by a uniformly random vocabulary token), and the model follows the less sensitive one:

- sparse-lower   n_s = 3, frequent margin (2 alpha - 1) n_f = 1: the sparse vote is less sensitive -> OOD accuracy ~0
- frequent-lower n_s = 1, alpha = 1 (margin n_f = 10): the frequent vote is less sensitive -> OOD accuracy stays ~1

The paper's sizes were lost; the ones below and in the flags are our choice (see the README).

    python synthetic.py                          # both presets, 3 seeds each, one figure (56-185 s on one CPU thread)
    python synthetic.py --case sparse-lower --seeds 0
    python synthetic.py --fig12                  # 4 settings per case (Fig. 12 grid), 5-15 minutes
    python report.py out/synthetic/cases          # redraw the figure and the summary from metrics.json
"""

import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import report
from common import replace, sensitivity
from runs import (ArgumentParser, Run, add_run_flags, cli, nonnegative_float, parse, positive_float, positive_int,
                  restore, seed, seed_all, setup, start_run)

# the two presets of Fig. 3; sizes not named here come from the flags
CASES = {
    "sparse-lower": dict(n_sparse=3, n_frequent=9, alpha=5 / 9),
    "frequent-lower": dict(n_sparse=1, n_frequent=10, alpha=1.0),
}
# Fig. 12: three more settings per case, each varying one of n, n_s, alpha (the margins keep each case's ordering)
FIG12 = {
    "sparse-lower": [dict(n=30), dict(n_sparse=4), dict(n_frequent=7, alpha=4 / 7)],
    "frequent-lower": [dict(n=30), dict(n_frequent=8), dict(alpha=0.9)],
}


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    g = p.add_argument_group("experiment")
    g.add_argument("--case", type=str, nargs="+", default=list(CASES), choices=list(CASES), help="presets to run")
    g.add_argument("--fig12", action="store_true", help="also run the 3 extra settings per case of Fig. 12")
    g.add_argument("--seeds", type=seed, nargs="+", default=[0, 1, 2], help="initialisation/order seeds")
    g = p.add_argument_group("data (sizes the presets do not set)")
    g.add_argument("--n", type=positive_int, default=20, help="sequence length (tokens)")
    g.add_argument("--n-sparse", type=positive_int, default=None, help="sparse slots n_s (default: the preset's)")
    g.add_argument("--n-frequent", type=positive_int, default=None, help="frequent slots n_f (default: the preset's)")
    g.add_argument("--alpha", type=nonnegative_float, default=None, help="fraction of frequent slots from F_y "
                   "(default: the preset's)")
    g.add_argument("--sparse-set", type=positive_int, default=2, help="|S_+| = |S_-| (tokens)")
    g.add_argument("--frequent-set", type=positive_int, default=10, help="|F_+| = |F_-| (tokens)")
    g.add_argument("--irrelevant-set", type=positive_int, default=20, help="|R| (tokens)")
    g.add_argument("--n-train", type=positive_int, default=4000, help="training sequences")
    g.add_argument("--n-test", type=positive_int, default=2000, help="test and OOD test sequences (each)")
    g.add_argument("--data-seed", type=seed, default=1234, help="seed of the data generator (fixed across --seeds)")
    g = p.add_argument_group("model and optimisation")
    g.add_argument("--dim-head", type=positive_int, default=16, help="value width of the attention head")
    g.add_argument("--init-std", type=positive_float, default=0.1, help="std of the small random initialisation")
    g.add_argument("--lr", type=positive_float, default=0.5, help="SGD learning rate (constant)")
    g.add_argument("--steps", type=positive_int, default=2000, help="SGD steps")
    g.add_argument("--batch-size", type=positive_int, default=100, help="sequences per step (paper: 100)")
    g = p.add_argument_group("sensitivity")
    g.add_argument("--eval-every", type=positive_int, default=50, help="SGD steps between evaluations (and at the end)")
    g.add_argument("--n-sens", type=positive_int, default=1000, help="training sequences measured on")
    g.add_argument("--reps", type=positive_int, default=2, help="random replacements per (sequence, position)")
    add_run_flags(p, unit="steps", default_name="cases, or fig12 with --fig12", device="cpu")  # tiny: cpu is fastest
    args = parse(p, "synthetic", argv)
    d = 2 * args.sparse_set + 2 * args.frequent_set + args.irrelevant_set  # the one-hot width
    if max(args.n_train, args.n_test) * args.n * d * 4 > 2**32:  # evaluation holds a set's one-hot tokens at once
        p.error(f"--n-train {args.n_train} / --n-test {args.n_test} sequences of {args.n} one-hot tokens of width {d} "
                "would take over 4 GB to evaluate: use fewer")
    if args.n_sens > args.n_train:
        p.error(f"--n-sens {args.n_sens} asks for more than the --n-train {args.n_train} training sequences")
    try:
        settings(args)
    except ValueError as e:
        p.error(str(e))
    return args


def settings(args):
    """The list of (name, data sizes) this invocation runs; a ValueError for sizes that do not fit together."""
    out = []
    for case in args.case:
        base = dict(n=args.n, **CASES[case])
        for key in ["n_sparse", "n_frequent", "alpha"]:
            if getattr(args, key) is not None:
                base[key] = getattr(args, key)
        variants = [{}] + (FIG12[case] if args.fig12 else [])
        for v in variants:
            s = {**base, **v}
            label = case if not v else case + ":" + ",".join(f"{k}={s[k]:.3g}" for k in v)
            check_sizes(s)
            out.append((label, s))
    return out


def check_sizes(s):
    """A ValueError unless the sizes of one setting make a task where both features predict the label."""
    if s["n_sparse"] < 1 or s["n_frequent"] < 1 or s["n_sparse"] + s["n_frequent"] > s["n"]:
        raise ValueError(f"need n_s >= 1, n_f >= 1 and n_s + n_f <= n, got {s}")
    if not 0.5 < s["alpha"] <= 1:
        raise ValueError(f"alpha must be in (0.5, 1] so that the frequent vote predicts the label, got {s['alpha']}")
    k = s["alpha"] * s["n_frequent"]
    if abs(k - round(k)) > 1e-6:
        raise ValueError(f"alpha * n_f must be a whole number of tokens, got {s['alpha']} * {s['n_frequent']}")


# -----------------------------------------------------------------------------
# data (Defs. 4.2, 4.3)


class Vocab:
    """Token ids laid out as [S_+ | S_- | F_+ | F_- | R]; tokens are the one-hot rows of eye(d)."""

    def __init__(self, sparse_set, frequent_set, irrelevant_set):
        self.s, self.f, self.r = sparse_set, frequent_set, irrelevant_set
        self.d = 2 * sparse_set + 2 * frequent_set + irrelevant_set
        self.kind = torch.tensor([0] * 2 * self.s + [1] * 2 * self.f + [2] * self.r)  # 0 sparse, 1 frequent, 2 irr.
        sign = [1] * self.s + [-1] * self.s + [1] * self.f + [-1] * self.f + [0] * self.r
        self.sign = torch.tensor(sign)  # which label a token votes for
        self.v_sparse = ((self.kind == 0) * self.sign).float()  # 1_{S+} - 1_{S-}
        self.v_frequent = ((self.kind == 1) * self.sign).float()  # 1_{F+} - 1_{F-}
        self.v_irrelevant = (self.kind == 2).float()  # 1_R

    def to(self, device):
        v = copy.copy(self)  # a shallow copy whose tensors live on the device
        for name in ["kind", "sign", "v_sparse", "v_frequent", "v_irrelevant"]:
            setattr(v, name, getattr(self, name).to(device))
        return v

    def sparse(self, y):  # first id of S_y for y in {+1, -1}
        return torch.where(y > 0, 0, self.s)

    def frequent(self, y):  # first id of F_y
        return 2 * self.s + torch.where(y > 0, 0, self.f)


def make_data(vocab, n, n_sparse, n_frequent, alpha, size, generator, ood=False):
    """(ids (size, n), y (size,) in {-1, +1}). ood=True draws the sparse slots from S_-y instead of S_y."""
    g = generator
    y = torch.randint(0, 2, (size,), generator=g) * 2 - 1  # balanced labels in {-1, +1}
    n_y = round(alpha * n_frequent)  # frequent slots that vote for y; the other n_f - n_y vote against it
    slot_sparse = vocab.sparse(-y if ood else y)[:, None] + torch.randint(vocab.s, (size, n_sparse), generator=g)
    slot_fy = vocab.frequent(y)[:, None] + torch.randint(vocab.f, (size, n_y), generator=g)
    slot_fny = vocab.frequent(-y)[:, None] + torch.randint(vocab.f, (size, n_frequent - n_y), generator=g)
    n_rest = n - n_sparse - n_frequent  # the rest of the sequence: irrelevant tokens
    slot_r = 2 * vocab.s + 2 * vocab.f + torch.randint(vocab.r, (size, n_rest), generator=g)
    ids = torch.cat([slot_sparse, slot_fy, slot_fny, slot_r], dim=1)  # (size, n) in slot order
    order = torch.argsort(torch.rand(ids.shape, generator=g), dim=1)  # shuffle the slots within each sequence
    return ids.gather(1, order), y


def vote(vocab, ids, kind):
    """Signed vote of one token kind: (#tokens of that kind for +) - (#for -)."""
    return ((vocab.kind[ids] == kind) * vocab.sign[ids]).sum(1)


def vote_classifier(vocab, kind):
    """The candidate function sign(vote) on one-hot inputs, as class ids {0: -, 1: tie, 2: +}. A tie is its own
    output, so a perturbation that ties the vote counts as a change (clean inputs never tie)."""
    return lambda x, idx: vote(vocab, x.argmax(-1), kind).sign() + 1


# -----------------------------------------------------------------------------
# model (Eq. 3): one single-head self-attention layer and a linear head


class AttentionClassifier(nn.Module):
    """score(X) = theta^T mean_t [softmax(X W X^T) X W_V]_t, label sign(score). W = W_Q W_K^T is kept as one (d, d)
    key-query matrix, as in the token-selection analyses this model comes from: with two small factors its gradient
    would start near zero and the attention would hardly move from uniform."""

    def __init__(self, d, d_head, init_std):
        super().__init__()
        self.W = nn.Parameter(init_std * torch.randn(d, d))  # key-query affinity of every (query, key) token pair
        self.W_V = nn.Parameter(init_std * torch.randn(d, d_head))  # values
        self.theta = nn.Parameter(init_std * torch.randn(d_head))  # the linear head

    def attention(self, x):  # x (B, n, d) one-hot tokens
        att = (x @ self.W) @ x.transpose(-2, -1)  # (B, n, n): row = query, column = key
        return att.softmax(-1)

    def forward(self, x):
        h = (self.attention(x) @ (x @ self.W_V)).mean(1)  # (B, d_head): attend, then average over the queries
        return h @ self.theta  # (B,) score; > 0 means label +

    def head_in_token_space(self):
        """w = W_V theta (d,): how much each vocabulary token pushes the score towards +."""
        return self.W_V @ self.theta


# -----------------------------------------------------------------------------
# metrics


@torch.no_grad()
def evaluate(model, vocab, onehot, sets, sens_x):
    """Accuracies on each set, the training loss, head alignment, attention mass per token kind."""
    row = {}
    for name, (ids, y) in sets.items():
        score = model(onehot[ids])  # (N,): > 0 predicts +
        row[f"{name}_acc"] = ((score > 0).long() * 2 - 1 == y).float().mean().item()  # OOD ~0: the sparse feature
        if name == "train":
            row["train_loss"] = F.softplus(-y * score).mean().item()
    w = model.head_in_token_space()  # which tokens the head reads, and with which sign
    for kind in ["sparse", "frequent", "irrelevant"]:
        row[f"align_{kind}"] = F.cosine_similarity(w, getattr(vocab, f"v_{kind}"), dim=0).item()
    ids = sets["train"][0][: len(sens_x)]  # the ids behind sens_x, to know each key's kind
    att = model.attention(sens_x)  # (N, n, n)
    key_kind = vocab.kind[ids]  # (N, n)
    for k, kind in enumerate(["sparse", "frequent", "irrelevant"]):
        row[f"att_{kind}"] = (att * (key_kind == k)[:, None, :]).sum(-1).mean().item()  # mass on that kind
    return row


# -----------------------------------------------------------------------------
# training


def make_sets(vocab, args, sizes):
    """{"train", "test", "ood"}: (ids, y) of one setting, drawn from --data-seed alone (not from --seeds)."""
    g = torch.Generator().manual_seed(args.data_seed)  # one generator, drawn in this order: every seed the same sets
    return {"train": make_data(vocab, size=args.n_train, generator=g, **sizes),
            "test": make_data(vocab, size=args.n_test, generator=g, **sizes),
            "ood": make_data(vocab, size=args.n_test, generator=g, ood=True, **sizes)}


def train_one(args, label, sizes, seed, results, device):
    """Train the attention classifier of one setting with one seed; log every --eval-every steps and at the end."""
    vocab = Vocab(args.sparse_set, args.frequent_set, args.irrelevant_set)
    onehot = torch.eye(vocab.d, device=device)  # token id -> its one-hot input row
    sets = make_sets(vocab, args, sizes)
    vocab_dev = vocab.to(device)
    sets = {k: (ids.to(device), y.to(device)) for k, (ids, y) in sets.items()}
    sens_x = onehot[sets["train"][0][: args.n_sens]]  # (n_sens, n, d), a fixed subset of the training set

    run = Run(label, seed)
    if results.finished(run):
        return None
    # the two candidate functions do not train: their sensitivity is measured once, on the same inputs
    cand = {}
    for kind, name in [(0, "sparse"), (1, "frequent")]:
        s = sensitivity(vote_classifier(vocab_dev, kind), sens_x, replace(onehot), reps=args.reps, seed=seed)
        cand[f"sens_{name}_fn"], cand[f"sens_{name}_fn_stderr"] = s.mean, s.stderr

    seed_all(seed)  # the initialisation depends on the seed alone
    model = AttentionClassifier(vocab.d, args.dim_head, args.init_std).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    order = torch.Generator(device).manual_seed(seed)  # the minibatch order, kept in checkpoints
    start = restore(snap, model, opt, [order]) if (snap := results.resume(run, "step")) else 0
    ids_train, y_train = sets["train"]
    progress = results.progress(run, start, args.steps, args.eval_every)  # a line every --progress-every seconds
    t0, loss = time.time(), None
    for step in range(start, args.steps + 1):
        evaluating = step % args.eval_every == 0 or step == args.steps
        progress.tick(step, evaluating, loss)
        results.checkpoint(run, step, evaluating, args.save_every, model, opt, [order])  # for --resume
        if evaluating:
            row = {"step": step, **evaluate(model, vocab_dev, onehot, sets, sens_x)}
            if results.diverged(run, step, row["train_loss"]):
                return None
            # the same replacements at every evaluation (seed fixed), so the curve's steps are not noise
            s = sensitivity(lambda xb, idx: model(xb), sens_x, replace(onehot), reps=args.reps, seed=10_000 + seed)
            row.update(sens=s.mean, sens_stderr=s.stderr, **cand, time=time.time() - t0)
            results.log(run, row)
            print(f"{run} step {step:5d} | loss {row['train_loss']:.4f} | train {row['train_acc']:.3f} | "
                  f"test {row['test_acc']:.3f} | ood {row['ood_acc']:.3f} | sens {row['sens']:.4f} | "
                  f"align s/f {row['align_sparse']:+.2f}/{row['align_frequent']:+.2f} | {row['time']:.1f}s")
        if step == args.steps:
            break
        b = torch.randint(args.n_train, (args.batch_size,), generator=order, device=device)  # sampled with replacement
        # logistic loss log(1 + exp(-y f(x))) on labels y in {-1, +1}
        loss = F.softplus(-y_train[b] * model(onehot[ids_train[b]])).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    final = {k: row[k] for k in ["sens", "sens_stderr", "train_acc", "test_acc", "ood_acc", "align_sparse",
                                 "align_frequent", "align_irrelevant", "att_sparse", "att_frequent",
                                 "att_irrelevant", "sens_sparse_fn", "sens_frequent_fn"]}
    results.final(run, final)
    return final


# -----------------------------------------------------------------------------


def main(args):
    device = setup(args)
    folder, results = start_run("synthetic", args, "fig12" if args.fig12 else "cases", device)
    try:
        with results.recording():  # Ctrl-C or SIGTERM: metrics kept, checkpoint written
            for label, sizes in settings(args):
                for seed in args.seeds:
                    train_one(args, label, sizes, seed, results, device)
    finally:  # also after Ctrl-C: metrics.json is already saved, draw what there is (python report.py redraws it)
        if not args.no_figures and (paths := report.draw(results.data, folder)):
            print("wrote", *paths)
    report.summary(results.data)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
