"""Figures and summaries from finished run folders: it reads metrics.json files and never imports a model.

    python report.py out/vision/fashionmnist-vit-mlp                 # redraw a run's figures, print its summary
    python report.py out/vision/seed0 out/vision/seed1 out/vision/seed2 --run-name fmnist-3seeds
        # several folders of one script (seeds or models run as separate processes, or vision.py --n-train sizes)
        # are merged into a new folder: paired differences over seeds, crossover sigmas, data scale, figures

Each experiment script calls `draw` and `summary` at the end of its run; this file is what reads the results.
"""

import math
import os
import re
from collections import Counter

import numpy as np

from runs import RUN_FLAGS, ArgumentParser, cli, ended, given, load_results, new_run_dir, run_name, write_json

SCRIPTS = ["synthetic", "vision", "imagenet", "language", "robustness", "grokking", "parity"]

# -----------------------------------------------------------------------------
# reading runs: identity as fields, keys of what was measured


def identity(run, r):
    """(model, seed) of a run record; records written before they held the fields are named '<model>/seed<k>'."""
    if "model" in r:
        return r["model"], r["seed"]
    model, _, seed = run.partition("/")
    number = re.fullmatch(r"seed(\d+)", seed)
    return model, int(number[1]) if number else seed


def models(data):
    """{model: [run records]} in the order they were run."""
    out = {}
    for run, r in data["runs"].items():
        out.setdefault(identity(run, r)[0], []).append(r)
    return out


def mask_sigma(key):
    """'patch:0.1' -> ('patch', 0.1): a vision.py measurement key, as written in metrics.json."""
    mask, _, sigma = key.partition(":")
    return mask, float(sigma)


def paired(data, reference, field="per_image"):
    """common.paired_differences over the runs that hold final[field]."""
    from common import paired_differences  # here: common.py imports torch (3.5 s), which report.py's other calls skip

    per_input = {identity(run, r): r["final"][field] for run, r in data["runs"].items() if r["final"].get(field)}
    return paired_differences(per_input, reference)


def over_seeds(values):
    """(mean, standard error of the mean) of per-seed values; the error is NaN for one value."""
    se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return float(np.mean(values)), se


def ms(mean, stderr, fmt=".4f"):
    """'0.0123 +- 0.0045' (the mean alone where the standard error is NaN: one seed)."""
    return f"{mean:{fmt}}" + (f" +- {stderr:{fmt}}" if math.isfinite(stderr) else "")


def mean_se(values, fmt=".4f"):
    """The mean of per-seed values and its standard error over them, formatted by ms()."""
    return ms(*over_seeds(values), fmt)


def pm(mean, stderr, n=None):
    """'+0.0123 +- 0.0045 (3 seeds)': a paired difference with its standard error (none shown for one seed)."""
    se = f" +- {stderr:.4f}" if stderr is not None and math.isfinite(stderr) else ""
    return f"{mean:+.4f}{se}" + (f" ({n} seed{'s' if n != 1 else ''})" if n is not None else "")


def paired_text(d):
    """pm() of one paired_differences entry; with one seed, its standard error over the inputs instead."""
    if d["seeds"] == 1 and d.get("per_seed"):
        mean, se = next(iter(d["per_seed"].values()))
        return f"{mean:+.4f} +- {se:.4f} (1 seed, s.e. over inputs)"
    return pm(d["mean"], d["stderr"], d["seeds"])


# -----------------------------------------------------------------------------
# readouts: crossover sigmas, matched train accuracy, grokking's phases


def own_numbers(data):
    """Per model, its own final numbers: train and test accuracy, the epoch it stopped at, and its sensitivity at every
    mask and sigma measured, mean +- s.e. over seeds (one seed: the s.e. over its inputs)."""
    for name, records in models(data).items():
        finals = [r["final"] for r in records if r["final"].get("sens_at")]
        if not finals:
            continue
        parts = [f"{k} acc {mean_se([f[f'{k}_acc'] for f in finals], '.3f')}" for k in ["train", "test"]]
        first, last = min(f["epoch"] for f in finals), max(f["epoch"] for f in finals)
        parts.append(f"epoch {first:g}" + (f"-{last:g}" if last != first else ""))
        for key in finals[0]["sens_at"]:
            at = [f["sens_at"][key] for f in finals if key in f["sens_at"]]
            parts.append(f"{key} " + (mean_se([a["sens"] for a in at]) if len(at) > 1 else ms(at[0]["sens"],
                                                                                               at[0]["stderr"])))
        print(f"{name} ({seeds(len(finals))}) | " + " | ".join(parts))


def matched_accuracy(data):
    """Per model and --match-acc level: the epoch and the sensitivities where train accuracy first reaches it
    (at_train_accuracy), mean +- s.e. over the seeds that reach it (App. A.1: models compared at equal accuracy)."""
    for name, records in models(data).items():
        levels = [r["final"]["match_acc"] for r in records if r["final"].get("match_acc")]
        for level in levels[0] if levels else []:
            at = [m[level] for m in levels if m.get(level)]
            if at:
                print(f"{name} at train acc {level} ({len(at)} of {seeds(len(levels))}) | epoch "
                      f"{mean_se([a['epoch'] for a in at], '.1f')} | " + " | ".join(
                          f"{k.removeprefix('sens@')} {mean_se([a[k] for a in at])}" for k in at[0] if k != "epoch"))


def crossovers(a, b):
    """Sigmas where two sensitivity curves {sigma: value} are level, interpolated on log sigma between the sigmas
    both measured; [] when one stays above the other."""
    sigmas = sorted(s for s in a if s in b)
    d = [a[s] - b[s] for s in sigmas]
    return [math.exp(math.log(s0) + d0 / (d0 - d1) * (math.log(s1) - math.log(s0)))
            for s0, s1, d0, d1 in zip(sigmas, sigmas[1:], d, d[1:]) if d0 * d1 < 0 or (d1 == 0 != d0)]


def mean_curve(records, mask):
    """{sigma: mean over the records (seeds) of the final sensitivity} at the sigmas every record measured."""
    rows = [{mask_sigma(k)[1]: v["sens"] for k, v in r["final"]["sens_at"].items() if mask_sigma(k)[0] == mask}
            for r in records]
    sigmas = sorted(set.intersection(*(set(r) for r in rows))) if rows else []
    return {s: sum(r[s] for r in rows) / len(rows) for s in sigmas}


def at_train_accuracy(history, levels, keys):
    """{level: {"epoch": e, key: sensitivity}} where train accuracy first reaches each level, linearly interpolated
    between the two evaluations around the crossing (the first evaluation if it already starts above); None for a
    level never reached."""
    out = {}
    for level in levels:
        i = next((i for i, h in enumerate(history) if h["train_acc"] >= level), None)
        if i is None:
            out[f"{level:g}"] = None
            continue
        lo, hi = history[max(i - 1, 0)], history[i]
        w = 1.0 if i == 0 else (level - lo["train_acc"]) / (hi["train_acc"] - lo["train_acc"])  # lo < level <= hi
        out[f"{level:g}"] = {k: lo[k] + w * (hi[k] - lo[k]) for k in ["epoch"] + keys}
    return out


def end_point(history, until_acc=None, patience=None):
    """Why training should stop after the last evaluation of `history`, or None: its train accuracy reached
    until_acc, or the last `patience` evaluations brought no training loss 1% below the best before them."""
    if until_acc is not None and history[-1]["train_acc"] >= until_acc:
        return f"train accuracy reached {until_acc:g}"
    best, since = math.inf, 0
    for h in history:
        best, since = (h["train_loss"], 0) if h["train_loss"] < 0.99 * best else (best, since + 1)
    return "training loss stopped falling" if patience is not None and since >= patience else None


def first_epoch(history, cond):
    """The epoch of the first evaluation where cond(row) holds; None if never."""
    return next((h["epoch"] for h in history if cond(h)), None)


def phases(history):
    """Epochs at which train accuracy first reaches 100% (memorised) and test accuracy first exceeds 95% (grokked)."""
    return first_epoch(history, lambda h: h["train_acc"] >= 1.0), first_epoch(history, lambda h: h["test_acc"] > 0.95)


def spearman(a, b):
    """Rank correlation of two equal-length sequences (average ranks for ties); None if either is constant."""
    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for x in np.unique(v):  # ties share their mean rank
            r[v == x] = r[v == x].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def plateau(history, chance=0.55, learned=0.95):
    """A parity run's plateau, read from its history: the evaluations before test accuracy first exceeds `chance`,
    how many of them have sensitivity count 0 (a constant predictor), its largest count and the largest part on the
    relevant bits, its rank correlation with the step, the mean count over the first and second half; and the
    first step at which test accuracy exceeds `learned` (None if never)."""
    end = next((i for i, h in enumerate(history) if h["test_acc"] > chance), len(history))
    rows = history[:end]
    counts = [h["sens_count"] for h in rows]
    half = len(rows) // 2
    return {"evals": len(rows), "zero": sum(c < 1e-9 for c in counts), "max": max(counts, default=math.nan),
            "max_relevant": max((h["sens_relevant"] for h in rows), default=math.nan),
            "spearman": spearman([h["step"] for h in rows], counts),
            "halves": (float(np.mean(counts[:half])) if half else math.nan,
                       float(np.mean(counts[half:])) if rows[half:] else math.nan),
            "learned_step": next((h["step"] for h in history if h["test_acc"] > learned), None)}


# -----------------------------------------------------------------------------
# summaries: what each script prints at the end of a run (and what a merge stores)


def vision_paired(data):
    """Paired differences against the first ViT (else the first model), with the crossover sigmas of every model's
    seed-mean curve with the reference's, per mask; {} with fewer than two models."""
    done = {m: [r for r in rs if r["final"].get("per_image")] for m, rs in models(data).items()}
    done = {m: rs for m, rs in done.items() if rs}
    if len(done) < 2:
        return {}
    out = paired(data, next((m for m in done if m.startswith("vit")), next(iter(done))))
    ref = done[out["reference"]]
    masks = dict.fromkeys(mask_sigma(k)[0] for rs in done.values() for r in rs for k in r["final"]["sens_at"])
    for m, p in out["models"].items():
        p["crossover"] = {mask: crossovers(mean_curve(done[m], mask), mean_curve(ref, mask)) for mask in masks}
    return out


# C7's windows of the final per-position profile: right-aligned counts from the last token (0), left from <s> (0)
WINDOWS = {"right": {"last 10": (0, 10), "10-30 from the end": (10, 30), "beyond 30": (30, None)},
           "left": {"<s>": (0, 1), "positions 1-39": (1, 40)}}


def profile_windows(data):
    """{model: {window: (mean, s.e. over seeds, seeds)}}: each seed's mean flip rate over the positions of a window
    that at least a quarter of the measured pairs reach (the positions the figure draws), then the mean over seeds."""
    out = {}
    for name, runs in models(data).items():
        for align, windows in WINDOWS.items():
            per_seed = {window: [] for window in windows}
            for r in runs:
                p = r["final"].get("profiles", {}).get(align)
                if p is None:
                    continue
                sens, pairs = p["sens"], p["pairs"]
                if align == "right":  # stored oldest token first: reverse, so index 0 is the last token
                    sens, pairs = sens[::-1], pairs[::-1]
                floor = max(pairs) / 4
                for window, (lo, hi) in windows.items():
                    kept = [v for v, n in zip(sens[lo:hi], pairs[lo:hi])  # None in metrics.json, NaN in the run:
                            if v is not None and not math.isnan(v) and n >= floor]  # a position not sampled
                    if kept:
                        per_seed[window].append(float(np.mean(kept)))
            for window, values in per_seed.items():
                if values:
                    out.setdefault(name, {})[window] = (*over_seeds(values), len(values))
    return out


def through_training(records, x_key="examples", y_key="sens"):
    """[(x, mean, s.e. over seeds, seeds)] at every evaluation point the runs share, in order."""
    at = {}
    for r in records:
        for row in r["history"]:
            at.setdefault(row[x_key], []).append(row[y_key])
    return [(x, *over_seeds(v), len(v)) for x, v in sorted(at.items())]


def language_paired(data):
    """Paired differences against the first model of the run's --model present, each with its --attn in turn
    (roberta-softmax before roberta-relu), at the end and at initialisation."""
    args = data.get("args", {})
    order = [m if m == "lstm" else f"{m}-{a}" for m in args.get("model", []) for a in args.get("attn", ["softmax"])]
    present = list(models(data))
    reference = next((m for m in order if m in present), present[0] if present else None)
    return {"final": paired(data, reference, "per_image"), "init": paired(data, reference, "per_image_init")}


def robustness_groups(data):
    """{"<model>-<variant>": [final of each seed]} of the runs that were evaluated."""
    return {m: [r["final"] for r in rs if r["final"].get("corruption_acc")] for m, rs in models(data).items()
            if any(r["final"].get("corruption_acc") for r in rs)}


def measured_means(groups):
    """(final, over how many of the 15 standard corruptions its mean corruption accuracy is) of every run of
    robustness_groups() that has that mean (none: only the extra corruptions were measured; 15 in runs recorded
    before robustness.py counted them)."""
    return [(f, f.get("standard_measured", 15)) for finals in groups.values() for f in finals
            if f.get("mean_corruption_acc") is not None]


def robustness_summary(data):
    """Per model: mean +- s.e. over seeds of the final numbers; and the correlation of sensitivity with mean
    corruption accuracy over every model and seed."""
    keys = ["train_acc", "test_acc", "sens", "clean_acc", "mean_corruption_acc", "mean_extra_acc", "shop", "shpred"]
    out, groups = {}, robustness_groups(data)
    for label, finals in groups.items():
        out[label] = {"seeds": len(finals)}
        for k in keys:
            v = np.array([f[k] for f in finals if f.get(k) is not None], dtype=float)
            if len(v):
                out[label][k] = [float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None]
        print(f"{label} ({seeds(len(finals))}) | " + " | ".join(
            f"{k} {m:.4f}" + (f" +- {s:.4f}" if s is not None else "") for k, (m, s) in
            ((k, out[label][k]) for k in keys if k in out[label])))
    every = measured_means(groups)
    measured = [n for _, n in every]
    if any(n < 15 for n in measured):  # e.g. frost left out for want of its textures: not RobustBench's mean
        print(f"note: mean_corruption_acc is over {' or '.join(str(n) for n in sorted(set(measured)))} of the 15 "
              f"standard corruptions ({sum(n < 15 for n in measured)} of {len(measured)} runs measured fewer)")
    pts = [(f["sens"], f["mean_corruption_acc"]) for f, _ in every]
    if len(pts) > 2:
        pts = np.array(pts).T
        r = float(np.corrcoef(pts)[0, 1]) if pts.std(1).min() > 0 else None  # undefined if either is constant
        out["correlation_sens_vs_corruption_acc"] = {"pearson_r": r, "points": pts.shape[1]}
        print(f"sensitivity vs mean corruption accuracy over {pts.shape[1]} models and seeds: Pearson r = "
              + (f"{r:+.3f}" if r is not None else "undefined (one of them is constant)"))
    return out


def parity_summary(data):
    """Per run: the final count, when test accuracy passed 95%, and the plateau before it (plateau()); per setting
    over seeds: the final count and its part on the relevant bits (mean +- s.e.), and how many seeds learned."""
    groups, every = {}, []
    for run, r in data["runs"].items():
        name, seed = identity(run, r)
        groups.setdefault(name, []).append((seed, r))
    for name, records in groups.items():
        for seed, r in records:
            if not r["history"]:
                continue
            p, f = plateau(r["history"]), r["final"]
            every.append((p, f))
            end = (f"count {f['sens_count']:.3f} +- {f['sens_count_stderr']:.3f} (relevant bits "
                   f"{f['sens_relevant']:.3f}), test acc {f['test_acc']:.3f}" if f else "unfinished")
            rho = f"{p['spearman']:+.2f}" if p["spearman"] is not None else "undefined"
            step = "never" if p["learned_step"] is None else p["learned_step"]
            print(f"{name}/seed{seed}: {end}; test acc > 0.95 from step {step}; plateau "
                  f"{p['evals']} evaluations: count 0 at {p['zero']}, max {p['max']:.2f} (relevant "
                  f"{p['max_relevant']:.2f}), Spearman with step {rho}, halves {p['halves'][0]:.2f} -> "
                  f"{p['halves'][1]:.2f}")
        finals = [r["final"] for _, r in records if r["final"]]
        if finals:
            learned = sum(f["test_acc"] > 0.95 for f in finals)
            print(f"{name} ({seeds(len(finals))}) | count {mean_se([f['sens_count'] for f in finals], '.3f')} | on "
                  f"the relevant bits {mean_se([f['sens_relevant'] for f in finals], '.3f')} | test acc > 0.95 at "
                  f"the end in {learned} of {len(finals)}")
    done = [(p, f) for p, f in every if f]
    if len(groups) > 1 and done:  # the claim over every setting and seed
        args = data.get("args", {})
        learned = [f for _, f in done if f["test_acc"] > 0.95]
        zero = [p["zero"] / p["evals"] for p, _ in done if p["evals"]]
        rho = [p["spearman"] for p, _ in done if p["spearman"] is not None]
        span = lambda v, fmt: f"{min(v):{fmt}} to {max(v):{fmt}}" if v else "none"  # noqa: E731
        print(f"all {len(done)} runs (n {args.get('n')}, k {args.get('k')}, {args.get('steps')} steps) | learned "
              f"(test acc > 0.95 at the end) {len(learned)} of {len(done)}, their count "
              f"{span([f['sens_count'] for f in learned], '.3f')}, on the relevant bits "
              f"{span([f['sens_relevant'] for f in learned], '.3f')} | plateau: count 0 at "
              f"{span([100 * z for z in zero], '.0f')}% of its evaluations, its largest count "
              f"{span([p['max'] for p, _ in done], '.1f')} | Spearman with step positive in "
              f"{sum(r > 0 for r in rho)} of {len(done)} ({span(rho, '+.2f')}) | second half above the first in "
              f"{sum(p['halves'][1] > p['halves'][0] for p, _ in done)} of {len(done)}")


def paired_lines(p):
    """vision_paired()'s numbers: per model, its paired differences against the reference and where they are level."""
    for name, d in p.get("models", {}).items():
        parts = [f"{k} {paired_text(v)}" for k, v in d["diff"].items()]
        cross = {m: [f"{s:.3g}" for s in v] for m, v in d["crossover"].items() if v}
        parts += [f"level at sigma {cross}"] if cross else []
        print(f"{name} - {p['reference']} | " + " | ".join(parts))


def summary(data):
    """Print the summary lines of a run (or of merged runs) from its metrics.json."""
    script = data.get("script")
    if script == "synthetic":
        for label, records in models(data).items():
            finals = [r["final"] for r in records if r["final"]]
            if not finals:
                continue
            parts = [f"{key} {mean_se([f[key] for f in finals], '.3f')}" for key in [
                "ood_acc", "test_acc", "align_sparse", "align_frequent", "sens", "sens_sparse_fn", "sens_frequent_fn"]]
            print(f"{label} ({seeds(len(finals))}) | " + " | ".join(parts))
    elif script == "vision" and data.get("data_scale"):  # a data-size study: the paired differences at each size
        for n, p in data["data_scale"].items():
            for name, d in p["models"].items():
                print(f"{n} images | {name} - {p['reference']} | " + " | ".join(
                    f"{k} {paired_text(v)}" for k, v in d["diff"].items()))
    elif script == "vision":  # one model too, and a stopped run: the models that finished, paired
        own_numbers(data)
        paired_lines(data.get("paired") or vision_paired(data))
        matched_accuracy(data)
    elif script == "imagenet":  # pretrained models: accuracy on the measured images (of an ImageNet folder)
        for run, r in data["runs"].items():
            f = r["final"]
            acc = [f"accuracy {f['train_acc']:.3f}"] if "train_acc" in f else []
            print(f"{run} | " + " | ".join(acc + [f"{k} {ms(v['sens'], v['stderr'])}"
                                                for k, v in f.get("sens_at", {}).items()]))
        paired_lines(data.get("paired") or {})
    elif script == "language":
        majority = data.get("data", {}).get("test_majority")
        for label, records in models(data).items():  # a model below the majority class has not generalised
            done = [r for r in records if "test_acc" in r["final"]]
            if not done:
                continue
            first = [r["history"][0] for r in done]  # initialisation
            parts = [f"train acc {mean_se([r['final']['train_acc'] for r in done], '.3f')}",
                     f"test acc {mean_se([r['final']['test_acc'] for r in done], '.3f')}"]
            parts += [f"majority class {majority:.3f}"] if majority is not None else []
            parts += [f"majority share init {mean_se([h['majority_share'] for h in first], '.3f')} end "
                      f"{mean_se([r['final']['majority_share'] for r in done], '.3f')}"]
            for key in done[0]["final"].get("sens_at", {}):
                parts.append(f"sigma {key} init {mean_se([h[f'sens@{key}'] for h in first])} final "
                             f"{mean_se([r['final']['sens_at'][key]['sens'] for r in done])}")
            print(f"{label} ({seeds(len(done))}) | " + " | ".join(parts))
        for name, records in models(data).items():
            parts = [f"{x}: {ms(m, se)}" for x, m, se, _ in through_training(records)]
            print(f"{name} sensitivity by examples seen | " + " | ".join(parts))
        for name, windows in profile_windows(data).items():
            parts = [f"{w} {ms(m, se)}" for w, (m, se, _) in windows.items()]
            print(f"{name} profile | " + " | ".join(parts))
        pairs = data.get("paired") or language_paired(data)  # a stopped run has none saved: its finished models
        for when in ["init", "final"]:
            p = pairs.get(when) or {}
            for name, d in p.get("models", {}).items():
                parts = [f"sigma {k}: {paired_text(v)} per seed "
                         + ", ".join(f"{m:+.4f}" for m, _ in v["per_seed"].values()) for k, v in d["diff"].items()]
                print(f"{when} {name} - {p['reference']} | " + " | ".join(parts))
    elif script == "robustness":
        robustness_summary(data)
    elif script == "parity":
        parity_summary(data)
    elif script == "grokking":
        for run, r in data["runs"].items():
            f = r["final"]
            if f:
                end = f" at epoch {f['epoch_end']}" if "epoch_end" in f else ""  # (older runs: at --epochs)
                print(f"{run}: memorised at epoch {f['epoch_memorised']}, grokked at {f['epoch_grokked']}, "
                      f"sensitivity{end} {f['sens']:.4f}")


# -----------------------------------------------------------------------------
# the claims table: every row's numbers from the folders reproduce.sh merges them into


def synthetic_claim(data):
    """Per preset and setting: OOD accuracy 0 means the sparse feature was learned, 1 the frequent one; the claim
    holds for a preset when every seed learned the feature whose candidate function is the less sensitive."""
    summary(data)
    held = []
    for label, records in models(data).items():
        finals = [r["final"] for r in records if r["final"]]
        lower = "sparse" if label.startswith("sparse-lower") else "frequent"
        held.append(all(round(f["ood_acc"]) == (lower == "frequent") and
                        f[f"sens_{lower}_fn"] < f[f"sens_{'frequent' if lower == 'sparse' else 'sparse'}_fn"]
                        for f in finals) and bool(finals))
    print(f"the model learns the lower-sensitivity feature in every seed in {sum(held)} of {len(held)} settings")


def fell_to(history, start, key, share):
    """The first epoch from `start` on where history's `key` is at most `share` of its value at `start`."""
    at = next((x[key] for x in history if x["epoch"] == start), None)
    return None if at is None else first_epoch(history, lambda x: x["epoch"] >= start and x[key] <= share * at)


def grokking_claim(data):
    """Per seed, measured from memorisation (train accuracy 100%): the sensitivity there, the epochs where it first
    falls to half and to a tenth of that, and where the weight norm falls 10%; test accuracy past 50% and past 95%."""
    for run, r in data["runs"].items():
        h = r["history"]
        if not h:
            continue
        memorised, grokked = phases(h)
        sens = next((f"{x['sens']:.3f}" for x in h if x["epoch"] == memorised), "none")
        half_acc = first_epoch(h, lambda x: x["test_acc"] > 0.5)
        print(f"{run}: memorised at epoch {memorised} (sensitivity {sens}); sensitivity halves by "
              f"{fell_to(h, memorised, 'sens', 0.5)}, a tenth by {fell_to(h, memorised, 'sens', 0.1)}; weight norm 10% "
              f"below memorisation's by {fell_to(h, memorised, 'weight_norm', 0.9)}; test acc > 0.5 from {half_acc}, "
              f"> 0.95 (grokked) from {grokked}")


def robustness_claim(data):
    """The summary per model, then Table 2's comparison: reg - vanilla paired by seed, mean +- s.e. over seeds."""
    robustness_summary(data)
    finals = {identity(run, r): r["final"] for run, r in data["runs"].items() if r["final"]}
    for model in sorted({m for m, _ in finals if m.endswith("-reg")}):
        base = model[:-4] + "-vanilla"
        pairs = [(f, finals[base, s]) for (m, s), f in finals.items() if m == model and (base, s) in finals]
        if pairs:
            print(f"{model} - {base}, paired by seed | " + " | ".join(
                f"{k} {pm(*over_seeds([a[k] - b[k] for a, b in pairs]), len(pairs))}"
                for k in ["sens", "mean_corruption_acc", "shop", "shpred"] if all(a.get(k) is not None and
                                                                              b.get(k) is not None for a, b in pairs)))


def time_split(data):
    """Where each run's time went (metrics.json's 'seconds', written since progress lines exist): minutes in
    training steps, in the evaluations during training (accuracy and sensitivity), and in the final measurements
    (the sweep, the other masks); their total. Returns the splits it printed, for a total over runs and folders."""
    splits = []
    for run, r in data["runs"].items():
        if "seconds" in r:
            s = r["seconds"]
            print(f"{run} | training {s['training'] / 60:.1f} min | evaluations {s['evaluations'] / 60:.1f} min | "
                  f"final measurements {s['final'] / 60:.1f} min | total {sum(s.values()) / 60:.1f} min")
            splits.append(s)
    return splits


# (row of reproduce.sh, its merged folder under the output folder, what prints the row's numbers)
CLAIMS = [("synthetic", "synthetic/cases", synthetic_claim), ("fig12", "synthetic/fig12", synthetic_claim),
          ("vision3k", "vision/fmnist-3k", summary), ("converged", "vision/converged-3seeds", summary),
          ("vitsize", "vision/vit-size-d8h32", summary), ("vitsize", "vision/vit-size-d4h4", summary),
          ("vitsize", "vision/vit-size", summary),
          ("datascale", "vision/fmnist-scale3", summary), ("mechanism", "vision/mechanism", summary),
          ("mechanism", "vision/mechanism-npn", summary), ("mechanism", "vision/paper-sgd", summary),
          ("mnist01", "vision/mnist01", summary), ("fig4", "vision/cifar10-fig4", summary),
          ("fig4", "vision/svhn-fig4", summary), ("imagenet", "imagenet/pretrained", summary),
          ("parity", "parity/settings-3seeds", parity_summary),
          ("grokking", "grokking/grokking-3seeds", grokking_claim),
          ("mrpc", "language/mrpc-paper-3seeds", summary), ("mrpcglue", "language/mrpc-4models-3seeds", summary),
          ("qqp", "language/qqp-3seeds", summary), ("robustness", "robustness/fmnist-rob", robustness_claim),
          ("robustness", "robustness/fig9", robustness_claim)]


def claims(out_dir):
    """Print the numbers of every claims-table row from the folders under out_dir (bash reproduce.sh's): one block
    per row, headed by the row and the folder (relative to out_dir); a row whose folder is missing says so, and a
    last line says when no row's is there (out_dir not the folder reproduce.sh wrote)."""
    found = 0
    for row, folder, show in CLAIMS:  # each named by its folder under out_dir, so the text is the same from anywhere
        path = os.path.join(out_dir, folder)
        if not os.path.isfile(os.path.join(path, "metrics.json")):
            print(f"[{row}] {folder}: not run")
            continue
        found += 1
        data = load_results(path)
        n = len({identity(run, r)[1] for run, r in data["runs"].items()})
        k = len(data.get("sources", [path]))
        print(f"[{row}] {folder} (" + (f"{seeds(n)}, " if n else "") + f"{k} folder{'s' if k > 1 else ''})")
        show(data)
    if not found:
        print(f"no row's folder is under {out_dir}: give the folder that bash reproduce.sh wrote (its --out, out by "
              "default, which holds synthetic/, vision/, language/, ...)")


# -----------------------------------------------------------------------------
# merging run folders


# flags that may differ between the folders of a merge: they change neither what is measured nor how
FREE = RUN_FLAGS | {"seeds", "save_model", "data_dir"}  # (data_dir: where the same dataset files are)


def flag_key(flag):
    """'--n-train' or 'n-train' -> 'n_train', the flag's key in a metrics.json's args."""
    return flag.lstrip("-").replace("-", "_")


def differing_flags(loaded, vary=()):
    """{flag: [value in each folder]} of the flags (args) on which the folders differ, but those in FREE and `vary`
    (the flags a merge says it varies: the models of a one-process-per-model protocol, a data-size study's
    --n-train). A flag absent from an older folder counts as off (None, False, empty) there."""
    off = lambda v: v in (None, False, [], {})  # noqa: E731
    keys = {k for d in loaded for k in d.get("args", {})} - FREE - {flag_key(v) for v in vary}
    out = {}
    for k in sorted(keys):
        values = [d.get("args", {}).get(k) for d in loaded]
        if any(v != values[0] and not (off(v) and off(values[0])) for v in values):
            out[k] = values
    return out


def merge(folders, vary=()):
    """One metrics dict from several run folders of one script (seeds or models run as separate processes): their runs
    merged (a run in two folders is a ValueError), the first folder's args, the list of sources, the runs that have no
    final numbers yet ("unfinished"), and the script's combined readouts. Folders whose flags differ in more than FREE
    and `vary` are refused: their numbers would be paired or averaged over different noise, sigmas or images. vision.py
    folders that differ in the number of training images (vary n-train) become a data-scale study: the paired
    differences at each size."""
    loaded = [load_results(f) for f in folders]
    script = loaded[0].get("script")
    if any(d.get("script") != script for d in loaded):
        names = ", ".join(str(d.get("script")) for d in loaded)
        raise ValueError(f"the folders were written by different scripts ({names})")
    known = {k for d in loaded for k in d.get("args", {})}
    if unknown := [v for v in vary if flag_key(v) not in known]:
        raise ValueError(f"--vary {' '.join(unknown)}: no such flag in the folders' arguments")
    if differ := differing_flags(loaded, vary):
        said = "; ".join(f"--{k.replace('_', '-')}: " + " / ".join(map(str, v)) for k, v in differ.items())
        raise ValueError(f"the folders were run with different flags ({said}); merge only runs measured alike, or "
                         f"name the flags a study varies with --vary {' '.join(differ).replace('_', '-')}")
    out = {"script": script, "sources": list(folders), "args": loaded[0].get("args", {}), "runs": {}}
    if vary:  # what each folder had, since the merged args are the first folder's
        out["varied"] = {v: [d["args"].get(flag_key(v)) for d in loaded] for v in vary}
    if all(d.get("data") == loaded[0].get("data") for d in loaded) and "data" in loaded[0]:
        out["data"] = loaded[0]["data"]  # the same data in every folder (not a data-scale study)
    by_size = {}  # vision.py's --n-train sizes; one group for the other scripts
    size = [d.get("data", {}).get("n_train", 0) if script == "vision" else 0 for d in loaded]
    for folder, d, n in zip(folders, loaded, size):
        runs = by_size.setdefault(n, {})
        for run, r in d["runs"].items():
            twins = [e for e, m in zip(loaded, size) if m == n and run in e["runs"]]  # the folders that hold it
            values = [f"{v}={d['args'].get(flag_key(v))}" for v in vary
                      if len({str(e["args"].get(flag_key(v))) for e in twins}) > 1]
            if values:  # the model's folders differ in a varied flag (a size study): it is named by the values
                model, seed = identity(run, r)  # that differ, vit[depth=8,heads=32,dim-head=64]
                model += f"[{','.join(values)}]"
                run, r = f"{model}/seed{seed}", {**r, "model": model, "seed": seed}
            if run in runs:
                raise ValueError(f"{run} is in more than one of the folders ({folder})")
            runs[run] = r
            if not ended(r):  # still training, or stopped: no final numbers to merge
                out.setdefault("unfinished", []).append(f"{run} in {folder}")
    if len(by_size) > 1:  # the data-scale study
        out["data_scale"] = {str(n): vision_paired({"runs": runs}) for n, runs in sorted(by_size.items())}
        return out
    out["runs"] = next(iter(by_size.values()))
    if script in ("vision", "imagenet"):
        out["paired"] = vision_paired(out)
    elif script == "language":
        out["paired"] = language_paired(out)
    return out


# -----------------------------------------------------------------------------
# figures


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


def plot_curves(ax, histories, x_key, y_key, label, **kw):
    """Mean over seeds of y_key against x_key at the x every run measured it (runs stop at different epochs, and
    under vision.py --sens-during needed measure at different ones), with a +-1 std band; histories are the runs'
    "history" lists."""
    rows = [{h[x_key]: h[y_key] for h in hist if h.get(y_key) is not None} for hist in histories]
    xs = sorted(set.intersection(*(set(r) for r in rows))) if rows else []
    if not xs:
        return
    ys = np.array([[r[x] for x in xs] for r in rows], dtype=float)  # (seeds, points)
    xs = np.array(xs, dtype=float)
    mean, std = ys.mean(0), ys.std(0)
    line, = ax.plot(xs, mean, label=label, **kw)
    if len(ys) > 1:
        ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def legend(ax):
    """The panel's legend; on a panel no run has measured yet (a run stopped in its first epoch), a word instead."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    elif not ax.lines and not ax.collections:
        ax.text(0.5, 0.5, "not measured yet", ha="center", va="center", transform=ax.transAxes, color="gray")


def seeds(n):
    return f"{n} seed{'s' if n != 1 else ''}"


def draw_synthetic(data, folder, plt):
    """Fig. 3 (one column per setting: accuracies, alignments, attention mass, sensitivities)."""
    groups = {m: [r["history"] for r in rs] for m, rs in models(data).items() if any(r["history"] for r in rs)}
    if not groups:
        return []
    rows = [("accuracy", [("train_acc", "train"), ("test_acc", "test"), ("ood_acc", "OOD test")]),
            ("head alignment (cos)", [("align_sparse", "v_sparse"), ("align_frequent", "v_frequent"),
                                      ("align_irrelevant", "v_irrelevant")]),
            ("attention mass", [("att_sparse", "sparse"), ("att_frequent", "frequent"),
                                ("att_irrelevant", "irrelevant")]),
            ("sensitivity", [("sens", "model"), ("sens_sparse_fn", "sparse vote"),
                             ("sens_frequent_fn", "frequent vote")])]
    fig, axes = plt.subplots(len(rows), len(groups), figsize=(4 * len(groups), 10), squeeze=False, sharex=True)
    for j, (label, hists) in enumerate(groups.items()):
        axes[0, j].set_title(f"{label} ({seeds(len(hists))})", fontsize=9)
        for i, (ylabel, keys) in enumerate(rows):
            for key, name in keys:
                plot_curves(axes[i, j], hists, "step", key, name)
            axes[i, j].set_ylabel(ylabel)
            legend(axes[i, j])
        axes[-1, j].set_xlabel("SGD step")
    return [save_figure(fig, f"{folder}/synthetic.png")]


def draw_training(groups, x_key, x_label, test_title, folder, plt):
    """sensitivity.png: sensitivity, train and test accuracy through training, one curve per model (mean over its
    seeds, +-1 std band); groups = {model: [run records]}."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, runs in groups.items():
        hists = [r["history"] for r in runs]
        label = f"{name} ({seeds(len(runs))})"
        for ax, key in zip(axes, ["sens", "train_acc", "test_acc"]):
            plot_curves(ax, hists, x_key, key, label)
    for ax, title in zip(axes, ["sensitivity (train subset)", "train accuracy", test_title]):
        ax.set_title(title)
        ax.set_xlabel(x_label)
        legend(ax)
    return save_figure(fig, f"{folder}/sensitivity.png")


def draw_vision(data, folder, plt):
    """Curves over training, sensitivity against train accuracy, the sigma sweep (Fig. 17), the per-patch maps, and
    the data-scale study."""
    groups = {m: [r for r in rs if r["history"]] for m, rs in models(data).items()}
    groups = {m: rs for m, rs in groups.items() if rs}
    paths = []
    if groups:
        paths.append(draw_training(groups, "epoch", "epoch", "test accuracy", folder, plt))
        fig, ax = plt.subplots(figsize=(5, 4))  # App. A.1: compare at equal train accuracy
        for i, (name, runs) in enumerate(groups.items()):
            for j, r in enumerate(runs):
                h = [x for x in r["history"] if "sens" in x]  # (--sens-during needed measures a few)
                ax.plot([x["train_acc"] for x in h], [x["sens"] for x in h], ".-", color=f"C{i}", alpha=0.7,
                        label=name if j == 0 else None)
        ax.set_xlabel("train accuracy")
        args = data.get("args", {})
        ax.set_ylabel(f"sensitivity ({args.get('mask', ['patch'])[0]}, sigma {args['sigma'][0]:g})"
                      if args.get("sigma") else "sensitivity")
        legend(ax)
        paths.append(save_figure(fig, f"{folder}/sensitivity_vs_train_acc.png"))
    finals = {m: [r for r in rs if r["final"].get("sens_at")] for m, rs in models(data).items()}
    finals = {m: rs for m, rs in finals.items() if rs}
    masks = sorted({mask_sigma(k)[0] for rs in finals.values() for r in rs for k in r["final"]["sens_at"]})
    if finals and max(len(r["final"]["sens_at"]) for rs in finals.values() for r in rs) > len(masks):  # Fig. 17
        fig, axes = plt.subplots(1, len(masks), figsize=(5 * len(masks), 4), squeeze=False)
        for ax, mask in zip(axes[0], masks):
            for name, records in finals.items():
                rows = [{mask_sigma(k)[1]: v["sens"] for k, v in r["final"]["sens_at"].items()
                         if mask_sigma(k)[0] == mask} for r in records]
                sigmas = sorted(set.intersection(*(set(r) for r in rows)))
                if not sigmas:  # this model was not measured with this mask
                    continue
                ys = np.array([[r[s] for s in sigmas] for r in rows])
                line, = ax.plot(sigmas, ys.mean(0), "o-", label=f"{name} ({seeds(len(rows))})")
                if len(rows) > 1:
                    ax.fill_between(sigmas, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
            ax.set_xscale("log")
            ax.set_xlabel("sigma (noise std on normalised pixels)")
            ax.set_ylabel("sensitivity")
            ax.set_title(f"{mask} mask (band: range over seeds)", fontsize=9)
            legend(ax)
        paths.append(save_figure(fig, f"{folder}/sigma_sweep.png"))
    maps = {run: r["final"]["sens_map"] for run, r in data["runs"].items() if r["final"].get("sens_map")}
    if maps:
        fig, axes = plt.subplots(1, len(maps), figsize=(2.6 * len(maps), 2.8), squeeze=False)
        for ax, (run, m) in zip(axes[0], maps.items()):
            im = ax.imshow(m, cmap="viridis")
            ax.set_title(run, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            fig.colorbar(im, ax=ax, fraction=0.046)
        paths.append(save_figure(fig, f"{folder}/sensitivity_maps.png"))
    if data.get("data_scale"):
        paths.append(draw_data_scale(data["data_scale"], folder, plt))
    return paths


def draw_data_scale(data_scale, folder, plt):
    """Paired differences against the reference ViT at each number of training images."""
    def error_bar(d):  # s.e. over seeds; with one seed, that seed's s.e. over images
        se = d["stderr"]
        if (se is None or se != se) and len(d.get("per_seed", {})) == 1:
            se = next(iter(d["per_seed"].values()))[1]
        return 0 if se is None or se != se else se

    scale = {int(n): p for n, p in data_scale.items() if p}
    ref = next(iter(scale.values()))["reference"]
    sizes = Counter(k for p in scale.values() for k in {k for m in p["models"].values() for k in m["diff"]})
    keys = sorted(k for k, c in sizes.items() if c > 1 or len(scale) == 1)  # a curve needs two sizes
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for name in dict.fromkeys(m for p in scale.values() for m in p["models"]):
            pts = [(n, p["models"][name]["diff"][key]) for n, p in sorted(scale.items())
                   if name in p["models"] and key in p["models"][name]["diff"]]
            ax.errorbar([n for n, _ in pts], [d["mean"] for _, d in pts],
                        yerr=[error_bar(d) for _, d in pts], fmt="o-", capsize=3, label=f"{name} - {ref}")
        ax.axhline(0, color="gray", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("training images")
        ax.set_ylabel("paired sensitivity difference (mean +- s.e.)")
        ax.set_title(key, fontsize=9)
        legend(ax)
    return save_figure(fig, f"{folder}/data_scale.png")


def draw_language(data, folder, plt):
    """Sensitivity and accuracies through training (mean over seeds, +-1 std band), and the per-position profiles of
    the final models in each alignment measured, with how many of the measured pairs reach each position."""
    groups = {m: [r for r in rs if r["history"]] for m, rs in models(data).items()}
    groups = {m: rs for m, rs in groups.items() if rs}
    if not groups:
        return []
    paths = [draw_training(groups, "examples", "training examples seen", "test accuracy", folder, plt)]
    done = {name: [r["final"] for r in runs if r["final"].get("profiles")] for name, runs in groups.items()}
    aligns = list(dict.fromkeys(a for finals in done.values() for f in finals for a in f["profiles"]))
    if aligns:  # Fig. 7 right: the per-position profile of the final models, mean over seeds
        fig, axes = plt.subplots(1, len(aligns), figsize=(7 * len(aligns), 4), squeeze=False)
        for ax, align in zip(axes[0], aligns):
            for name, finals in done.items():
                profs = [f["profiles"][align] for f in finals if align in f["profiles"]]
                if not profs:
                    continue
                sens = np.array([[math.nan if v is None else v for v in p["sens"]] for p in profs])
                prof = np.ma.masked_invalid(sens).mean(0).filled(math.nan)  # over the seeds that measured it
                pairs = np.array(profs[0]["pairs"])
                pos = np.arange(len(prof)) - (len(prof) - 1 if align == "right" else 0)
                keep = pairs >= pairs.max() / 4  # drop the rare long tail: positions under a quarter of the pairs reach
                ax.plot(pos[keep], prof[keep], label=f"{name} ({seeds(len(profs))})")
            twin = ax.twinx()
            twin.plot(pos, pairs, color="gray", linewidth=0.8, linestyle=":")
            twin.set_ylabel("pairs reaching the position (dotted)", color="gray")
            ax.set_xlabel("position counted from the last token (0)" if align == "right" else "position from <s> (0)")
            ax.set_ylabel("sensitivity at that position")
            ax.set_title(f"{align}-aligned", fontsize=9)
            legend(ax)
        paths.append(save_figure(fig, f"{folder}/sensitivity_by_position.png"))
    return paths


def draw_robustness(data, folder, plt):
    """Fig. 9: accuracy per corruption (mean over severities and seeds) per model, its sensitivity in the legend;
    sensitivity against mean corruption accuracy (one point per model and seed, and the mean +- s.e. over seeds;
    only where standard corruptions were measured); sensitivity through training."""
    groups = robustness_groups(data)
    if not groups:
        return []
    names = list(next(iter(groups.values()))[0]["corruption_acc"])
    fig, ax = plt.subplots(figsize=(max(8, 0.8 * len(names)), 4))
    width = 0.8 / len(groups)
    for i, (label, finals) in enumerate(groups.items()):
        means = [np.mean([np.mean(list(f["corruption_acc"][c].values())) for f in finals]) for c in names]
        sens = np.mean([f["sens"] for f in finals])
        ax.bar(np.arange(len(names)) + i * width, means, width,
               label=f"{label} (sens {sens:.4f}, {seeds(len(finals))})")
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, [n.replace("_", "\n") for n in names], fontsize=7)
    ax.set_ylabel("test accuracy (mean over severities)")
    legend(ax)
    paths = [save_figure(fig, f"{folder}/corruptions.png")]
    standard = [n for _, n in measured_means(groups)]
    if standard:
        fig, ax = plt.subplots(figsize=(5, 4))
        for i, (label, finals) in enumerate(groups.items()):
            s = np.array([f["sens"] for f in finals])
            a = np.array([f["mean_corruption_acc"] for f in finals], dtype=float)
            ax.scatter(s, a, color=f"C{i}", alpha=0.4, s=12)
            se = (lambda v: v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0)
            ax.errorbar(s.mean(), a.mean(), xerr=se(s), yerr=se(a), fmt="o", color=f"C{i}", capsize=3,
                        label=f"{label} ({seeds(len(finals))})")
        ax.set_xlabel("sensitivity (train subset)")
        ax.set_ylabel(f"mean corruption accuracy ({max(standard)} standard)")
        legend(ax)
        paths.append(save_figure(fig, f"{folder}/sensitivity_vs_robustness.png"))
    hists = {label: [r["history"] for r in models(data)[label] if r["history"]] for label in groups}
    if any(hists.values()):
        fig, ax = plt.subplots(figsize=(5, 4))
        for label, h in hists.items():
            if h:
                plot_curves(ax, h, "epoch", "sens", label)
        ax.set_xlabel("epoch")
        ax.set_ylabel("sensitivity")
        legend(ax)
        paths.append(save_figure(fig, f"{folder}/sensitivity.png"))
    return paths


def draw_grokking(data, folder, plt):
    """Accuracy, loss, sensitivity (token-wise and joint) and weight norm over epochs, with each run's phases. Each
    seed is drawn on its own: seeds grok thousands of epochs apart (and stop at different epochs under
    --stop-after-grok), so a mean over them would smear the jump and end with the shortest run."""
    hists = [r["history"] for r in data["runs"].values() if r["history"]]
    if not hists:
        return []
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    panels = [("accuracy", [("train_acc", "train"), ("test_acc", "test")]),
              ("loss", [("train_loss", "train"), ("test_loss", "test")]),
              ("sensitivity (train set)", [("sens", "token-wise"), ("sens_joint", "joint (a and b)")]),
              ("total weight norm", [("weight_norm", "|w|")])]
    for ax, (title, keys) in zip(axes, panels):
        for key, label in keys:
            color = None
            for i, h in enumerate(hists):  # one line per seed, one colour per quantity
                line, = ax.plot([x["epoch"] for x in h], [x[key] for x in h], color=color, linewidth=1,
                                label=label if i == 0 else None)
                color = line.get_color()
        for h in hists:  # the phase boundaries found from each run
            memorised, grokked = phases(h)
            if memorised is not None:
                ax.axvline(memorised, color="gray", linestyle=":", linewidth=1)
            if grokked is not None:
                ax.axvline(grokked, color="black", linestyle="--", linewidth=1)
        ax.set_xscale("symlog", linthresh=100)  # linear to 100, then logarithmic
        ax.set_xlim(left=0)
        ax.set_xlabel("epoch")
        ax.set_title(f"{title} ({seeds(len(hists))})", fontsize=9)
        legend(ax)
    axes[1].set_yscale("log")
    return [save_figure(fig, f"{folder}/grokking.png")]


def draw_parity(data, folder, plt):
    """Accuracies and Boolean sensitivity (all bits, and the k relevant ones) over training, one column per setting:
    the mean over its seeds with a +-1 std band."""
    groups = {m: [r["history"] for r in rs if r["history"]] for m, rs in models(data).items()}
    groups = {m: hists for m, hists in groups.items() if hists}
    if not groups:
        return []
    k = data.get("args", {}).get("k")
    fig, axes = plt.subplots(2, len(groups), figsize=(3.6 * len(groups), 6), squeeze=False, sharex=True)
    for j, (setting, hists) in enumerate(groups.items()):
        ax = axes[0, j]
        plot_curves(ax, hists, "step", "train_acc", "train")
        plot_curves(ax, hists, "step", "test_acc", "test")
        ax.set_title(f"{setting} ({seeds(len(hists))})", fontsize=9)
        ax.set_ylabel("accuracy")
        legend(ax)
        ax = axes[1, j]
        plot_curves(ax, hists, "step", "sens_count", "sensitivity (count)")
        plot_curves(ax, hists, "step", "sens_relevant", "on the k relevant bits")
        if k is not None:
            ax.axhline(k, color="gray", linestyle=":", label=f"k = {k}")
        ax.set_ylabel("Boolean sensitivity")
        ax.set_xlabel("Adam step")
        legend(ax)
    return [save_figure(fig, f"{folder}/parity.png")]


def draw(data, folder):
    """Every figure of a run (or of merged runs) into `folder`, from its metrics.json alone; returns the paths."""
    script = data.get("script")
    if script not in SCRIPTS:
        raise ValueError(f"{folder}: metrics.json names no script of this repository ('script': {script!r})")
    fn = {"synthetic": draw_synthetic, "vision": draw_vision, "language": draw_language, "robustness":
          draw_robustness, "grokking": draw_grokking, "parity": draw_parity}.get(script)
    return fn(data, folder, pyplot()) if fn else []


# -----------------------------------------------------------------------------
# the command line


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    p.add_argument("folders", nargs="*", help="run folders (or their metrics.json) of one script")
    p.add_argument("--claims", type=str, default=None, metavar="OUT", help="print every claims-table row's numbers "
                   "from the folders bash reproduce.sh wrote under OUT")
    p.add_argument("--times", action="store_true", help="print where each run's time went (training, evaluations, "
                   "final measurements) instead of redrawing or merging")
    p.add_argument("--out-dir", type=str, default="out", help="merged runs go to <out-dir>/<script>/<run-name>/")
    p.add_argument("--run-name", type=run_name, default="combined", help="the merged run's folder name")
    p.add_argument("--vary", type=str, nargs="+", default=[], metavar="FLAG", help="each FLAG (its name without "
                   "dashes) the merged folders may differ in beyond --seeds, --threads, --device and the run's name: "
                   "the models of a one-process-per-model protocol (model optimizer lr), a data-size study's n-train")
    args = p.parse_args(argv)
    if args.claims and args.times:
        p.error("--claims and --times are two reports: give one")
    if bool(args.folders) == bool(args.claims):
        p.error("give run folders, or --claims OUT")
    merging = [flag for flag in ("--out-dir", "--run-name", "--vary") if given(argv, flag)]
    if merging and (args.claims or args.times or len(args.folders) == 1):  # else taken in silence, nothing merged
        what = "--claims" if args.claims else "--times" if args.times else "one folder, which is redrawn in place"
        p.error(f"{' and '.join(merging)} {'are' if len(merging) > 1 else 'is'} for merging two or more folders, "
                f"not for {what}")
    for f in args.folders + ([args.claims] if args.claims else []):
        if not os.path.exists(f):
            p.error(f"{f}: no such run folder or metrics.json")
    return args


def main(args):
    if args.claims:
        return claims(args.claims)
    if args.times:
        splits = [s for folder in args.folders for s in time_split(load_results(folder))]
        if len(splits) > 1:  # a row's CPU time: the sum over its runs (reproduce.sh prints it at each row's end)
            total = {k: sum(s[k] for s in splits) for k in ["training", "evaluations", "final"]}
            print(f"all {len(splits)} runs | training {total['training'] / 60:.1f} min | evaluations "
                  f"{total['evaluations'] / 60:.1f} min | final measurements {total['final'] / 60:.1f} min | total "
                  f"{sum(total.values()) / 60:.1f} min")
        return None
    if len(args.folders) == 1:  # redraw in place
        folder = args.folders[0]
        folder = os.path.dirname(folder) if os.path.isfile(folder) else folder
        data = load_results(folder)
        summary(data)
        for run, r in data["runs"].items():
            if not ended(r):
                print(f"note: {run} has no final numbers yet (still running, or stopped: --resume {folder})")
        paths = draw(data, folder)
        print("wrote", *paths) if paths else print(f"{folder}: nothing to draw yet")
        return data
    data = merge(args.folders, args.vary)
    for run in data.get("unfinished", []):
        print(f"note: {run} has no final numbers yet (still running, or stopped: --resume it), so the merge's final "
              "numbers leave it out")
    if data["script"] == "robustness":
        data["summary"] = robustness_summary(data)
    else:
        summary(data)
    folder = new_run_dir(data["script"], args.run_name, args.out_dir)  # the sources are never written to
    write_json(os.path.join(folder, "metrics.json"), data)
    print("wrote", os.path.join(folder, "metrics.json"), *draw(data, folder))
    return data


if __name__ == "__main__":
    cli(main, parse_args)
