"""Do transformers learn lower-sensitivity functions than LSTMs on text? (Sec. 6, App. A.4 of the paper.)

RoBERTa-like encoders (softmax or ReLU attention), a GPT-2-like causal transformer and an LSTM, all 4 layers of width
256, are trained from scratch on a GLUE sentence-pair task. Every model computes token embedding -> LayerNorm -> body;
the sensitivity adds N(0, sigma^2 I) to one layer-normalised token embedding at a time (special tokens too, padding
never) and counts how often the prediction changes, on a fixed subset of the training set, during training.

    python language.py --data-dir GLUE --task mrpc --model roberta lstm --attn softmax relu    # the paper's Fig. 7
    python language.py --data-dir GLUE --task mrpc --model gpt2 --sigma 2                      # App. A.4 ablations
    python language.py --download --data-dir GLUE --task qqp                                   # fetch the GLUE files
    python language.py --plot out/language/mrpc-roberta-lstm                                   # redraw the figures

Tokenisation is a small word-level tokenizer built from the training split (it replaces RoBERTa's BPE); pairs are
encoded RoBERTa-style as <s> A </s></s> B </s>.
"""

import argparse
import collections
import csv
import math
import os
import re
import time
import urllib.request
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import gaussian, load_results, plot_curves, pyplot, save_figure, seed_all, sensitivity, start_run

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)
# the official GLUE files (the URLs of GLUE's download script) and how each task's TSV columns are laid out
URLS = {
    "mrpc": {"msr_paraphrase_train.txt": "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_train.txt",
             "msr_paraphrase_test.txt": "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_test.txt",
             "dev_ids.tsv": "https://dl.fbaipublicfiles.com/glue/data/mrpc_dev_ids.tsv"},
    "qqp": {"QQP-clean.zip": "https://dl.fbaipublicfiles.com/glue/data/QQP-clean.zip"},
}
COLUMNS = {"mrpc": ("#1 String", "#2 String", "Quality"), "qqp": ("question1", "question2", "is_duplicate")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # data
    p.add_argument("--task", type=str, default="mrpc", choices=list(COLUMNS), help="GLUE task")
    p.add_argument("--data-dir", type=str, default="data/glue", help="holds MRPC/ or QQP/ with train.tsv, dev.tsv")
    p.add_argument("--download", action="store_true", help="fetch the official GLUE files into --data-dir first")
    p.add_argument("--n-train", type=int, default=None, help="use the first this many training pairs")
    p.add_argument("--n-valid", type=int, default=None, help="use the first this many validation pairs")
    p.add_argument("--vocab-size", type=int, default=10000, help="most frequent training words kept (+ 4 specials)")
    p.add_argument("--max-len", type=int, default=128, help="tokens per encoded pair, specials included")
    # model
    p.add_argument("--model", nargs="+", default=["roberta", "lstm"], choices=["roberta", "gpt2", "lstm"])
    p.add_argument("--attn", nargs="+", default=["softmax"], choices=["softmax", "relu"],
                   help="attention of the transformers: softmax, or relu(scores) in place of softmax")
    p.add_argument("--layers", type=int, default=4, help="layers of every model [author code]")
    p.add_argument("--width", type=int, default=256, help="embedding / hidden width [author code]")
    p.add_argument("--heads", type=int, default=8, help="attention heads [author code]")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout [paper]")
    p.add_argument("--fused", action="store_true", help="run the LSTM as torch.nn.LSTM with the same weights (faster)")
    # optimisation
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate [paper]")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="AdamW weight decay [paper]")
    p.add_argument("--batch-size", type=int, default=32, help="pairs per step [paper]")
    p.add_argument("--epochs", type=float, default=10, help="passes over the training pairs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="initialisation/order seeds")
    # sensitivity
    p.add_argument("--sigma", type=float, default=math.sqrt(15),
                   help="noise std on the normalised embeddings (default sqrt(15): the authors' variance 15)")
    p.add_argument("--reps", type=int, default=1, help="noise draws per (pair, position)")
    p.add_argument("--positions", type=int, default=None, help="sample this many positions per pair (default all)")
    p.add_argument("--n-sens", type=int, default=500, help="training pairs the sensitivity is measured on")
    p.add_argument("--sens-valid", action="store_true", help="also measure it on the validation pairs (App. A.4)")
    p.add_argument("--sens-every", type=int, default=20000, help="training examples seen between measurements")
    p.add_argument("--align", type=str, default="right", choices=["right", "left"],
                   help="per-position profile counted from the end (right, as the paper) or from the start")
    # system
    p.add_argument("--device", type=str, default="auto", help="auto | cpu | cuda")
    p.add_argument("--out-dir", type=str, default="out", help="results go to <out-dir>/language/<run-name>/")
    p.add_argument("--run-name", type=str, default=None, help="default: <task>-<models>")
    p.add_argument("--plot", type=str, default=None, help="only redraw the figures of this run folder")
    args = p.parse_args(argv)
    if args.sigma < 0:
        p.error("--sigma is a standard deviation and must be >= 0")
    for name in ["vocab_size", "layers", "width", "heads", "batch_size", "reps", "n_sens", "sens_every"]:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_len < 8:
        p.error("--max-len must be >= 8")
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    if args.epochs <= 0 or args.lr <= 0:
        p.error("--epochs and --lr must be > 0")
    return args


# -----------------------------------------------------------------------------
# data: GLUE TSV files, a word-level tokenizer, RoBERTa-style pair encoding


def download(task, data_dir):
    """Fetch the official GLUE files for the task into data_dir/<TASK>/ and build train.tsv and dev.tsv."""
    folder = os.path.join(data_dir, task.upper())
    os.makedirs(folder, exist_ok=True)
    for name, url in URLS[task].items():
        try:
            urllib.request.urlretrieve(url, os.path.join(folder, name))
        except OSError as e:
            raise SystemExit(f"language.py: cannot download {url} ({e}). Without a network, put {task.upper()}/"
                             f"train.tsv and dev.tsv (the GLUE files) under {os.path.abspath(data_dir)}") from None
    if task == "qqp":
        with zipfile.ZipFile(os.path.join(folder, "QQP-clean.zip")) as z:
            for name in ["train.tsv", "dev.tsv"]:
                with z.open(f"QQP/{name}") as src, open(os.path.join(folder, name), "wb") as dst:
                    dst.write(src.read())
        return
    # MRPC, GLUE's rule: dev = the training pairs listed in dev_ids.tsv, train = the other training pairs
    with open(os.path.join(folder, "dev_ids.tsv"), encoding="utf-8") as fh:
        dev_ids = {tuple(row) for row in csv.reader(fh, delimiter="\t")}
    with open(os.path.join(folder, "msr_paraphrase_train.txt"), encoding="utf-8-sig") as fh:
        header, *rows = fh.read().splitlines()
    with open(os.path.join(folder, "train.tsv"), "w", encoding="utf-8") as tr, \
            open(os.path.join(folder, "dev.tsv"), "w", encoding="utf-8") as dv:
        tr.write(header + "\n")
        dv.write(header + "\n")
        for row in rows:
            label, id1, id2, s1, s2 = row.split("\t")
            (dv if (id1, id2) in dev_ids else tr).write(f"{label}\t{id1}\t{id2}\t{s1}\t{s2}\n")


def read_tsv(path, task):
    """[(sentence A, sentence B, label)] of a GLUE TSV file; a missing or malformed file is one clear error."""
    a, b, y = COLUMNS[task]
    try:
        with open(path, encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
            missing = [c for c in (a, b, y) if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"no column {missing[0]!r}")
            pairs = [(r[a], r[b], int(r[y])) for r in reader if r[y] not in (None, "")]  # QQP has a few blank rows
    except FileNotFoundError:
        raise SystemExit(f"language.py: {path} not found. Put the GLUE {task.upper()} files (train.tsv, dev.tsv) in "
                         f"{os.path.dirname(os.path.abspath(path))}, or run with --download where there is a "
                         "network") from None
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise SystemExit(f"language.py: {path} is not a GLUE {task.upper()} file ({type(e).__name__}: {e})") from None
    if not pairs:
        raise SystemExit(f"language.py: {path} holds no sentence pairs")
    return pairs


def words(text):
    """Lower-cased words and punctuation marks."""
    return re.findall(r"\w+|[^\w\s]", text.lower())


class Tokenizer:
    """The `size` most frequent training words, after the 4 specials <pad> <s> </s> <unk>."""

    def __init__(self, texts, size):
        counts = collections.Counter(w for t in texts for w in words(t))
        self.itos = SPECIALS + [w for w, _ in counts.most_common(size)]
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def encode(self, text):
        return [self.stoi.get(w, UNK) for w in words(text)]

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
    ids = torch.full((len(pairs), max_len), PAD, dtype=torch.long)
    for i, (a, b, _) in enumerate(pairs):
        seq = tok.encode_pair(a, b, max_len)
        ids[i, : len(seq)] = torch.tensor(seq)
    return ids, torch.tensor([y for _, _, y in pairs])


# -----------------------------------------------------------------------------
# models: every one is embedding -> LayerNorm -> [the sensitivity's noise goes here] -> body -> 2 logits


class Block(nn.Module):
    """Pre-norm transformer block; attn 'relu' puts relu(scores) in place of the softmax."""

    def __init__(self, width, heads, dropout, attn, causal):
        super().__init__()
        self.heads, self.attn, self.causal = heads, attn, causal
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):  # x (B, T, C), mask (B, T) True for real tokens
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5  # (B, nh, T, T)
        keep = mask[:, None, None, :]  # keys that are real tokens
        if self.causal:
            keep = keep & torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        if self.attn == "softmax":
            att = att.masked_fill(~keep, float("-inf")).softmax(-1)
        else:
            att = F.relu(att) * keep
        y = (self.drop(att) @ v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class Transformer(nn.Module):
    """RoBERTa-like encoder (classifier on <s>) or, causal=True, GPT-2-like (classifier on the last real token)."""

    def __init__(self, vocab, max_len, width, layers, heads, dropout, attn="softmax", causal=False):
        super().__init__()
        self.causal = causal
        self.embed, self.norm = nn.Embedding(vocab, width), nn.LayerNorm(width)
        self.pos = nn.Embedding(max_len, width)  # added once, after the noise
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(width, heads, dropout, attn, causal) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, 2)

    def embed_normed(self, tokens):
        return self.norm(self.embed(tokens))  # (B, T, C): where the sensitivity adds its noise

    def forward_normed(self, e, mask):
        x = self.drop(e + self.pos.weight[: e.shape[1]])
        for block in self.blocks:
            x = block(x, mask)
        x = self.ln_f(x)
        last = mask.sum(1) - 1  # the last real token of each sequence
        h = x[torch.arange(len(x), device=x.device), last] if self.causal else x[:, 0]
        return self.head(h)

    def forward(self, tokens):
        mask = tokens != PAD
        return self.forward_normed(self.embed_normed(tokens), mask)


class LSTMLayer(nn.Module):
    """One LSTM layer, written out. Weights are laid out as in torch.nn.LSTM (gates i, f, g, o stacked)."""

    def __init__(self, inputs, hidden):
        super().__init__()
        self.hidden = hidden
        k = hidden**-0.5
        self.W_ih = nn.Parameter(torch.empty(4 * hidden, inputs).uniform_(-k, k))
        self.W_hh = nn.Parameter(torch.empty(4 * hidden, hidden).uniform_(-k, k))
        self.b_ih = nn.Parameter(torch.empty(4 * hidden).uniform_(-k, k))
        self.b_hh = nn.Parameter(torch.empty(4 * hidden).uniform_(-k, k))

    def forward(self, x):  # x (B, T, inputs) -> (B, T, hidden)
        B, T, _ = x.shape
        xw = x @ self.W_ih.T + self.b_ih  # the input projection of every step at once, (B, T, 4H)
        h = c = x.new_zeros(B, self.hidden)
        out = []
        for t in range(T):
            gates = xw[:, t] + h @ self.W_hh.T + self.b_hh
            i, f, g, o = gates.chunk(4, dim=1)
            i = torch.sigmoid(i)  # input gate: how much of the candidate enters the cell
            f = torch.sigmoid(f)  # forget gate: how much of the old cell is kept
            g = torch.tanh(g)  # candidate cell content
            o = torch.sigmoid(o)  # output gate: how much of the cell is shown as the hidden state
            c = f * c + i * g
            h = o * torch.tanh(c)
            out.append(h)
        return torch.stack(out, dim=1)


class LSTMClassifier(nn.Module):
    """Stacked LSTM; the classifier reads the hidden state at the last real token (padding comes after it, so it
    cannot affect the prediction). fused=True runs torch.nn.LSTM with the same weights."""

    def __init__(self, vocab, width, layers, dropout, fused=False):
        super().__init__()
        self.fused = fused
        self.embed, self.norm = nn.Embedding(vocab, width), nn.LayerNorm(width)
        self.layers = nn.ModuleList([LSTMLayer(width, width) for _ in range(layers)])
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width, 2)
        self._fused = {}  # the torch.nn.LSTM shell per device; a plain dict, so its own weights are never registered

    def embed_normed(self, tokens):
        return self.norm(self.embed(tokens))

    def run_fused(self, x):
        weights = {}
        for i, layer in enumerate(self.layers):
            for name in ["W_ih", "W_hh", "b_ih", "b_hh"]:
                torch_name = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}[name]
                weights[f"{torch_name}_l{i}"] = getattr(layer, name)
        if x.device not in self._fused:  # built once: constructing it draws 4 * 8 * hidden^2 random numbers
            self._fused[x.device] = nn.LSTM(x.shape[-1], self.layers[0].hidden, len(self.layers), batch_first=True,
                                            dropout=self.drop.p, device=x.device)
        lstm = self._fused[x.device].train(self.training)  # inter-layer dropout only in training, as the cell path
        return torch.func.functional_call(lstm, weights, (x,))[0]

    def forward_normed(self, e, mask):
        x = self.drop(e)
        if self.fused:
            x = self.run_fused(x)
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x if i == 0 else self.drop(x))
        last = mask.sum(1) - 1
        return self.head(self.drop(x[torch.arange(len(x), device=x.device), last]))

    def forward(self, tokens):
        return self.forward_normed(self.embed_normed(tokens), tokens != PAD)


def build_model(name, attn, vocab, args):
    if name == "lstm":
        return LSTMClassifier(vocab, args.width, args.layers, args.dropout, fused=args.fused)
    return Transformer(vocab, args.max_len, args.width, args.layers, args.heads, args.dropout, attn,
                       causal=name == "gpt2")


# -----------------------------------------------------------------------------
# metrics


def trim(tokens):
    """Drop the columns that are padding in every row: batches padded to --max-len would waste most of the work
    (MRPC pairs average about 50 tokens). Exact, since padding is masked everywhere."""
    return tokens[:, : int((tokens != PAD).sum(1).max())]


@torch.no_grad()
def evaluate(model, tokens, labels, batch_size=256):
    model.eval()
    loss = correct = 0.0
    for i in range(0, len(tokens), batch_size):
        out = model(trim(tokens[i:i + batch_size]))
        loss += F.cross_entropy(out, labels[i:i + batch_size], reduction="sum").item()
        correct += (out.argmax(1) == labels[i:i + batch_size]).sum().item()
    return loss / len(tokens), correct / len(tokens)


@torch.no_grad()
def measure_sensitivity(model, tokens, sigma, reps, positions, align, seed):
    """Noise on one layer-normalised token embedding at a time, padding never. With align='right' the estimator sees
    each sequence shifted to end at the last column, so its per-position profile counts from the end. Returns the
    Sensitivity and, per position of that profile, how many of the pairs have a token there."""
    model.eval()
    tokens = trim(tokens)
    mask = tokens != PAD
    e = model.embed_normed(tokens)  # (N, T, C)
    N, T, C = e.shape
    if align == "right":
        shift = T - mask.sum(1)  # (N,) columns of padding each sequence is moved right by
        cols = torch.arange(T, device=e.device)
        src = (cols - shift[:, None]) % T  # right-aligned column j holds left column j - shift
        e, mask_est = e.gather(1, src[..., None].expand(-1, -1, C)), mask.gather(1, src)

        def f(xb, idx):  # shift the chunk back to the left-aligned layout the models expect
            back = (cols + shift[idx, None]) % T
            return model.forward_normed(xb.gather(1, back[..., None].expand(-1, -1, C)), mask[idx])
    else:
        mask_est = mask

        def f(xb, idx):
            return model.forward_normed(xb, mask[idx])
    gen = torch.Generator(e.device).manual_seed(seed)
    s = sensitivity(f, e, gaussian(sigma), mask=mask_est, reps=reps, positions=positions, generator=gen)
    return s, mask_est.sum(0)


# -----------------------------------------------------------------------------
# training


def train_one(name, attn, seed, args, data, vocab, results):
    run = f"{name}{'' if name == 'lstm' else '-' + attn}/seed{seed}"
    seed_all(seed)
    device = data["train"][0].device
    model = build_model(name, attn, vocab, args).to(device)
    print(f"{run}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    x, y = data["train"]
    gen = torch.Generator(device).manual_seed(seed)
    total = int(args.epochs * len(x))
    seen, next_eval, t0 = 0, 0, time.time()
    while True:
        if seen >= next_eval or seen >= total:
            row = {"examples": seen, "time": 0.0}
            row["train_loss"], row["train_acc"] = evaluate(model, x, y)
            row["valid_loss"], row["valid_acc"] = evaluate(model, *data["valid"])
            s, pairs = measure_sensitivity(model, x[: args.n_sens], args.sigma, args.reps, args.positions, args.align,
                                           seed)
            row["sens"], row["sens_stderr"] = s.mean, s.stderr
            if args.sens_valid:
                sv, _ = measure_sensitivity(model, data["valid"][0][: args.n_sens], args.sigma, args.reps,
                                            args.positions, args.align, seed)
                row["sens_valid"], row["sens_valid_stderr"] = sv.mean, sv.stderr
            row["time"] = time.time() - t0
            results.log(run, row)
            print(f"{run} examples {seen:7d} | train loss {row['train_loss']:.4f} acc {row['train_acc']:.3f} | "
                  f"valid acc {row['valid_acc']:.3f} | sens {row['sens']:.4f} +- {row['sens_stderr']:.4f} | "
                  f"{row['time']:.0f}s")
            next_eval += args.sens_every
            if seen >= total:
                break
        model.train()
        for idx in torch.randperm(len(x), generator=gen, device=device).split(args.batch_size):
            loss = F.cross_entropy(model(trim(x[idx])), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += len(idx)
            if seen >= next_eval or seen >= total:
                break
    final = {k: row[k] for k in ["sens", "sens_stderr", "train_acc", "valid_acc", "train_loss", "valid_loss"]}
    final["test_acc"] = row["valid_acc"]  # GLUE's test labels are hidden: validation is the test set
    if args.sens_valid:
        final["sens_valid"] = row["sens_valid"]
    final["sens_by_position"] = s.per_position.tolist()  # as long as the longest measured pair
    final["pairs_by_position"] = pairs.tolist()  # how many of the measured pairs reach each position
    final["align"] = args.align
    results.final(run, final)


# -----------------------------------------------------------------------------
# figures


def plot(data, folder):
    plt = pyplot()
    groups = {}
    for run, r in data["runs"].items():
        if r["history"]:
            groups.setdefault(run.rsplit("/", 1)[0], []).append(r)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, runs in groups.items():
        hists = [r["history"] for r in runs]
        plot_curves(axes[0], hists, "examples", "sens", f"{name} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        plot_curves(axes[1], hists, "examples", "train_acc", name)
        plot_curves(axes[2], hists, "examples", "valid_acc", name)
    for ax, t in zip(axes, ["sensitivity (train subset)", "train accuracy", "validation accuracy"]):
        ax.set_title(t)
        ax.set_xlabel("training examples seen")
        ax.legend(fontsize=7)
    paths = [save_figure(fig, f"{folder}/sensitivity.png")]
    done = {name: [r["final"] for r in runs if r["final"]] for name, runs in groups.items()}
    if any(done.values()):  # the per-position profile of the final models, mean over seeds
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, finals in done.items():
            if finals:
                prof = torch.tensor([f["sens_by_position"] for f in finals]).nanmean(0)
                right = finals[0]["align"] == "right"
                pos = torch.arange(len(prof)) - (len(prof) - 1 if right else 0)
                if "pairs_by_position" in finals[0]:  # drop the rare long tail: positions a quarter of pairs reach
                    pairs = torch.tensor(finals[0]["pairs_by_position"])
                    keep = pairs >= pairs.max() / 4
                    prof, pos = prof[keep], pos[keep]
                ax.plot(pos, prof, label=name)
        ax.set_xlabel("position counted from the last token (0)" if right else "position")
        ax.set_ylabel("sensitivity at that position")
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, f"{folder}/sensitivity_by_position.png"))
    return paths


def main(args):
    if args.plot:
        print("wrote", *plot(load_results(args.plot), args.plot))
        return None
    if args.download:
        download(args.task, args.data_dir)
    folder_data = os.path.join(args.data_dir, args.task.upper())
    train = read_tsv(os.path.join(folder_data, "train.tsv"), args.task)[: args.n_train]
    valid = read_tsv(os.path.join(folder_data, "dev.tsv"), args.task)[: args.n_valid]
    tok = Tokenizer([t for a, b, _ in train for t in (a, b)], args.vocab_size)
    device, folder, results = start_run("language", args, f"{args.task}-{'-'.join(args.model)}")
    data = {"train": [t.to(device) for t in encode(train, tok, args.max_len)],
            "valid": [t.to(device) for t in encode(valid, tok, args.max_len)]}
    print(f"{args.task}: {len(train)} train / {len(valid)} validation pairs, vocabulary {len(tok.itos)}")
    try:
        for name in args.model:
            for attn in (["softmax"] if name == "lstm" else args.attn):
                for seed in args.seeds:
                    train_one(name, attn, seed, args, data, len(tok.itos), results)
    except KeyboardInterrupt:
        print("interrupted: metrics.json keeps every evaluation so far")
    finally:
        if any(r["history"] for r in results.data["runs"].values()):
            print("wrote", *plot(results.data, folder))
    return results.data


if __name__ == "__main__":
    main(parse_args())
