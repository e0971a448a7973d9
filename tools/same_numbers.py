"""Do two versions of the repository give the same numbers? A developer check for refactors.

Runs a small run of every experiment script (fixed seeds and flags, fake or generated data, one thread) in a git
revision of the repository and in the working tree, then compares the two metrics.json files of each script: every
number must be identical (the random-weight ImageNet run, which is not deterministic, within standard errors).
Wall times, the environment, the saved arguments and the list of source folders are not compared; keys that only the
new version writes are listed, keys that it lost are differences.

    python tools/same_numbers.py --before HEAD~3      # about 2 minutes on 2 cores
    python tools/same_numbers.py --before 6263bbf --only vision language

Standard library only (the scripts themselves need the repository's requirements).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORED = {"time", "seconds", "env", "resumed", "args", "sources"}  # not numbers of the experiment (wall times)
NOISY = {"pretrained"}

TINY_VIT = ["--depth", "1", "--heads", "2", "--dim", "16", "--dim-head", "8", "--mlp-dim", "32"]
# script -> (argv of the version before, argv of the version after); {data} is a folder of generated files
RUNS = {
    "synthetic": ["synthetic.py", "--case", "sparse-lower", "--seeds", "0", "--steps", "60", "--eval-every", "30",
                  "--n-train", "400", "--n-test", "200", "--n-sens", "100"],
    "vision": ["vision.py", "--dataset", "fake28", "--model", "vit", "mlp", "--epochs", "2", "--eval-every", "1",
               "--n-train", "120", "--n-test", "60", "--n-sens", "12", "--sigma", "0.1", "1", "--sweep", "--mask",
               "patch", "scattered", "global", "--match-acc", "0.05", "0.12", "--seeds", "0", "1", "--lr", "mlp=0.05",
               "--batch-size", "50", *TINY_VIT],
    "vision-steps": ["vision.py", "--dataset", "fake28", "--model", "cnn", "--steps", "5", "--eval-every", "1",
                     "--n-train", "120", "--n-test", "60", "--n-sens", "12", "--batch-size", "50",
                     "--schedule", "cosine", "--momentum", "0.9"],
    "robustness": ["robustness.py", "--dataset", "fake", "--model", "vit", "--variants", "vanilla", "reg", "augment",
                   "--epochs", "1", "--n-train", "100", "--n-test", "40", "--n-sens", "10", "--corruptions",
                   "gaussian_noise", "contrast", "--severities", "1", "3", "--n-corrupt", "20", "--n-sharp", "40",
                   "--sharp-reps", "2", *TINY_VIT],
    "language": ["language.py", "--data-dir", "{data}/glue", "--task", "mrpc", "--model", "roberta", "gpt2", "lstm",
                 "--attn", "softmax", "relu", "--depth", "1", "--dim", "16", "--heads", "2", "--epochs", "2",
                 "--eval-every", "3", "--n-sens", "8", "--sens-positions", "3", "--align", "right", "left",
                 "--sigma", "2", "1", "--seeds", "0", "1", "--max-len", "24", "--batch-size", "8"],
    "grokking": ["grokking.py", "--p", "11", "--epochs", "20", "--eval-every", "10", "--dim", "16", "--heads", "2",
                 "--mlp-dim", "32", "--device", "cpu"],
    "parity": ["parity.py", "--n", "8", "--k", "2", "--steps", "20", "--eval-every", "10", "--n-train", "400",
               "--n-test", "100", "--n-sens", "50", "--dim", "16", "--heads", "2", "--device", "cpu"],
}
# the ImageNet pretrained-model experiment moved from vision.py --pretrained to imagenet.py. Offline it runs
# torchvision's ConvNeXt with random weights, which were drawn unseeded before 3a6e720 (0.0 and 0.5 in two runs of
# 6263bbf), so against such a revision this run is compared within standard errors (NOISY), every other one exactly;
# 3a6e720 also renamed its runs from <model>/pretrained to <model>/seed<--data-seed>
PRETRAINED = {
    "before": ["vision.py", "--pretrained", "convnext_tiny", "--imagenet-dir", "{data}/imgs", "--random-weights",
               "--n-sens", "2", "--sens-positions", "2", "--sigma", "0.5"],
    "after": ["imagenet.py", "--model", "convnext_tiny", "--imagenet-dir", "{data}/imgs", "--random-weights",
              "--n-sens", "2", "--sens-positions", "2", "--sigma", "0.5"],
}


def make_data(folder):
    """A small MRPC in the GLUE layout and a small ImageFolder, both fixed (no randomness)."""
    words = "the a cat dog sat ran on under mat tree stock fell rose today said it works here nothing".split()
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i in range(48):
        a = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(4 + i % 5))
        b = " ".join(words[(i * 5 + j * 2) % len(words)] for j in range(3 + i % 7))
        lines.append(f"{i % 2}\t{i}\t{i + 1000}\t{a}\t{b}")
    os.makedirs(os.path.join(folder, "glue", "MRPC"), exist_ok=True)
    # the same pairs in GLUE's files and in the Microsoft release's (the paper's split, language.py's default since)
    for name, part in [("train.tsv", lines[:33]), ("dev.tsv", lines[:1] + lines[33:]),
                       ("msr_paraphrase_train.txt", lines[:33]), ("msr_paraphrase_test.txt", lines[:1] + lines[33:])]:
        with open(os.path.join(folder, "glue", "MRPC", name), "w") as fh:
            fh.write("\n".join(part) + "\n")
    os.makedirs(os.path.join(folder, "imgs", "c0"), exist_ok=True)
    for i in range(2):  # two 8x8 grey PGM images (Pillow reads them; no package needed to write them)
        with open(os.path.join(folder, "imgs", "c0", f"{i}.pgm"), "wb") as fh:
            fh.write(b"P5 8 8 255\n" + bytes((17 * (i + 1) * k) % 256 for k in range(64)))


def run_all(repo, out, data, only):
    """Run every small run in `repo`; returns {name: metrics dict or the error text}."""
    results = {}
    moved = os.path.exists(os.path.join(repo, "imagenet.py"))  # a revision after the move
    runs = dict(RUNS, pretrained=PRETRAINED["after" if moved else "before"])
    for name, argv in runs.items():
        if only and name.split("-")[0] not in only and name not in only:
            continue
        argv = [a.replace("{data}", data) for a in argv]
        cmd = [sys.executable, *argv, "--threads", "1", "--out-dir", out, "--run-name", name]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        p = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env)
        script = argv[0][:-3]
        path = os.path.join(out, script, name, "metrics.json")
        if p.returncode or not os.path.exists(path):
            results[name] = f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:] or p.stdout[-300:]}"
        else:
            with open(path) as fh:
                results[name] = json.load(fh)
    return results


def compare(a, b, where=""):
    """(differences, keys only in b): every number and string of a must be in b, unchanged."""
    diffs, new = [], []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k in IGNORED:
                continue
            if k not in b:
                diffs.append(f"{where}/{k}: lost")
            else:
                d, n = compare(a[k], b[k], f"{where}/{k}")
                diffs += d
                new += n
        new += [f"{where}/{k}" for k in b if k not in a and k not in IGNORED]
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d, n = compare(x, y, f"{where}[{i}]")
            diffs += d
            new += n
    elif a != b:
        diffs.append(f"{where}: {str(a)[:80]} -> {str(b)[:80]}")
    return diffs, new


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="git revision to compare the working tree with")
    p.add_argument("--only", nargs="+", default=None, choices=[*RUNS, "pretrained"], metavar="RUN",
                   help=f"some of {list(RUNS)} and pretrained (vision: both vision runs)")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="same-numbers-")
    old = os.path.join(tmp, "before")
    got = subprocess.run(["git", "worktree", "add", "--detach", old, args.before], cwd=ROOT, capture_output=True,
                         text=True)
    if got.returncode:  # not a revision, or no git history
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(f"same_numbers.py: --before {args.before}: {(got.stderr.strip().splitlines() or ['git failed'])[-1]}")
    try:
        make_data(os.path.join(tmp, "data"))
        before = run_all(old, os.path.join(tmp, "out-before"), os.path.join(tmp, "data"), args.only)
        after = run_all(ROOT, os.path.join(tmp, "out-after"), os.path.join(tmp, "data"), args.only)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", old], cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)  # the generated data and both versions' runs: all read by now
    failed = 0
    for name in before:
        a, b = before[name], after.get(name)
        if isinstance(a, str) or isinstance(b, str):
            print(f"{name}: could not compare (before: {a if isinstance(a, str) else 'ok'}; after: "
                  f"{b if isinstance(b, str) else 'ok'})")
            failed += 1
            continue
        if name == "pretrained":  # vision.py --pretrained became imagenet.py, and its runs were renamed
            a["script"] = b["script"]
            a["runs"] = {r.replace("/pretrained", "/seed0"): v for r, v in a["runs"].items()}
        diffs, new = compare(a, b)
        if name in NOISY and diffs:  # the headline sensitivity of each model within twice its standard error
            finals = [(r, a["runs"][r]["final"], b["runs"].get(r, {}).get("final", {})) for r in a["runs"]]
            close = all(abs(x["sens"] - y["sens"]) <= 2 * (x["sens_stderr"] ** 2 + y["sens_stderr"] ** 2) ** 0.5
                        for _, x, y in finals if "sens" in y)
            print(f"{name}: {'within' if close else 'NOT within'} 2 standard errors (not deterministic): " + ", ".join(
                f"{r} {x['sens']:.3f} +- {x['sens_stderr']:.3f} -> {y['sens']:.3f} +- {y['sens_stderr']:.3f}"
                for r, x, y in finals if "sens" in y))
            failed += not close
            continue
        print(f"{name}: {'identical' if not diffs else f'{len(diffs)} differences'}"
              + (f" ({len(new)} new keys: {', '.join(new[:6])}{' ...' if len(new) > 6 else ''})" if new else ""))
        for d in diffs[:20]:
            print("   ", d)
        failed += bool(diffs)
    print(f"{len(before) - failed} of {len(before)} runs give the same numbers")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
