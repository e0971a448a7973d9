"""Is sensitivity a progress measure for grokking? (Sec. 7.3, App. A.5 of the paper.)

A one-layer transformer learns (a + b) mod p from 30% of all pairs with full-batch AdamW and strong weight decay: it
memorises the training set early, and only much later generalises ("groks"). The paper's claim: the sensitivity of the
model to Gaussian noise on the number embeddings (measured on the training set) keeps falling during the plateau
where train accuracy is 100% and test accuracy is still low, so it tracks the hidden progress, unlike the weight norm.

    python grokking.py                         # p = 113, one seed; see the README for the wall time on a CPU
    python grokking.py --seeds 0 1 2
    python grokking.py --p 53 --epochs 6000    # a smaller task that groks sooner
    python grokking.py --stop-after-grok 1000  # end 1,000 epochs after test accuracy passes 95% (reproduce.sh)
    python report.py out/grokking/p113         # redraw the figure from metrics.json
"""

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import report
from common import gaussian, sensitivity
from runs import (ArgumentParser, Run, add_run_flags, checked, cli, nonnegative_float, nonnegative_int, parse,
                  positive_float, positive_int, restore, seed, seed_all, setup, start_run)


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    g = p.add_argument_group("task")
    g.add_argument("--p", type=checked(int, lambda v: v >= 2, "an integer >= 2"), default=113,
                   help="the modulus (a prime in the paper)")
    g.add_argument("--frac-train", type=float, default=0.3, help="fraction of all p^2 pairs used for training")
    g.add_argument("--data-seed", type=seed, default=598, help="seed of the train/test split (fixed across --seeds)")
    g = p.add_argument_group("model")
    g.add_argument("--dim", type=positive_int, default=128, help="residual stream width (d_model)")
    g.add_argument("--heads", type=positive_int, default=4, help="attention heads (each of width dim / heads)")
    g.add_argument("--mlp-dim", type=positive_int, default=512, help="MLP hidden width (d_mlp)")
    g.add_argument("--no-residual", action="store_true", help="the authors' variant without skip connections")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=positive_int, default=20000, help="full-batch AdamW steps")
    g.add_argument("--stop-after-grok", type=nonnegative_int, default=None, metavar="EPOCHS",
                   help="end a run EPOCHS epochs after it groks (test accuracy first > 95%%, at an evaluation), "
                        "before --epochs; default: train every --epochs")
    g.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate")
    g.add_argument("--weight-decay", type=nonnegative_float, default=1.0, help="AdamW weight decay")
    g.add_argument("--seeds", type=seed, nargs="+", default=[0], help="initialisation seeds")
    g = p.add_argument_group("sensitivity")
    g.add_argument("--sigma", type=nonnegative_float, default=0.1, help="std of the noise on the number embeddings")
    g.add_argument("--reps", type=positive_int, default=2, help="noise draws per (training pair, position)")
    g.add_argument("--eval-every", type=positive_int, default=100, help="epochs between evaluations")
    add_run_flags(p, unit="epochs", default_name="p<p>")
    args = parse(p, "grokking", argv)
    if not 0 < args.frac_train < 1:
        p.error(f"--frac-train must be in (0, 1), got {args.frac_train}")
    if int(args.frac_train * args.p**2) < 1:
        p.error(f"--frac-train {args.frac_train} of {args.p**2} pairs leaves no training pair")
    if args.dim % args.heads:
        p.error(f"--dim {args.dim} must be a multiple of --heads {args.heads}")
    return args


# -----------------------------------------------------------------------------
# data: every pair (a, b) as the tokens "a b =", label (a + b) mod p


def make_data(p, frac_train, seed):
    """tokens (p^2, 3) with '=' as token p, labels (p^2,), and a boolean train mask from its own generator."""
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")  # every pair: the whole task
    a, b = a.flatten(), b.flatten()
    tokens = torch.stack([a, b, torch.full_like(a, p)], dim=1)  # (p^2, 3): "a b ="
    labels = (a + b) % p
    g = torch.Generator().manual_seed(seed)
    train = torch.zeros(p * p, dtype=torch.bool)  # the rest of the pairs is the test set
    train[torch.randperm(p * p, generator=g)[: int(frac_train * p * p)]] = True
    return tokens, labels, train


# -----------------------------------------------------------------------------
# model: one attention layer and one MLP on a residual stream (Nanda et al. 2023), every tensor named


class OneLayerTransformer(nn.Module):
    def __init__(self, p, d_model, heads, d_mlp, residual=True):
        super().__init__()
        d_head, s = d_model // heads, d_model**-0.5
        self.heads, self.residual = heads, residual
        self.W_E = nn.Parameter(torch.randn(p + 1, d_model) * s)  # token embedding: numbers 0..p-1 and '='
        self.W_pos = nn.Parameter(torch.randn(3, d_model) * s)  # positions of a, b, =
        self.W_Q = nn.Parameter(torch.randn(heads, d_model, d_head) * s)
        self.W_K = nn.Parameter(torch.randn(heads, d_model, d_head) * s)
        self.W_V = nn.Parameter(torch.randn(heads, d_model, d_head) * s)
        self.W_O = nn.Parameter(torch.randn(heads, d_head, d_model) * (heads * d_head) ** -0.5)
        self.W_in = nn.Parameter(torch.randn(d_model, d_mlp) * s)
        self.b_in = nn.Parameter(torch.zeros(d_mlp))
        self.W_out = nn.Parameter(torch.randn(d_mlp, d_model) * d_mlp**-0.5)
        self.b_out = nn.Parameter(torch.zeros(d_model))
        self.W_U = nn.Parameter(torch.randn(d_model, p) * s)  # unembedding: logits over the p answers

    def embed(self, tokens):
        return self.W_E[tokens]  # (B, 3, d_model): the number embeddings the sensitivity perturbs

    def forward_embedded(self, e):
        """Logits (B, p) read at the '=' position. Only that position reaches the unembedding in a one-layer model,
        so only its query, attention output and MLP are computed (exactly the same logits, 3x less work)."""
        x = e + self.W_pos  # (B, 3, d_model) residual stream
        q = torch.einsum("bd,hde->bhe", x[:, -1], self.W_Q)  # (B, heads, d_head): the query of '='
        k = torch.einsum("btd,hde->bhte", x, self.W_K)  # (B, heads, 3, d_head)
        v = torch.einsum("btd,hde->bhte", x, self.W_V)
        att = (torch.einsum("bhe,bhte->bht", q, k) / math.sqrt(q.shape[-1])).softmax(-1)  # (B, heads, 3)
        z = torch.einsum("bht,bhte->bhe", att, v)  # (B, heads, d_head)
        attn_out = torch.einsum("bhe,hed->bd", z, self.W_O)
        x = x[:, -1] + attn_out if self.residual else attn_out  # (B, d_model)
        mlp_out = F.relu(x @ self.W_in + self.b_in) @ self.W_out + self.b_out
        x = x + mlp_out if self.residual else mlp_out
        return x @ self.W_U

    def forward(self, tokens):
        return self.forward_embedded(self.embed(tokens))


def loss_fn(logits, labels):
    """Cross-entropy in float64: in float32 the log-softmax of confident predictions underflows and the loss spikes."""
    return F.cross_entropy(logits.double(), labels)


# -----------------------------------------------------------------------------
# metrics


@torch.no_grad()
def evaluate(model, tokens, labels, train):
    """Loss and accuracy on the training and test pairs, and the total weight norm."""
    logits = model(tokens)  # every pair at once: p^2 is small
    row = {}
    for name, m in [("train", train), ("test", ~train)]:
        row[f"{name}_loss"] = loss_fn(logits[m], labels[m]).item()
        row[f"{name}_acc"] = (logits[m].argmax(1) == labels[m]).float().mean().item()
    # the progress measure the paper compares with: it falls during the plateau too
    row["weight_norm"] = math.sqrt(sum(p.pow(2).sum().item() for p in model.parameters()))
    return row


@torch.no_grad()
def measure_sensitivity(model, tokens, sigma, reps, seed):
    """Token-wise (the paper's definition) and joint (the authors' code) sensitivity to N(0, sigma^2) noise on the
    number embeddings of `tokens`; the same noise at every call with the same seed."""
    row = {}
    e = model.embed(tokens)  # (N, 3, d_model) number embeddings
    eq = e[:, 2:]  # the '=' embedding, never perturbed
    # token-wise (the paper's definition): a, then b, each perturbed alone; '=' is masked out
    mask = torch.tensor([True, True, False], device=e.device).expand(len(e), 3)
    s = sensitivity(lambda xb, idx: model.forward_embedded(xb), e, gaussian(sigma), mask=mask, reps=reps, seed=seed)
    row["sens"], row["sens_stderr"] = s.mean, s.stderr
    # joint (the authors' code): a and b perturbed together, as one token of width 2 * d_model
    ab = e[:, :2].reshape(len(e), 1, -1)
    s = sensitivity(lambda xb, idx: model.forward_embedded(torch.cat([xb.view(len(xb), 2, -1), eq[idx]], 1)), ab,
                    gaussian(sigma), reps=reps, seed=seed)
    row["sens_joint"], row["sens_joint_stderr"] = s.mean, s.stderr
    return row


# -----------------------------------------------------------------------------
# training


def grokked_for(history, epochs):
    """--stop-after-grok: whether the run grokked (report.phases) at least `epochs` epochs before its last evaluation.
    Read off the history, so that a resumed run stops where the uninterrupted one did."""
    grokked = report.phases(history)[1]
    return epochs is not None and grokked is not None and history[-1]["epoch"] - grokked >= epochs


def train_one(args, seed, data, results, device):
    """Full-batch AdamW on the training pairs; log every --eval-every epochs and at the end."""
    tokens, labels, train = data
    seed_all(seed)  # the initialisation depends on the seed alone
    model = OneLayerTransformer(args.p, args.dim, args.heads, args.mlp_dim, residual=not args.no_residual)
    model = model.to(device)
    # betas (0.9, 0.98) and weight decay 1 as Nanda et al.: the decay is what eventually drives the generalisation
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.98))
    run = Run(f"p{args.p}", seed)
    if results.finished(run):
        return None
    start = restore(snap, model, opt) if (snap := results.resume(run, "epoch")) else 0
    x, y = tokens[train], labels[train]  # the whole training set is one batch
    # a line every --progress-every seconds; with --stop-after-grok the time to --epochs is an upper bound
    progress = results.progress(run, start, args.epochs, args.eval_every, early=args.stop_after_grok is not None)
    hist = results.data["runs"][str(run)]["history"]
    t0, loss = time.time(), None
    for epoch in range(start, args.epochs + 1):
        evaluating = epoch % args.eval_every == 0 or epoch == args.epochs
        progress.tick(epoch, evaluating, loss)
        results.checkpoint(run, epoch, evaluating, args.save_every, model, opt)  # for --resume
        if evaluating:
            row = {"epoch": epoch, **evaluate(model, tokens, labels, train)}
            if results.diverged(run, epoch, row["train_loss"], "epoch"):
                return None
            # measured on the training pairs: the claim is about the function learned on them
            row.update(measure_sensitivity(model, x, args.sigma, args.reps, seed), time=time.time() - t0)
            results.log(run, row)
            print(f"{run} epoch {epoch:6d} | train loss {row['train_loss']:.2e} acc {row['train_acc']:.3f} | test "
                  f"loss {row['test_loss']:.2e} acc {row['test_acc']:.3f} | sens {row['sens']:.4f} joint "
                  f"{row['sens_joint']:.4f} | |w| {row['weight_norm']:.1f} | {row['time']:.0f}s")
            if grokked_for(hist, args.stop_after_grok):  # nothing left to see: the final numbers are these
                print(f"{run}: grokked {args.stop_after_grok} epochs ago, stopping at epoch {epoch}")
                break
        if epoch == args.epochs:
            break
        loss = loss_fn(model(x), y)  # full batch: one step per epoch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    memorised, grokked = report.phases(hist)  # the epochs where the plateau starts and ends
    final = {k: row[k] for k in ["sens", "sens_stderr", "sens_joint", "train_acc", "test_acc", "weight_norm"]}
    final.update(epoch_memorised=memorised, epoch_grokked=grokked, epoch_end=row["epoch"], time=row["time"])
    results.final(run, final)
    return final


# -----------------------------------------------------------------------------


def main(args):
    device = setup(args)
    data = [t.to(device) for t in make_data(args.p, args.frac_train, args.data_seed)]
    folder, results = start_run("grokking", args, f"p{args.p}", device)
    try:
        with results.recording():  # Ctrl-C or SIGTERM: metrics kept, checkpoint written
            for seed in args.seeds:
                final = train_one(args, seed, data, results, device)
                if final is not None:
                    print(f"p{args.p}/seed{seed}: memorised at epoch {final['epoch_memorised']}, grokked at "
                          f"{final['epoch_grokked']}, ended at {final['epoch_end']}, {final['time']:.0f}s")
    finally:  # also after Ctrl-C: draw what there is (python report.py redraws it)
        if not args.no_figures and (paths := report.draw(results.data, folder)):
            print("wrote", *paths)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
