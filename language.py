"""Do transformers learn lower-sensitivity functions than LSTMs on text? (Sec. 6, App. A.4 of the paper.)

RoBERTa-like encoders (softmax or ReLU attention), a GPT-2-like causal transformer and an LSTM, all 4 layers of width
256, are trained from scratch on a GLUE sentence-pair task (MRPC on the paper's split by default: the Microsoft
release's 4,076 training and 1,725 test pairs; --split glue for GLUE's re-split). Every model computes token
embedding -> LayerNorm -> body; the sensitivity adds N(0, sigma^2 I) to one layer-normalised token embedding at a time
(special tokens too, padding never) and counts how often the prediction changes, on a fixed subset of the training
set, during training.

    python language.py --data-dir GLUE --task mrpc --model roberta lstm --attn softmax relu    # the paper's Fig. 7
    python language.py --data-dir GLUE --task mrpc --model gpt2 --sigma 2                      # App. A.4 ablations
    python language.py --download --data-dir GLUE --task qqp                                   # fetch the GLUE files
    python report.py out/language/mrpc-roberta-lstm                                            # redraw the figures

Tokenisation is a small word-level tokenizer built from the training split (it replaces RoBERTa's BPE); pairs are
encoded RoBERTa-style as <s> A </s></s> B </s>.
"""

import collections
import math
import os
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import report
from common import gaussian, sensitivity
from glue import COLUMNS, SPLITS, download, read_tsv
from runs import (ArgumentParser, Run, add_run_flags, all_sum, cli, for_training, fraction, nonnegative_float, parse,
                  positive_float, positive_int, ranks, restore, seed, seed_all, setup, start_run, subset_size)

SLACK = 0.65  # by_length: a group's shortest suffix is at least this share of its longest (timed beside other runs,
#   so roughly: GPT-2 and the LSTM both ran fastest near it; smaller groups cost the LSTM's sequential steps, larger
#   ones padding)
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)
CPU_SIZE = ("the README's MRPC protocol measures fewer pairs (about 25 min per model on one thread): python "
            "language.py --data-dir GLUE --fused --n-sens 300 --sens-positions 8 --eval-every 188 --model roberta")


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    g = p.add_argument_group("data")
    g.add_argument("--task", type=str, default="mrpc", choices=[*COLUMNS, "fake"], help="GLUE task (fake: made-up "
                   "pairs, offline, for smoke runs)")
    g.add_argument("--data-dir", type=str, default="data/glue", help="holds MRPC/ or QQP/ (SPLITS in glue.py)")
    g.add_argument("--split", type=str, default=None, choices=["paper", "glue"], help="MRPC: paper (the Microsoft "
                   "release's own 4,076 train / 1,725 test pairs, as the paper; the default) or glue (GLUE's 3,668 / "
                   "408 re-split); QQP: glue")
    g.add_argument("--download", action="store_true", help="fetch the official GLUE files into --data-dir first")
    g.add_argument("--n-train", type=positive_int, default=None, help="use the first this many training pairs "
                   "(default: all)")
    g.add_argument("--n-test", type=positive_int, default=None, help="use the first this many test pairs (GLUE's "
                   "own test labels are hidden: with --split glue, its validation pairs; default: all)")
    g.add_argument("--vocab-size", type=positive_int, default=10000, help="most frequent training words kept (+ 4 "
                   "specials)")
    g.add_argument("--max-len", type=int, default=128, help="tokens per encoded pair, specials included (>= 8)")
    g = p.add_argument_group("model")
    g.add_argument("--model", type=str, nargs="+", default=["roberta", "lstm"], choices=["roberta", "gpt2", "lstm"],
                   help="in turn; RoBERTa with each --attn")
    g.add_argument("--attn", type=str, nargs="+", default=["softmax"], choices=["softmax", "relu"],
                   help="attention of the transformers: softmax, or relu(scores) in place of softmax")
    g.add_argument("--depth", type=positive_int, default=4, help="layers of every model [author code]")
    g.add_argument("--dim", type=positive_int, default=256, help="embedding / hidden width [author code]")
    g.add_argument("--heads", type=positive_int, default=8, help="attention heads [author code]")
    g.add_argument("--dim-head", type=positive_int, default=None, help="width of one head (default: dim / heads)")
    g.add_argument("--mlp-dim", type=positive_int, default=None, help="hidden width of the transformer MLP "
                   "(default: 4 * dim)")
    g.add_argument("--dropout", type=fraction, default=0.1, help="dropout [paper]")
    g.add_argument("--fused", action="store_true", help="run the LSTM as torch.nn.LSTM with the same weights (faster)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=positive_float, default=1e-4, help="AdamW learning rate [paper]")
    g.add_argument("--weight-decay", type=nonnegative_float, default=1e-4, help="AdamW weight decay [paper]")
    g.add_argument("--batch-size", type=positive_int, default=32, help="pairs per step [paper]")
    g.add_argument("--epochs", type=positive_float, default=10, help="passes over the training pairs")
    g.add_argument("--seeds", type=seed, nargs="+", default=[0], help="initialisation/order seeds")
    g = p.add_argument_group("sensitivity")
    g.add_argument("--sigma", type=nonnegative_float, nargs="+", default=[math.sqrt(15)], help="noise std(s) on the "
                   "normalised embeddings, each measured at every evaluation; the first is the headline (default "
                   "sqrt(15): the authors' variance 15; App. A.4 uses variance 4, sigma 2)")
    g.add_argument("--sens-seed", type=seed, default=0, help="seed of the noise: every model and seed sees the same "
                   "perturbations of the same pairs, so differences between models are paired")
    g.add_argument("--reps", type=positive_int, default=1, help="noise draws per (pair, position)")
    g.add_argument("--sens-positions", type=positive_int, default=None,
                   help="sample this many positions per pair and draw, with replacement (default: every position)")
    g.add_argument("--n-sens", type=positive_int, default=500, help="training pairs the sensitivity is measured on")
    g.add_argument("--sens-test", action="store_true", help="also measure it on the first --n-sens test pairs (GLUE "
                   "validation, App. A.4)")
    g.add_argument("--eval-every", type=positive_int, default=625, help="AdamW steps between evaluations (and at "
                   "initialisation and the end); 625 steps of 32 = 20,000 examples")
    g.add_argument("--sens-during", type=str, default="every", choices=["every", "needed"], help="every --sigma at "
                   "every evaluation, or (needed) at initialisation and the end, with the first sigma alone between "
                   "(its curve is Fig. 7's; the paired differences are read at the two ends)")
    g.add_argument("--align", type=str, nargs="+", default=["right"], choices=["right", "left"],
                   help="per-position profile counted from the end (right, as the paper) or from the start; the "
                   "first through training, every one on the final models")
    add_run_flags(p, unit="steps", default_name="<task>-<models>")
    args = parse(p, "language", argv)
    if args.split is None:  # a folder written before --split existed ran on GLUE's split
        args.split = "glue" if args.resume or args.task == "qqp" else "paper"
    if args.task != "fake" and args.split not in SPLITS[args.task]:
        p.error(f"--split {args.split}: {args.task.upper()} has {', '.join(SPLITS[args.task])}")
    if args.task == "fake" and args.download:
        p.error("--download fetches a GLUE task's files: --task fake makes up its pairs (drop --download)")
    if args.max_len < 8:
        p.error(f"--max-len must be >= 8 (the specials take 4), got {args.max_len}")
    if args.model == ["lstm"] and args.attn != ["softmax"]:  # else the LSTM alone trains, as if --attn were not given
        p.error(f"--attn {' '.join(args.attn)} is the transformers' attention: --model lstm has none (add roberta or "
                "gpt2)")
    if args.model != ["lstm"] and args.dim % args.heads and args.dim_head is None:  # the LSTM has no heads
        p.error(f"--dim {args.dim} must be a multiple of --heads {args.heads} (or give --dim-head)")
    return args


# -----------------------------------------------------------------------------
# data: the GLUE files (glue.py), a word-level tokenizer, RoBERTa-style pair encoding


def fake_pairs(n, seed):
    """--task fake: n made-up sentence pairs over 50 words, label 1 iff B starts with A's first word (learnable)."""
    g = torch.Generator().manual_seed(seed)
    words = lambda k: " ".join(f"w{int(i)}" for i in torch.randint(50, (k,), generator=g))  # noqa: E731
    pairs = []
    for y in torch.randint(2, (n,), generator=g).tolist():
        a = words(int(torch.randint(3, 12, (1,), generator=g)))
        first = a.split()[0] if y else f"w{(int(a.split()[0][1:]) + 1) % 50}"  # the same first word, or another
        pairs.append((a, f"{first} {words(int(torch.randint(2, 10, (1,), generator=g)))}", y))
    return pairs


def words(text):
    """Lower-cased words and punctuation marks."""
    return re.findall(r"\w+|[^\w\s]", text.lower())


class Tokenizer:
    """The `size` most frequent training words, after the 4 specials <pad> <s> </s> <unk>."""

    def __init__(self, texts, size):
        counts = collections.Counter(w for t in texts for w in words(t))
        self.itos = SPECIALS + [w for w, _ in counts.most_common(size)]  # id -> word; ties in first-seen order
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def encode(self, text):
        return [self.stoi.get(w, UNK) for w in words(text)]  # a word outside the vocabulary is <unk>

    def decode(self, ids):
        return [self.itos[i] for i in ids]

    def encode_pair(self, a, b, max_len):
        """<s> A </s></s> B </s>, the longer sentence cut first until it fits max_len."""
        a, b = self.encode(a), self.encode(b)
        while len(a) + len(b) + 4 > max_len:
            if len(a) >= len(b):
                a.pop()
            else:
                b.pop()
        return [BOS] + a + [EOS, EOS] + b + [EOS]


def encode(pairs, tok, max_len):
    """(tokens (N, max_len) right-padded with <pad>, labels (N,))."""
    ids = torch.full((len(pairs), max_len), PAD, dtype=torch.long)  # right padding: real tokens come first
    for i, (a, b, _) in enumerate(pairs):
        seq = tok.encode_pair(a, b, max_len)
        ids[i, : len(seq)] = torch.tensor(seq)
    return ids, torch.tensor([y for _, _, y in pairs])


# -----------------------------------------------------------------------------
# models: every one is embedding -> LayerNorm -> [the sensitivity's noise goes here] -> body -> 2 logits


class Block(nn.Module):
    """Pre-norm transformer block; attn 'relu' puts relu(scores) in place of the softmax."""

    def __init__(self, dim, heads, dim_head, mlp_dim, dropout, attn, causal):
        super().__init__()
        self.heads, self.dim_head, self.attn, self.causal = heads, dim_head, attn, causal
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * heads * dim_head), nn.Linear(heads * dim_head, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))
        self.drop = nn.Dropout(dropout)

    def qkv_heads(self, x):
        B, T, _ = x.shape
        return self.qkv(self.ln1(x)).view(B, T, 3, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)

    def forward(self, x, mask, row=None):  # x (B, T, C), mask (B, T) True for real tokens; row (B,): see below
        """Every token's output, or with row, only that token's of each sequence (B, 1, C), over every key."""
        B, T, _ = x.shape
        q, k, v = self.qkv_heads(x)
        keep = mask[:, None, None, :]  # keys that are real tokens: padding is never attended to
        if self.causal:  # GPT-2: a token sees itself and the tokens before it
            keep = keep & torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        if row is not None:  # the one query of each sequence
            b = torch.arange(B, device=x.device)
            x, q, keep = x[b, row, None], q[b, :, row, None], keep[b, :, row if self.causal else 0, None]
        return self.attend(x, q, k, v, keep)

    def attend(self, x, q, k, v, keep):
        """The rest of the block for queries q (B, nh, Tq, hs) of the rows x: attention over keys k and values v
        (B, nh, Tk, hs), or, when k and v are pairs (the prefix cache, the suffix), over both as if concatenated,
        without copying the cache; keep (B, 1, Tq, Tk) says which keys each query may see."""
        q = q * self.dim_head**-0.5  # the usual 1/sqrt(d_head) scale, for softmax and ReLU attention alike
        if isinstance(k, tuple):  # prefix cache and suffix: the scores side by side, the values summed
            att = torch.cat([q @ kk.transpose(-2, -1) for kk in k], -1)  # (B, nh, Tq, Tk)
        else:
            att = q @ k.transpose(-2, -1)
        if self.attn == "softmax":
            att = att.masked_fill(~keep, float("-inf")).softmax(-1)  # weights over the visible keys, summing to 1
        else:  # App. A.4's ReLU attention: relu(scores) in place of the softmax, unnormalised
            att = F.relu(att) * keep
        att = self.drop(att)
        if isinstance(v, tuple):  # the cached values take the first columns of the weights, the suffix's the rest
            first = att[..., : v[0].shape[2]] @ v[0]
            y = first + att[..., v[0].shape[2]:] @ v[1]
        else:
            y = att @ v
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(*x.shape[:2], -1)))  # (B, Tq, nh * hs) heads joined
        return x + self.drop(self.mlp(self.ln2(x)))  # pre-norm MLP on the residual stream

    def forward_suffix(self, x, pos, mask, k_cache, v_cache, row=None):
        """Causal block on each row's suffix only: x (B, K, C) are the rows at absolute positions pos (B, K); the
        keys and values of the positions before them come from the clean cache (B, nh, S, hs), unchanged because
        causal attention cannot see a later perturbation. With row (B,), only that suffix token's output (B, 1, C)."""
        S = k_cache.shape[2]  # cached positions: at least every row's positions before its suffix
        q, k, v = self.qkv_heads(x)  # of the suffix's tokens only
        before = (torch.arange(S, device=x.device) < pos[:, :1]) & mask[:, :S]  # (B, S) cached keys before the suffix
        own = pos[:, None, :] <= pos[:, :, None]  # (B, K, K) causal: no real token sees the padding after it
        keep = torch.cat([before[:, None, :].expand(-1, x.shape[1], -1), own], -1)  # (B, K, S + K)
        if row is not None:  # the one query of each sequence, over every key
            b = torch.arange(len(x), device=x.device)
            x, q, keep = x[b, row, None], q[b, :, row, None], keep[b, row, None]
        return self.attend(x, q, (k_cache, k), (v_cache, v), keep[:, None])


class TextTransformer(nn.Module):
    """RoBERTa-like encoder (classifier on <s>) or, causal=True, GPT-2-like (classifier on the last real token)."""

    def __init__(self, vocab, max_len, dim, depth, heads, dim_head, mlp_dim, dropout, attn="softmax", causal=False):
        super().__init__()
        self.causal = causal
        self.embed, self.norm = nn.Embedding(vocab, dim), nn.LayerNorm(dim)
        self.pos = nn.Embedding(max_len, dim)  # added once, after the noise
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(dim, heads, dim_head, mlp_dim, dropout, attn, causal) for _ in range(depth)])
        self.ln_f, self.head = nn.LayerNorm(dim), nn.Linear(dim, 2)

    def embed_normed(self, tokens):
        return self.norm(self.embed(tokens))  # (B, T, C): where the sensitivity adds its noise

    def forward_normed(self, e, mask, cache=None):  # cache: a list to which each block's keys and values are added
        x = self.drop(e + self.pos.weight[: e.shape[1]])  # (B, T, C): positions added after the noise
        last = mask.sum(1) - 1  # the last real token of each sequence
        read = last if self.causal else torch.zeros_like(last)  # the token the head reads: GPT-2 last, RoBERTa <s>
        # evaluating, the last block computes the read token alone (the same logits up to float rounding, 1.3x
        # faster); training computes every token: the dropout draws, and so the trained models, stay as reported
        alone = not self.training
        for i, block in enumerate(self.blocks):
            if cache is not None:  # the clean keys and values each block sees, for forward_from
                cache.append(block.qkv_heads(x)[1:])
            x = block(x, mask, read if alone and i == len(self.blocks) - 1 else None)  # alone: (B, 1, C)
        return self.read_out(x, read, alone)

    def forward(self, tokens):
        mask = tokens != PAD
        return self.forward_normed(self.embed_normed(tokens), mask)

    def prefix_cache(self, e, mask):
        """(cache, logits) of the clean inputs e (eval mode): every block's keys and values, the KV cache forward_from
        resumes from, and the logits. None for the bidirectional encoder, which a perturbation reaches everywhere."""
        if not self.causal:
            return None
        cache = []
        return cache, self.forward_normed(e, mask, cache)

    def forward_from(self, e, mask, start, cache, idx):
        """Logits of inputs e (B, T, C) equal to the clean inputs idx (rows of the cache) before position start (B,):
        only each row's positions start.. are computed, over the cached keys and values of the others."""
        _, T, C = e.shape
        last = mask.sum(1) - 1
        pos = start[:, None] + torch.arange(int((last + 1 - start).max()), device=e.device)  # (B, K) positions
        cols = pos.clamp(max=T - 1)  # a shorter suffix repeats its last column (masked, never read)
        x = e.gather(1, cols[..., None].expand(-1, -1, C)) + self.pos.weight[cols]  # (B, K, C) each row's suffix
        S = int(start.max())  # no row reads a cached key at or after its own start
        read = last - start  # the last real token, counted in each row's suffix
        alone = not self.training  # evaluating, the last block computes the last real token alone (forward_normed)
        for i, (block, (k, v)) in enumerate(zip(self.blocks, cache)):
            row = read if alone and i == len(self.blocks) - 1 else None
            x = block.forward_suffix(x, pos, mask, k[idx, :, :S], v[idx, :, :S], row)
        return self.read_out(x, read, alone)

    def read_out(self, x, read, alone):
        """The logits from the token the head reads: row read (B,) of each sequence of x, or x's one row when the
        last block computed that token alone."""
        x = self.ln_f(x)
        return self.head(x[:, 0] if alone else x[torch.arange(len(x), device=x.device), read])


class LSTMLayer(nn.Module):
    """One LSTM layer, written out. Weights are laid out as in torch.nn.LSTM (gates i, f, g, o stacked)."""

    def __init__(self, inputs, hidden):
        super().__init__()
        self.hidden = hidden
        k = hidden**-0.5  # torch.nn.LSTM's initialisation: U(-1/sqrt(H), 1/sqrt(H)) for every weight
        self.W_ih = nn.Parameter(torch.empty(4 * hidden, inputs).uniform_(-k, k))
        self.W_hh = nn.Parameter(torch.empty(4 * hidden, hidden).uniform_(-k, k))
        self.b_ih = nn.Parameter(torch.empty(4 * hidden).uniform_(-k, k))
        self.b_hh = nn.Parameter(torch.empty(4 * hidden).uniform_(-k, k))

    def forward(self, x):  # x (B, T, inputs) -> (B, T, hidden)
        return self.run(x)[0]

    def run(self, x, state=None):
        """Hidden and cell states (B, T, hidden) at every step, from the initial state (h, c), zeros if None."""
        B, T, _ = x.shape
        xw = x @ self.W_ih.T + self.b_ih  # the input projection of every step at once, (B, T, 4H)
        h, c = state if state is not None else (x.new_zeros(B, self.hidden), x.new_zeros(B, self.hidden))
        hs, cs = [], []
        for t in range(T):  # the recurrence: step t needs step t - 1's h and c
            gates = xw[:, t] + h @ self.W_hh.T + self.b_hh  # (B, 4H): the four gates' pre-activations
            i, f, g, o = gates.chunk(4, dim=1)
            i = torch.sigmoid(i)  # input gate: how much of the candidate enters the cell
            f = torch.sigmoid(f)  # forget gate: how much of the old cell is kept
            g = torch.tanh(g)  # candidate cell content
            o = torch.sigmoid(o)  # output gate: how much of the cell is shown as the hidden state
            c = f * c + i * g  # the cell: keep part of the old, add part of the new
            h = o * torch.tanh(c)  # the hidden state, what the next layer and the head read
            hs.append(h)
            cs.append(c)
        return torch.stack(hs, dim=1), torch.stack(cs, dim=1)


class LSTMClassifier(nn.Module):
    """Stacked LSTM; the classifier reads the hidden state at the last real token (padding comes after it, so it
    cannot affect the prediction). fused=True runs torch.nn.LSTM with the same weights."""

    def __init__(self, vocab, dim, depth, dropout, fused=False):
        super().__init__()
        self.fused = fused
        self.embed, self.norm = nn.Embedding(vocab, dim), nn.LayerNorm(dim)
        self.layers = nn.ModuleList([LSTMLayer(dim, dim) for _ in range(depth)])
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim, 2)
        self._fused = {}  # the torch.nn.LSTM shell per device; a plain dict, so its own weights are never registered

    def embed_normed(self, tokens):
        return self.norm(self.embed(tokens))  # (B, T, C): where the sensitivity adds its noise

    def run_fused(self, x, init=None):
        """All layers through torch.nn.LSTM with this model's weights; init: per layer (h, c) (B, hidden), or None."""
        weights = {}
        for i, layer in enumerate(self.layers):
            for name in ["W_ih", "W_hh", "b_ih", "b_hh"]:
                torch_name = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}[name]
                weights[f"{torch_name}_l{i}"] = getattr(layer, name)
        if x.device not in self._fused:  # built once: constructing it draws 4 * 8 * hidden^2 random numbers
            between = self.drop.p if len(self.layers) > 1 else 0.0  # dropout between layers: none with one layer
            self._fused[x.device] = nn.LSTM(x.shape[-1], self.layers[0].hidden, len(self.layers), batch_first=True,
                                            dropout=between, device=x.device)
        lstm = self._fused[x.device].train(self.training)  # inter-layer dropout only in training, as the cell path
        state = None if init is None else tuple(torch.stack(s) for s in zip(*init))  # (layers, B, hidden) each
        return torch.func.functional_call(lstm, weights, (x, state))[0]

    def forward_normed(self, e, mask):
        x = self.drop(e)
        if self.fused:
            x = self.run_fused(x)  # the same function, cuDNN's or ATen's kernel
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x if i == 0 else self.drop(x))  # dropout between layers, as torch.nn.LSTM's
        last = mask.sum(1) - 1  # right padding: the last real token has read the whole sequence
        return self.head(self.drop(x[torch.arange(len(x), device=x.device), last]))

    def forward(self, tokens):
        return self.forward_normed(self.embed_normed(tokens), tokens != PAD)

    def prefix_cache(self, e, mask):
        """(cache, logits) of the clean inputs e (eval mode): every layer's hidden and cell states at every position,
        which forward_from resumes from, and the logits."""
        cache, x = [], e
        for layer in self.layers:  # the hand-written cells: the fused LSTM does not return every step's cell state
            h, c = layer.run(x)
            cache.append((h, c))
            x = h
        return cache, self.head(x[torch.arange(len(x), device=x.device), mask.sum(1) - 1])

    def forward_from(self, e, mask, start, cache, idx):
        """Logits of inputs e (B, T, C) equal to the clean inputs idx (rows of the cache) before position start (B,):
        each row's recurrence resumes from its cached states at start - 1 over its own suffix, so a copy perturbed
        at position t costs length - t steps instead of length."""
        B, T, C = e.shape
        steps = mask.sum(1) - start  # (B,) from the perturbed token to the last real one
        cols = (start[:, None] + torch.arange(int(steps.max()), device=e.device)).clamp(max=T - 1)
        x = e.gather(1, cols[..., None].expand(-1, -1, C))  # (B, K, C) each row's suffix
        rows, before, fresh = idx, (start - 1).clamp(min=0), (start == 0)[:, None]  # a suffix at 0 starts from zeros
        init = [(h[rows, before].masked_fill(fresh, 0.0), c[rows, before].masked_fill(fresh, 0.0)) for h, c in cache]
        if self.fused:
            x = self.run_fused(x, init)
        else:
            for layer, state in zip(self.layers, init):
                x = layer.run(x, state)[0]
        return self.head(x[torch.arange(B, device=e.device), steps - 1])


def build_model(name, attn, vocab, args):
    """Every model at the same depth and width; the transformers' heads split the width unless --dim-head says."""
    if name == "lstm":
        return LSTMClassifier(vocab, args.dim, args.depth, args.dropout, fused=args.fused)
    dim_head, mlp_dim = args.dim_head or args.dim // args.heads, args.mlp_dim or 4 * args.dim
    return TextTransformer(vocab, args.max_len, args.dim, args.depth, args.heads, dim_head, mlp_dim, args.dropout, attn,
                           causal=name == "gpt2")


# -----------------------------------------------------------------------------
# metrics


def trim(tokens):
    """Drop the columns that are padding in every row: batches padded to --max-len would waste most of the work
    (MRPC pairs average about 50 tokens). Exact, since padding is masked everywhere."""
    return tokens[:, : int((tokens != PAD).sum(1).max())]


@torch.no_grad()
def evaluate(model, tokens, labels, batch_size=None):
    """(mean cross-entropy, accuracy, share of the pairs given the most frequent predicted class) in eval mode; a
    share of 1.0 is a constant classifier, whose sensitivity is 0 whatever the noise. Under torchrun each rank takes
    a slice of the pairs and the sums are added up."""
    model.eval()  # dropout off
    rank, world = ranks()
    batch_size = batch_size or (256 if tokens.device.type == "cuda" else 64)  # a CPU: 1.2-1.4x faster than at 256
    loss = correct = 0.0
    counts = torch.zeros(2, dtype=torch.long, device=tokens.device)  # predictions of each class
    mine = torch.arange(len(tokens), device=tokens.device).tensor_split(world)[rank]
    mine = mine[torch.argsort((tokens[mine] != PAD).sum(1))]  # by length: each batch trimmed to its own longest
    for idx in mine.split(batch_size):
        out = model(trim(tokens[idx]))
        loss += F.cross_entropy(out, labels[idx], reduction="sum").item()
        correct += (out.argmax(1) == labels[idx]).sum().item()
        counts += out.argmax(1).bincount(minlength=2)
    loss, correct, *counts = all_sum(loss, correct, *counts.tolist())
    return loss / len(tokens), correct / len(tokens), max(counts) / len(tokens)


def by_length(run, length, slack=SLACK):
    """run(rows) on groups of rows of similar length, the outputs put back in row order. A batch is padded to its
    longest row (forward_from: its longest suffix), so a chunk's copies run in groups whose shortest row is at least
    `slack` times their longest: a short pair (or a copy perturbed near the end) no longer pays for a long one."""
    order = torch.argsort(length, descending=True)  # longest suffix first
    sizes, first, outs = length[order].tolist(), 0, []
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or sizes[i] < slack * sizes[first]:  # row i is too short for the group from `first`
            outs.append(run(order[first:i]))
            first = i
    return torch.cat(outs)[torch.argsort(order)]  # output k of the sorted rows belongs to row order[k]


@torch.no_grad()
def measure_sensitivity(model, tokens, *, sigma, reps, positions, align, seed, prefix_cache=True, buckets=True):
    """Noise on one layer-normalised token embedding at a time, padding never. With align='right' the estimator sees
    each sequence shifted to end at the last column, so its per-position profile counts from the end. For the causal
    models (LSTM, GPT-2) a copy perturbed at position t reuses the clean states before t (prefix_cache; the same
    predictions, about half the work); RoBERTa's copies run in groups of similar length, each trimmed to its longest
    (buckets; the same predictions, no work on padding). Returns the Sensitivity and, per position of that profile,
    how many of the pairs have a token there."""
    model.eval()  # dropout off: it would count as flips
    tokens = trim(tokens)
    mask = tokens != PAD  # (N, T): real tokens, the only ones perturbed
    e = model.embed_normed(tokens)  # (N, T, C): the noise goes on these normalised embeddings
    N, T, C = e.shape
    cache, clean = (model.prefix_cache(e, mask) if prefix_cache else None) or (None, None)
    cols = torch.arange(T, device=e.device)
    shift = T - mask.sum(1) if align == "right" else torch.zeros(N, dtype=torch.long, device=e.device)  # (N,)
    src = (cols - shift[:, None]) % T  # right-aligned column j holds left column j - shift (identity for 'left')
    e_est, mask_est = e.gather(1, src[..., None].expand(-1, -1, C)), mask.gather(1, src)

    def f(xb, idx, pos):  # shift the chunk back to the left-aligned layout the models expect
        back = (cols + shift[idx, None]) % T
        xb = xb.gather(1, back[..., None].expand(-1, -1, C))
        if cache is None:  # RoBERTa: a perturbation reaches every position, so the whole sequence is recomputed
            if not buckets:
                return model.forward_normed(xb, mask[idx])
            length = mask[idx].sum(1)  # padding is masked everywhere, so dropping its columns changes nothing

            def trimmed(r):  # one group of copies of similar length, cut to its longest
                end = int(length[r].max())
                return model.forward_normed(xb[r, :end], mask[idx[r], :end])
            return by_length(trimmed, length)
        if pos is None:  # the clean inputs, whose logits came with the cache
            return clean[idx]
        start = pos - shift[idx]  # the perturbed position in the left-aligned layout
        return by_length(lambda r: model.forward_from(xb[r], mask[idx[r]], start[r], cache, idx[r]),
                         mask[idx].sum(1) - start)

    s = sensitivity(f, e_est, gaussian(sigma), mask=mask_est, reps=reps, positions=positions, seed=seed,
                    tell_position=True)
    return s, mask_est.sum(0)


# -----------------------------------------------------------------------------
# training


def sensitivities(model, tokens, args, align, sigmas=None):
    """{f"{sigma:g}": (Sensitivity, pairs reaching each position)} at every --sigma (or the `sigmas` given), with the
    same noise (--sens-seed) for every model."""
    return {f"{sigma:g}": measure_sensitivity(model, tokens, sigma=sigma, reps=args.reps, positions=args.sens_positions,
                                              align=align, seed=args.sens_seed) for sigma in sigmas or args.sigma}


def per_pair(sens):
    """Each pair's flip rate at every sigma of sensitivities(), to 6 digits: what paired differences are made of."""
    return {key: [round(v, 6) for v in s.per_input.tolist()] for key, (s, _) in sens.items()}


def train_one(name, attn, seed, args, data, vocab, results):
    """Train one model with AdamW, measuring it at initialisation, every --eval-every steps and at the end. Under
    torchrun every rank draws the same batches and trains on its slice of each. Returns the model, or None if its
    loss diverged (metrics.json then marks the run) or if a resumed run had already finished."""
    run = Run(label(name, attn), seed)
    if results.finished(run):
        return None
    seed_all(seed)  # the initialisation depends on the seed alone
    device = data["train"][0].device
    model = build_model(name, attn, vocab, args).to(device)
    print(f"{run}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)  # the paper's optimiser
    x, y = data["train"]  # (N, max_len) token ids, right-padded; (N,) labels
    gen = torch.Generator(device).manual_seed(seed)  # the order of the pairs, kept in checkpoints
    steps_per_epoch = math.ceil(len(x) / args.batch_size)
    num_steps = max(1, round(args.epochs * steps_per_epoch))  # --epochs may be fractional
    head = f"{args.sigma[0]:g}"  # the headline sigma, logged as "sens"
    start, seen, perm, per_image_init = 0, 0, None, None
    if snap := results.resume(run, "step"):
        start = restore(snap, model, opt, [gen])
        seen, perm, per_image_init = snap["seen"], snap["perm"], snap["per_image_init"]
    rank, world = ranks()
    fwd = for_training(model, device)  # under torchrun training goes through DDP; evaluation is sharded by hand
    progress = results.progress(run, start, num_steps, args.eval_every, per_epoch=steps_per_epoch, hint=CPU_SIZE)
    t0, loss = time.time(), None  # progress: a line every --progress-every seconds, with the time to the end
    for step in range(start, num_steps + 1):
        evaluating = step % args.eval_every == 0 or step == num_steps
        progress.tick(step, evaluating, loss)
        results.checkpoint(run, step, evaluating, args.save_every, model, opt, [gen], seen=seen, perm=perm,
                           per_image_init=per_image_init)  # for --resume
        if evaluating:
            row = {"step": step, "examples": seen}
            # majority share 1.0: a constant classifier, whose sensitivity is 0 whatever it learned
            row["train_loss"], row["train_acc"], row["majority_share"] = evaluate(model, x, y)
            if results.diverged(run, step, row["train_loss"]):
                return None
            row["test_loss"], row["test_acc"], _ = evaluate(model, *data["test"])
            ends = args.sens_during == "every" or step in (0, num_steps)  # else the headline sigma alone
            sens = sensitivities(model, x[: args.n_sens], args, args.align[0], None if ends else args.sigma[:1])
            for key, (s, _) in sens.items():
                row[f"sens@{key}"], row[f"sens_stderr@{key}"] = s.mean, s.stderr
            if args.sens_test:
                for key, (s, _) in sensitivities(model, data["test"][0][: args.n_sens], args, args.align[0],
                                                 None if ends else args.sigma[:1]).items():
                    row[f"sens_test@{key}"], row[f"sens_test_stderr@{key}"] = s.mean, s.stderr
            row["sens"], row["sens_stderr"] = row[f"sens@{head}"], row[f"sens_stderr@{head}"]
            row["time"] = time.time() - t0
            results.log(run, row)
            if per_image_init is None:  # at initialisation, for the paired comparison there
                per_image_init = per_pair(sens)
            print(f"{run} step {step:6d} | examples {seen:7d} | train loss {row['train_loss']:.4f} acc "
                  f"{row['train_acc']:.3f} | test acc {row['test_acc']:.3f} | majority {row['majority_share']:.3f} | "
                  f"sens {row['sens']:.4f} +- {row['sens_stderr']:.4f} | {row['time']:.0f}s")
        if step == num_steps:
            break
        if step % steps_per_epoch == 0:  # a new pass over the training pairs in a new random order
            perm = torch.randperm(len(x), generator=gen, device=device)
        idx = perm[(step % steps_per_epoch) * args.batch_size:][: args.batch_size]
        mine = idx.tensor_split(world)[rank]  # this rank's slice of the batch
        model.train()  # dropout on (evaluation switched it off)
        loss = F.cross_entropy(fwd(trim(x[mine])), y[mine])  # trimmed: no work on all-padding columns
        opt.zero_grad(set_to_none=True)
        (loss * (len(mine) * world / len(idx))).backward()  # DDP averages over ranks: the batch mean
        opt.step()
        seen += len(idx)  # the x axis of the paper's Fig. 7: examples seen
    final = {k: row[k] for k in ["sens", "sens_stderr", "train_acc", "test_acc", "train_loss", "test_loss",
                                 "majority_share", "step", "examples"]}
    if args.sens_test:
        final["sens_test"], final["sens_test_stderr"] = row[f"sens_test@{head}"], row[f"sens_test_stderr@{head}"]
    final["sens_at"] = {key: {"sens": s.mean, "stderr": s.stderr} for key, (s, _) in sens.items()}
    final["per_image"] = per_pair(sens)
    final["per_image_init"] = per_image_init
    # the per-position profile of the final model at the headline sigma, in every alignment asked for
    final["profiles"] = {}
    for align in args.align:  # another alignment: the headline sigma alone (its other sigmas went unused)
        s, pairs = sens[head] if align == args.align[0] else measure_sensitivity(
            model, x[: args.n_sens], sigma=args.sigma[0], reps=args.reps, positions=args.sens_positions, align=align,
            seed=args.sens_seed)
        final["profiles"][align] = {"sens": s.per_position.tolist(), "pairs": pairs.tolist()}
    results.final(run, final)
    return model


# -----------------------------------------------------------------------------


def label(name, attn):
    """A model's name in metrics.json: the transformers with their attention ('roberta-relu'), the LSTM alone."""
    return name if name == "lstm" else f"{name}-{attn}"


def main(args):
    device = setup(args)
    if args.download:
        download(args.task, args.data_dir)
    folder_data = os.path.join(args.data_dir, args.task.upper())
    train, test = (fake_pairs(n, seed) for n, seed in [(400, 0), (100, 1)]) if args.task == "fake" else \
        (read_tsv(os.path.join(folder_data, f), args.task) for f in SPLITS[args.task][args.split])
    train = train[: subset_size("--n-train", args.n_train, len(train), f"{args.task.upper()} training pairs")]
    test = test[: subset_size("--n-test", args.n_test, len(test), f"{args.task.upper()} test pairs")]
    subset_size("--n-sens", args.n_sens, len(train), "training pairs (--n-train) to measure on")
    if args.sens_test:
        subset_size("--n-sens", args.n_sens, len(test), "test pairs (--n-test) that --sens-test measures on")
    tok = Tokenizer([t for a, b, _ in train for t in (a, b)], args.vocab_size)  # from the training pairs only
    data = {"train": [t.to(device) for t in encode(train, tok, args.max_len)],
            "test": [t.to(device) for t in encode(test, tok, args.max_len)]}
    folder, results = start_run("language", args, f"{args.task}-{'-'.join(args.model)}", device)
    majority = max(sum(y for *_, y in test), sum(1 - y for *_, y in test)) / len(test)  # a constant classifier's
    results.data["data"] = {"split": args.split, "n_train": len(train), "n_test": len(test), "test_majority": majority}
    print(f"{args.task}: {len(train)} train / {len(test)} test pairs ({args.split} split; the majority class is "
          f"{majority:.3f} of the test pairs), vocabulary {len(tok.itos)}")
    # the LSTM has no attention: it runs once, whatever --attn
    jobs = [(name, attn) for name in args.model for attn in (["softmax"] if name == "lstm" else args.attn)]
    try:
        with results.recording():  # Ctrl-C or SIGTERM: metrics kept, checkpoint written
            for name, attn in jobs:
                for seed in args.seeds:
                    train_one(name, attn, seed, args, data, len(tok.itos), results)
            # paired against the first model asked for (same pairs, positions and noise for every model)
            results.data["paired"] = report.language_paired(results.data)
            results.save()
            report.summary(results.data)
    finally:  # also after Ctrl-C: draw what there is (python report.py redraws it)
        drawable = not args.no_figures and any(r["history"] for r in results.data["runs"].values())
        if drawable and (paths := report.draw(results.data, folder)):
            print("wrote", *paths)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
