"""Performance benchmarks, each a ratio against a baseline timed in the same process and run.

- est_eff_<model>: the estimator's perturbed evaluations per second / plain forward passes per second of the same
  model at the same batch size. Every perturbed copy needs one forward pass, so 1.0 is the physical limit.
- est_speedup_<model>: the estimator vs the naive method of the authors' code (a batch of 100 inputs, a Python loop
  over (position, draw) with one forward of the 100 perturbed inputs per draw and .item() after each), at the same
  total number of evaluations.
- train_speedup_<model>: training images/s of vision.py's on-device data pipeline / a torchvision Dataset +
  DataLoader + ToTensor/Normalize pipeline (batch 100), same model.
- est_eff_roberta: the estimator's efficiency on language.py's RoBERTa encoder (padding masks, right-aligned profile).
- est_prefix_speedup_<lstm|gpt2>: the causal models' sensitivity with the prefix cache (resuming from the clean
  states before the perturbed token) / recomputing every copy from its start, on MRPC-length pairs; same answer.
  Every position of each pair (language.py's default), and _sampled: 8 sampled positions per pair (--sens-positions
  8, as the README's MRPC runs).
- est_bucket_speedup_roberta: RoBERTa's sensitivity with its copies in groups of similar length, each cut to its
  longest / every copy padded to the longest pair, 8 sampled positions per pair as the MRPC runs; same answer.
  eval_sorted_speedup_roberta: language.evaluate on 256 MRPC-length pairs in batches of 32 (sorted by length, each
  batch trimmed to its longest) / the same batches in the pairs' own order; same accuracy.
- scattered_rows_speedup_<cnn|vit>: vision.py's scattered mask with its copies through the model in batches of 100
  (a CPU; 2,048 on a GPU) / of 2,048 images, the same masks and noise.
- read_token_speedup_<vit|roberta|gpt2>: a model evaluated with its last block computing only the token its head
  reads (the ViT's class token, RoBERTa's <s>, GPT-2's last real token) / with every token, as in training: the ViT's
  sensitivity (patch mask), RoBERTa's forward passes over MRPC-length pairs in batches of 64, and GPT-2's passes over
  the same pairs resumed from its prefix cache, each perturbed at one position; the same predictions.
  read_token_train_speedup_parity_<64|128>: an AdamW training step of parity.py's transformer (batch 256 of 20 bits,
  width 64 as its settings 1-4 and 6, 128 as setting 5) with the last block computing the class token alone, as
  parity.py trains / every token; the same gradients up to float rounding. read_token_train_speedup_vit: the same
  for a training step of the converged protocol's ViT (batch 100), which on a CPU draws every token's dropout masks
  and keeps the class token's (on a GPU it trains on every token: a ratio near 1); the same draws and gradients.
- sens_needed_speedup_vit: a short training run of the converged protocol's ViT with vision.py --sens-during every /
  needed (the sensitivity during training only where a reported number reads it), whole runs; same numbers.
- paper_vit_step_ms: a training step of the authors' ViT at the paper's size (depth 8, 32 heads of 64; a batch of 100
  28x28 images, patches of 4), in ms, as vision.py takes it in float32. On a GPU also its levers, each as the eager
  step's time / the lever's: paper_vit_compile_speedup (vision.py --compile), paper_vit_amp_speedup (--amp),
  paper_vit_amp_compile_speedup (both), and paper_vit_tf32_speedup (TF32 matmuls, not a flag of the scripts).
- lstm_fused_speedup: a training step of language.py's LSTM with --fused (torch.nn.LSTM) / the hand-written cell.
- corruption_images_per_s: images/s of the generated corruptions (corruptions.py: all but frost, severities
  1-5), absolute.
- shared_cpu_slowdown: a small training run's wall time beside one busy process (the same run, as a second seed) /
  alone, with the scripts' thread policy (one thread per process); shared_cpu_slowdown_default: the same with torch's
  default threads (torch_default_threads) in both processes; alone_default_speedup: the same run alone, torch's
  default threads / one thread (what the policy costs on an idle machine).
- quickstart_s, quickstart_ratio: the README's quick start (`python synthetic.py`, one thread) in a process of its
  own, in seconds, and divided by reference_s, a fixed small training run (training_workload) timed in the same
  process, so that the machine's speed cancels: the README's quick-start time should be quickstart_ratio x
  reference_s on any machine. With --n-inputs below 10 (a smoke test) the quick start runs 20 steps only, and
  eval_sorted and read_token take 32 pairs instead of 256.
- est_1e6_mem_mb: the growth of peak memory (CUDA: allocated bytes; CPU: process RSS) while the estimator runs 10^6
  perturbed evaluations of a tiny model; bounded by one chunk.

    python bench.py                  # CPU, a few minutes on 2 cores; run it on an otherwise idle machine
    python bench.py --device cuda    # on a GPU
    python bench.py --rounds 1 --n-inputs 4   # a smoke test, seconds
    python bench.py --device cuda --only estimator,language   # some groups only (--help lists them)
Prints one `name value` line per figure and writes them to out/bench/bench[-k].json (never replacing a file).
"""

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import vision
import vits
from common import default_batch_size, gaussian, patchify, sensitivity, unpatchify
from runs import (ArgumentParser, Results, cli, environment, get_device, nonnegative_int, positive_int,
                  set_threads, write_json)

TORCH_DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice, read before any script sets its policy


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    p.add_argument("--device", type=str, default="auto", help="auto | cpu | cuda")
    p.add_argument("--batch-size", type=positive_int, default=None, help="estimator chunk (rows); default: the "
                   "estimator's")
    p.add_argument("--n-inputs", type=positive_int, default=None, help="inputs per estimator run; default 100 cpu, "
                   "1000 cuda")
    p.add_argument("--rounds", type=positive_int, default=7, help="timed rounds; each figure is the median over rounds")
    p.add_argument("--threads", type=nonnegative_int, default=0, help="CPU threads while timing (0: the scripts' "
                   "policy, one)")
    p.add_argument("--only", type=str, default=None, help="comma-separated groups to run (default: all): "
                   + ", ".join(GROUPS))
    p.add_argument("--out", type=str, default=None, help="where the figures are written (default: the first free "
                   "out/bench/bench[-k].json); an existing file is never replaced")
    args = p.parse_args(argv)
    if args.only is not None:
        args.only = args.only.split(",")
        unknown = [g for g in args.only if g not in GROUPS]
        if unknown:
            p.error(f"--only: no benchmark group {', '.join(g or repr(g) for g in unknown)} (choose from "
                    f"{', '.join(GROUPS)})")  # an empty name (a stray comma) shows as ''
    if args.out is not None and os.path.exists(args.out):
        p.error(f"--out {args.out} exists; bench.py never replaces a results file")
    folder = os.path.dirname(os.path.abspath(args.out or "out/bench/bench.json"))
    try:  # checked before the benchmarks run, not after
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        p.error(f"--out {args.out}: cannot write in {folder} ({e.strerror})")
    return args


# -----------------------------------------------------------------------------
# two small models: a ViT on 32x32x3 (64 patch tokens) and an MLP on 28x28x1 (16 patch tokens)


class TinyViT(nn.Module):
    """vision.py's transformer on patch tokens: linear patch embedding, learned positions, mean pooling."""

    def __init__(self, *, image=32, channels=3, patch=4, dim=64, depth=2, heads=4, classes=10):
        super().__init__()
        self.embed = nn.Linear(channels * patch * patch, dim)
        self.pos = nn.Parameter(0.02 * torch.randn(1, (image // patch) ** 2, dim))
        self.transformer = vits.Transformer(dim, depth, heads, dim // heads, 2 * dim, dropout=0.0)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):  # (B, T, C*p*p) patch tokens
        return self.head(self.transformer(self.embed(tokens) + self.pos).mean(1))


class TinyMLP(nn.Module):
    def __init__(self, *, inputs=784, hidden=512, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.LeakyReLU(), nn.Linear(hidden, hidden), nn.LeakyReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, tokens):  # (B, T, D) patch tokens, flattened back to the image's pixels
        return self.net(tokens.flatten(1))


# -----------------------------------------------------------------------------
# timing


def timed_rounds(fns, device, rounds):
    """Wall times of each fn, called in turn for `rounds` rounds after a warm-up, synchronising around each call.
    Interleaving puts every method under the same machine conditions; compare them round by round."""
    for fn in fns:
        fn()
    times = []
    for _ in range(rounds):
        row = []
        for fn in fns:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            row.append(time.perf_counter() - t0)
        times.append(row)
    return times


def median(values):
    return statistics.median(values)


def naive_sensitivity(model, x, sigma, reps):
    """The authors' method, done honestly: per batch of 100 inputs, one perturbed forward per (position, draw)."""
    flips = 0
    with torch.inference_mode():
        for b in range(0, len(x), 100):
            xb = x[b:b + 100]
            clean = model(xb).argmax(1)
            for t in range(x.shape[1]):
                for _ in range(reps):
                    noisy = xb.clone()
                    noisy[:, t] += sigma * torch.randn_like(noisy[:, t])
                    flips += (model(noisy).argmax(1) != clean).sum().item()
    return flips / (len(x) * x.shape[1] * reps)


def bench_estimator(name, model, x, batch_size, rounds, device):
    """Efficiency against plain forwards and speed-up against the naive loop, at the same number of evaluations."""
    model.eval()
    f = lambda xb, idx: model(xb)
    batch_size = batch_size or default_batch_size(x)
    evals = x.shape[0] * x.shape[1]
    xb = x[torch.arange(batch_size, device=device) % len(x)].clone()
    n_full, rest = divmod(evals, batch_size)

    def forwards():  # plain forward passes of the same model at the same batch size, over as many rows
        with torch.inference_mode():
            for _ in range(n_full):
                model(xb)
            if rest:
                model(xb[:rest])

    times = timed_rounds([lambda: sensitivity(f, x, gaussian(0.1), batch_size=batch_size), forwards,
                          lambda: naive_sensitivity(model, x, 0.1, 1)], device, rounds)
    t_est = median([t[0] for t in times])
    return {f"est_eff_{name}": median([t[1] / t[0] for t in times]),
            f"est_speedup_{name}": median([t[2] / t[0] for t in times]),
            f"est_evals_per_s_{name}": evals / t_est}


class UInt8Images(torch.utils.data.Dataset):
    """What torchvision's MNIST and CIFAR10 datasets do per item: a uint8 array -> PIL image -> transform."""

    def __init__(self, images, labels, transform):
        self.images, self.labels, self.transform = images.numpy(), labels.tolist(), transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = self.images[i]
        img = Image.fromarray(img[0], mode="L") if img.shape[0] == 1 else Image.fromarray(img.transpose(1, 2, 0))
        return self.transform(img), self.labels[i]


def epoch_on_device(model, opt, x, y, *, batch_size, gen):
    """One epoch of vision.py's training loop: uint8 images indexed on the device in a random order, normalised
    in batches, SGD steps; no Dataset, no DataLoader."""
    model.train()
    perm = torch.randperm(len(x), generator=gen, device=x.device)
    for idx in perm.split(batch_size):
        loss = F.cross_entropy(model(vision.normalize(x[idx])), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item()


def bench_training(name, model, x, y, rounds, device):
    """Training images/s of vision.py's on-device pipeline (uint8 tensors on the device, batched normalisation)
    divided by that of the usual torchvision pipeline (Dataset + DataLoader + ToTensor/Normalize, batch 100, the
    authors' num_workers=0), one epoch each, same model, SGD, interleaved rounds."""
    from torchvision import transforms

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator(device).manual_seed(0)
    xd, yd = x.to(device), y.to(device)
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,) * x.shape[1], (0.5,) * x.shape[1])])
    loader = torch.utils.data.DataLoader(UInt8Images(x, y, tf), batch_size=100, shuffle=True)

    def ours():
        epoch_on_device(model, opt, xd, yd, batch_size=100, gen=gen)

    def usual():
        model.train()
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        loss.item()

    times = timed_rounds([ours, usual], device, rounds)
    return {f"train_speedup_{name}": median([t[1] / t[0] for t in times]),
            f"train_images_per_s_{name}": len(x) / median([t[0] for t in times])}


def mrpc_like(n, device, seed=0):
    """n right-padded token sequences with the lengths of MRPC pairs under language.py's tokenizer (mean 51, std 12,
    20 to 101 tokens)."""
    import language

    g = torch.Generator().manual_seed(seed)
    lengths = (51 + 12 * torch.randn(n, generator=g)).round().clamp(20, 101).long()
    T = int(lengths.max())
    tokens = torch.randint(4, 1000, (n, T), generator=g)
    tokens[torch.arange(T) >= lengths[:, None]] = language.PAD
    return tokens.to(device)


def bench_language(n, rounds, device, n_pairs=256):
    """language.py's models at the paper's size (4 layers, width 256, 8 heads) on MRPC-length pairs: the estimator's
    efficiency on the RoBERTa encoder (masked, right-aligned profile, as language.py measures it); the speed-up of
    the prefix cache for the causal models (the same answer, exactly); and of --fused (torch.nn.LSTM) over the
    hand-written LSTM, forward and backward of one batch of 32 as in training."""
    import language

    small = language.parse_args(["--fused"])
    tokens = mrpc_like(n, device)
    roberta = language.build_model("roberta", "softmax", 1000, small).to(device).eval()
    mask = tokens != language.PAD
    evals = int(mask.sum())

    def forwards():  # plain forward passes over as many rows, at the estimator's batch size; how many
        e, done = roberta.embed_normed(tokens), 0
        bs = default_batch_size(e)
        rows = torch.arange(evals, device=device) % len(tokens)
        with torch.inference_mode():
            for i in range(0, evals, bs):
                done += len(roberta.forward_normed(e[rows[i:i + bs]], mask[rows[i:i + bs]]))
        return done

    def measure():  # the estimator, as language.py runs it on RoBERTa
        return language.measure_sensitivity(roberta, tokens, sigma=1.0, reps=1, positions=None, align="right", seed=0)

    times = timed_rounds([measure, forwards],
                         device, rounds)
    out = {"est_eff_roberta": median([t[1] / t[0] for t in times])}
    sampled = mrpc_like(6 * n, device, seed=1)  # 8 sampled positions per pair, as the MRPC runs: about as many copies
    for name in ["lstm", "gpt2"]:
        model = language.build_model(name, "softmax", 1000, small).to(device).eval()
        for suffix, pairs, positions in [("", tokens, None), ("_sampled", sampled, 8)]:
            def measure(cache, m=model, x=pairs, k=positions):
                return language.measure_sensitivity(m, x, sigma=2.0, reps=1, positions=k, align="right", seed=0,
                                                    prefix_cache=cache)

            times = timed_rounds([lambda: measure(True), lambda: measure(False)], device, rounds)
            out[f"est_prefix_speedup_{name}{suffix}"] = median([t[1] / t[0] for t in times])
    def measure(buckets):
        return language.measure_sensitivity(roberta, sampled, sigma=2.0, reps=1, positions=8, align="right", seed=0,
                                            buckets=buckets)

    times = timed_rounds([lambda: measure(True), lambda: measure(False)], device, rounds)
    out["est_bucket_speedup_roberta"] = median([t[1] / t[0] for t in times])
    pairs = mrpc_like(n_pairs, device, seed=2)  # 256: in 8 batches of 32, as MRPC's 5,801 pairs are in 23 of 256
    labels = torch.zeros(len(pairs), dtype=torch.long, device=device)

    @torch.no_grad()
    def unsorted():  # evaluate's batches before the sort: the pairs in their own order; its mean loss
        total = 0.0
        for idx in torch.arange(len(pairs), device=device).split(32):
            total += F.cross_entropy(roberta(language.trim(pairs[idx])), labels[idx], reduction="sum")
        return total / len(pairs)

    times = timed_rounds([lambda: language.evaluate(roberta, pairs, labels, batch_size=32), unsorted], device, rounds)
    out["eval_sorted_speedup_roberta"] = median([t[1] / t[0] for t in times])
    lstm = language.build_model("lstm", None, 1000, small).to(device).train()
    batch = tokens[torch.arange(32, device=device) % len(tokens)]  # a training batch of 32 pairs

    def step(fused):
        lstm.fused = fused
        loss = F.cross_entropy(lstm(batch), torch.zeros(32, dtype=torch.long, device=device))
        loss.backward()
        return loss.detach()

    times = timed_rounds([lambda: step(True), lambda: step(False)], device, rounds)
    out["lstm_fused_speedup"] = median([t[1] / t[0] for t in times])
    return out


def bench_scattered(args, images, rounds, device):
    """The scattered mask (the authors' estimator, vision.py's final sweep) of the converged protocol's CNN and ViT on
    28x28 images: copies through the model in batches of its default rows / in batches of 2,048, the same draws."""
    out = {}
    for name in ["cnn", "vit"]:
        model = vision.build_model(name, args, 1, 28, 10).to(device).eval()
        times = timed_rounds([lambda m=model: vision.scattered_sensitivity(m, images, 4, 1.0, 49, 0),
                              lambda m=model: vision.scattered_sensitivity(m, images, 4, 1.0, 49, 0, rows=2048)],
                             device, rounds)
        out[f"scattered_rows_speedup_{name}"] = median([t[1] / t[0] for t in times])
    return out


def bench_read_token(args, images, rounds, device, n_pairs=256):
    """An evaluating ViT (the converged protocol's), RoBERTa and GPT-2 (language.py's) with the last block on the read
    token alone / on every token. For the language models the second sets the model's own training flag alone, which
    is all its forward reads: its dropout modules stay in eval mode, so both compute the same function."""
    import language

    vit = vision.build_model("vit", args, 1, 28, 10).to(device).eval()
    roberta = language.build_model("roberta", "softmax", 1000, language.parse_args([])).to(device).eval()
    gpt2 = language.build_model("gpt2", "softmax", 1000, language.parse_args([])).to(device).eval()
    tokens, pairs = patchify(images, 4), language.trim(mrpc_like(n_pairs, device, seed=3))
    with torch.inference_mode():  # GPT-2 resumes from its clean prefix cache, each pair perturbed at one position
        e, mask = gpt2.embed_normed(pairs), pairs != language.PAD
        cache, _ = gpt2.prefix_cache(e, mask)
    start = (torch.rand(len(pairs), generator=torch.Generator().manual_seed(4)).to(device) * mask.sum(1)).long()

    @torch.inference_mode()
    def run(model, every):  # the ViT's sensitivity, or the language model's logits
        model.training = every and model is not vit
        if model is vit:
            f = (lambda img: vit_every_token(vit, img)) if every else vit
            out = sensitivity(lambda xb, idx: f(unpatchify(xb, 4, (1, 28, 28))), tokens, gaussian(1.0), seed=0)
        else:
            out = [roberta(language.trim(pairs[idx])) if model is roberta else
                   gpt2.forward_from(e[idx], mask[idx], start[idx], cache, idx)
                   for idx in torch.arange(len(pairs), device=device).split(64)]
        model.training = False
        return out

    return {f"read_token_speedup_{name}": median([t[1] / t[0] for t in timed_rounds(
        [lambda m=model: run(m, False), lambda m=model: run(m, True)], device, rounds)])
        for name, model in [("vit", vit), ("roberta", roberta), ("gpt2", gpt2)]}


def bench_read_token_training(args, n, rounds, device):
    """A training step with the last block on the read token alone (the model's forward) / on every token: parity.py's
    transformer (n sequences of 20 bits) and vits.py's ViT (the converged protocol's, 100 28x28 images)."""
    import parity

    g = torch.Generator().manual_seed(0)
    bits = (torch.randint(0, 2, (n, 20, 1), generator=g) * 2 - 1).float().to(device)
    images = torch.randn(100 if n >= 64 else 8, 1, 28, 28, generator=g).to(device)  # a smoke test: 8

    def speedup(model, every_token, x):
        model, y = model.to(device), torch.randint(0, 2, (len(x),), generator=g).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def steps(forward):
            for _ in range(5):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(forward(x), y).backward()
                opt.step()

        return median([t[1] / t[0] for t in timed_rounds([lambda: steps(model), lambda: steps(every_token)],
                                                         device, rounds)])

    out = {}
    for dim in [64, 128]:
        p = parity.ParityTransformer(20, dim, 4, 2)
        every = lambda x, p=p: p.head(p.blocks(p.embed(x))[:, 0])  # noqa: E731
        out[f"read_token_train_speedup_parity_{dim}"] = speedup(p, every, bits)
    vit = vision.build_model("vit", args, 1, 28, 10).train()
    out["read_token_train_speedup_vit"] = speedup(vit, lambda img: vit_every_token(vit, img), images)
    return out


def vit_every_token(vit, img):
    """vits.ViT's forward with its last block on every token (rows=None), training or evaluating."""
    return vit.head(vit.transformer(vit.drop(vit.embed(img)), None)[:, 0])


def bench_sens_during(n, device):
    """sens_needed_speedup_vit: the wall time of a vision.py training run of the converged protocol's ViT (depth 4, 4
    heads of 16; 3n 28x28 images, 9 epochs, an evaluation after each, the patch mask at sigma 0.1 and 1 on n / 10
    images, so that an evaluation costs about what the training between two does, as in that protocol) with
    --sens-during every / needed, three --match-acc levels first reached at about its 3rd, 5th and 9th of 10
    evaluations (as the converged ViT reaches 0.9, 0.95 and 0.99); sens_needed_measured: how many of the 10 the second
    run measured. One round each: a whole run."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (3 * n,), generator=g)
    x = torch.randint(0, 160, (3 * n, 1, 28, 28), generator=g, dtype=torch.uint8)
    x[torch.arange(3 * n), :, 2 * y + 4] += 60  # the label is a brighter row: learned over the epochs, not at once
    data = {"train_x": x, "train_y": y}
    data.update(test_x=data["train_x"][:n], test_y=data["train_y"][:n])
    base = ["--dataset", "fake28", "--depth", "4", "--heads", "4", "--dim-head", "16", "--epochs", "9",
            "--eval-every", "1", "--batch-size", "50", "--n-sens", str(max(2, n // 10)), "--sigma", "0.1", "1",
            "--optimizer", "adam", "--lr", "1e-3", "--progress-every", "0", "--device", device.type]

    def run(extra):
        args = vision.parse_args(base + extra)
        with tempfile.TemporaryDirectory() as folder:
            results = Results(folder, "vision", vars(args), device)
            t = time.perf_counter()
            vision.train(name="vit", seed=0, args=args, data=data, results=results, device=device)
            return time.perf_counter() - t, results.data["runs"]["vit/seed0"]["history"]

    every, h = run(["--sens-during", "every"])
    acc = [r["train_acc"] for r in h]
    new_high = [i for i in range(1, len(acc)) if acc[i] > max(acc[:i])]  # where a level can be first reached
    levels = sorted({next((j for j in new_high if j >= i), new_high[-1]) for i in (3, 5, 9)}) if new_high else [1]
    needed, h = run(["--sens-during", "needed", "--match-acc", *(f"{acc[j]}" for j in levels)])
    return {"sens_needed_speedup_vit": every / needed, "sens_needed_measured": sum("sens" in r for r in h)}


def bench_paper_vit(n, rounds, device):
    """The authors' ViT's training step at the paper's size, eager in float32, and on CUDA the same step with each lever
    of vision.py's GPU path (the same model, optimiser and batch of min(100, n) images, interleaved rounds of 20 steps;
    one on a CPU, where --compile and --amp are not offered for training). The first call of each is its warm-up (and
    compilation)."""
    cuda = device.type == "cuda"
    args = vision.parse_args(["--dataset", "fashionmnist", "--depth", "8", "--heads", "32", "--dim-head", "64"])
    torch.manual_seed(0)
    model = vision.build_model("vit", args, 1, 28, 10).to(device)
    opt = vision.make_optimizer("vit", model, args)  # the paper's SGD at the ViT's rate
    g = torch.Generator(device).manual_seed(0)
    x = torch.randint(0, 256, (min(100, n), 1, 28, 28), generator=g, device=device, dtype=torch.uint8)
    y = torch.randint(0, 10, (len(x),), generator=g, device=device)
    steps = 20 if cuda else 1

    def step(fwd, amp=False, tf32=False):
        def fn():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for _ in range(steps):
                with torch.autocast("cuda", torch.bfloat16, enabled=amp):
                    loss = F.cross_entropy(fwd(vision.normalize(x)), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            torch.backends.cuda.matmul.allow_tf32 = False  # torch's default
        return fn

    if not cuda:
        return {"paper_vit_step_ms": 1000 * median(t[0] for t in timed_rounds([step(model)], device, rounds)) / steps}
    compiled = torch.compile(model)
    levers = {"compile": step(compiled), "amp": step(model, amp=True), "amp_compile": step(compiled, amp=True),
              "tf32": step(model, tf32=True)}
    times = timed_rounds([step(model), *levers.values()], device, rounds)
    out = {"paper_vit_step_ms": 1000 * median(t[0] for t in times) / steps}
    return out | {f"paper_vit_{k}_speedup": median(t[0] / t[i] for t in times) for i, k in enumerate(levers, 1)}


def training_workload(n):
    """A small training run on the CPU, as the experiments' are: vision.py's ViT (depth 2, 4 heads of 16, 7x7
    patches) on n 28x28 images, one SGD epoch of batch 100 per call."""
    args = vision.parse_args(["--dataset", "fake28", "--depth", "2", "--heads", "4", "--dim-head", "16", "--dim", "64",
                              "--patch-size", "7"])
    torch.manual_seed(0)
    model = vision.build_model("vit", args, 1, 28, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (n,), generator=g)
    return lambda: epoch_on_device(model, opt, x, y, batch_size=100, gen=g)


def busy_worker(threads, n, seconds):
    """The other process of shared_cpu_slowdown: the same training workload in a loop, with the same thread policy,
    until `seconds` have passed (bench.py kills it sooner). Prints 'ready' once it runs."""
    torch.set_num_threads(threads)
    run, end = training_workload(n), time.time() + seconds
    run()
    print("ready", flush=True)
    while time.time() < end:
        run()


def bench_shared_cpu(n, rounds):
    """shared_cpu_slowdown: wall time of a small training run beside one busy process (the same run in a loop, as a
    second seed would be) divided by its time alone, with the thread policy of runs.set_threads (one thread per
    process), and with torch's default threads in both processes (shared_cpu_slowdown_default)."""
    out, alone_time = {}, {}
    for key, threads in [("shared_cpu_slowdown", 1), ("shared_cpu_slowdown_default", TORCH_DEFAULT_THREADS)]:
        torch.set_num_threads(threads)
        run = training_workload(n)
        alone = alone_time[key] = median([t[0] for t in timed_rounds([run], torch.device("cpu"), rounds)])
        worker = subprocess.Popen([sys.executable, "-c", f"import bench; bench.busy_worker({threads}, {n}, 900)"],
                                  cwd=os.path.dirname(os.path.abspath(__file__)), stdout=subprocess.PIPE, text=True)
        try:
            worker.stdout.readline()  # 'ready': the other process is training
            busy = median([t[0] for t in timed_rounds([run], torch.device("cpu"), rounds)])
        finally:
            worker.kill()
            worker.wait()
        out[key] = busy / alone
    torch.set_num_threads(1)
    out["torch_default_threads"] = TORCH_DEFAULT_THREADS
    out["alone_default_speedup"] = alone_time["shared_cpu_slowdown"] / alone_time["shared_cpu_slowdown_default"]
    return out


def bench_quickstart(n, rounds):
    """quickstart_s: `python synthetic.py` (the README's quick start) timed in a fresh one-thread process (its
    imports included, as a user waits for them); quickstart_ratio: over reference_s, one epoch of the fixed
    training_workload(n) in this process, with the same thread policy; below n = 300 (a smoke test) 20 steps only."""
    torch.set_num_threads(1)
    reference = median([t[0] for t in timed_rounds([training_workload(n)], torch.device("cpu"), rounds)])
    root = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "synthetic.py", "--out-dir", out] + (["--steps", "20"] if n < 300 else [])
        t = time.perf_counter()
        subprocess.run(argv, cwd=root, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        quick = time.perf_counter() - t
    return {"quickstart_s": quick, "reference_s": reference, "quickstart_ratio": quick / reference}


def bench_corruptions(device, n=1000):
    """Images/s of the generated corruptions (corruptions.py): every one but frost (it needs Hendrycks' textures) at
    every severity on n 32x32x3 images."""
    import corruptions

    names = [c for c in corruptions.SEVERITY if c != "frost"]
    x = torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    x, gen = x.to(device), torch.Generator(device).manual_seed(0)
    corruptions.corrupt(x[:10], "fog", 1, gen)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for name in names:
        for s in range(1, 6):
            corruptions.corrupt(x, name, s, gen)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"corruption_images_per_s": n * len(names) * 5 / (time.perf_counter() - t0)}


def rss_mb():
    """This process's resident memory now, in MB (Linux /proc/self/status)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def bench_memory(device):
    """Peak-memory growth (MB) while the estimator runs 10^6 perturbed evaluations of a linear model: CUDA's peak
    allocation, or on a CPU the process's resident memory sampled every 2 ms by a thread (the kernel's own peak
    cannot be reset, and earlier work would mask it). Run last: the 10^6 run slows later timings."""
    model = nn.Linear(16 * 8, 10).to(device)
    x = torch.randn(5000, 16, 8, device=device)
    f = lambda xb, idx: model(xb.flatten(1))
    run = lambda: sensitivity(f, x, gaussian(0.1), reps=13, batch_size=8192)  # 5,000 x 16 x 13: 1.04 x 10^6
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        s = run()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        before, samples, done = rss_mb(), [], threading.Event()

        def sample():
            while not done.is_set():
                samples.append(rss_mb())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        s = run()
        done.set()
        sampler.join()
        peak = max(samples) - before
    assert s.evaluations >= 10**6
    return {"est_1e6_mem_mb": peak}


def reserve(path):
    """Create the results file, empty, with O_EXCL before anything runs: two bench.py runs at once never pick the
    same file (without --out, the first free out/bench/bench[-k].json), and a finished run never loses to another."""
    k = 1
    while True:
        candidate = path or ("out/bench/bench.json" if k == 1 else f"out/bench/bench-{k}.json")
        os.makedirs(os.path.dirname(os.path.abspath(candidate)), exist_ok=True)
        try:
            os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return candidate
        except FileExistsError:
            if path:
                raise ValueError(f"--out {path} exists; bench.py never replaces a results file") from None
            k += 1


def main(args):
    args.out = reserve(args.out)
    try:
        return run_all(args)
    finally:
        if os.path.getsize(args.out) == 0:  # the run stopped before its results: give the name back
            os.remove(args.out)


GROUPS = ["estimator", "training", "scattered", "read_token", "sens_during", "paper_vit", "language", "corruptions",
          "shared_cpu", "quickstart", "memory"]  # --only's names, in the order they run


def run_all(args):
    set_threads(args.threads)
    device = get_device(args.device)
    cuda = device.type == "cuda"
    n = args.n_inputs or (1000 if cuda else 100)
    torch.manual_seed(0)
    small = vision.parse_args(["--dataset", "fashionmnist", "--depth", "4", "--heads", "4", "--dim-head", "16"])
    n_pairs = 256 if n >= 10 else 32  # MRPC-length pairs evaluated by read_token and eval_sorted (a smoke test: 32)

    def estimator():
        vit, mlp = TinyViT().to(device), TinyMLP().to(device)
        out = bench_estimator("vit", vit, patchify(torch.randn(n, 3, 32, 32, device=device), 4), args.batch_size,
                              args.rounds, device)
        return out | bench_estimator("mlp", mlp, patchify(torch.randn(16 * n, 1, 28, 28, device=device), 7),
                                     args.batch_size, args.rounds, device)

    def training():
        g = torch.Generator().manual_seed(0)
        x28 = torch.randint(0, 256, (30 * n, 1, 28, 28), generator=g, dtype=torch.uint8)
        y28 = torch.randint(0, 10, (30 * n,), generator=g)
        out = {}
        for name in ["mlp", "vit"]:
            model = vision.build_model(name, small, 1, 28, 10).to(device)
            out |= bench_training(name, model, x28 if name == "mlp" else x28[: 3 * n],
                                  y28 if name == "mlp" else y28[: 3 * n], args.rounds, device)
        return out

    def memory():
        set_threads(args.threads)  # the quick start's process set its own
        return bench_memory(device)

    groups = {
        "estimator": estimator,
        "training": training,
        "scattered": lambda: bench_scattered(small, torch.randn(n, 1, 28, 28, device=device), args.rounds, device),
        "read_token": lambda: bench_read_token(small, torch.randn(n, 1, 28, 28, device=device), args.rounds, device,
                                               n_pairs) | bench_read_token_training(small, 256 if n >= 10 else 16,
                                                                                    args.rounds, device),
        "sens_during": lambda: bench_sens_during(n, device),
        "paper_vit": lambda: bench_paper_vit(n, args.rounds, device),
        "language": lambda: bench_language(256 if cuda else max(2, n // 12), args.rounds, device, n_pairs),
        "corruptions": lambda: bench_corruptions(device, 10 * n),
        "shared_cpu": lambda: bench_shared_cpu(3 * n, args.rounds),
        "quickstart": lambda: bench_quickstart(30 * n, args.rounds),
        "memory": memory,  # last: the 10^6 run slows later timings
    }
    assert list(groups) == GROUPS
    results = {}
    for name in args.only or GROUPS:
        figures = groups[name]()
        for k, v in figures.items():
            print(f"{k} {v:.4g}", flush=True)  # as measured: a run stopped halfway has printed what it measured
        results |= figures
    write_json(args.out, {"env": environment(device), "args": vars(args), "results": results})  # over the reservation
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    cli(main, parse_args)
