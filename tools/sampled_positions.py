"""What would sampling K of the patches per image (vision.py --sens-positions K) do to a row's numbers, and save?

Reloads the final model of each one-model vision.py run folder (the converged and mechanism rows' runs) from its
checkpoint.pt, checks that it is the final model (the first --sigma under the patch mask, every patch, must give the
stored number to the last digit), then measures the patch mask at every stored sigma with K sampled patches per
image and the run's own noise seed. It prints, for every model against the ViT, each paired difference measured on
every patch (stored) and on K (now), and how far it moved in standard errors of the stored one; and the time of the
stored sweep against the sampled one.

    python tools/sampled_positions.py out/vision/conv-*-seed? --positions 8

One thread; needs the datasets the runs were trained on (their --data-dir).
"""

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import report  # noqa: E402
import vision  # noqa: E402
from common import paired_differences  # noqa: E402
from runs import load_results, positive_int  # noqa: E402


def stored_run(folder):
    """(name, run record) of a one-model run folder saved with its checkpoint; anything else is one line."""
    for need in ["metrics.json", "checkpoint.pt"]:
        if not os.path.isfile(os.path.join(folder, need)):
            sys.exit(f"{folder}: no {need}: not a vision.py run folder saved with its checkpoint (--save-every)")
    try:
        data = load_results(folder, "vision")  # a damaged or another script's metrics.json: one line that says so
    except ValueError as e:
        sys.exit(f"{folder}: {e}")
    if len(data["runs"]) != 1:
        sys.exit(f"{folder}: {len(data['runs'])} models in one folder; the checkpoint holds the last one only")
    (name, run), = data["runs"].items()
    return name, run


def remeasure(folder, name, run, positions):
    """(stored per-image flips, sampled per-image flips, seconds of one stored sigma, of the sampled sweep) of the
    run `name` of one run folder (stored_run's)."""
    args = vision.parse_args(["--resume", folder])
    images = vision.prepare_data(args, torch.device("cpu"))
    channels, size, classes, _ = vision.DATASETS[args.dataset]
    model = vision.build_model(args.model[0], args, channels, size, classes)
    model.load_state_dict(torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=False)["state"]["model"])
    x = vision.normalize(images["train_x"][: args.n_sens])  # the images the run measured
    stored = {k: v for k, v in run["final"]["per_image"].items() if k.startswith("patch:")}
    sigmas = [report.mask_sigma(k)[1] for k in stored]
    kw = dict(patch=args.sens_patch, masks=["patch"], seed=args.sens_seed)
    t = time.perf_counter()
    check = vision.measure_sensitivity(model, x, sigmas=args.sigma[:1], **kw)["patch", args.sigma[0]].mean
    one = time.perf_counter() - t
    if check != run["final"]["sens_at"][f"patch:{args.sigma[0]:g}"]["sens"]:
        sys.exit(f"{folder}: its checkpoint does not give the stored sensitivity ({check}): not the final model")
    t = time.perf_counter()
    sampled = vision.measure_sensitivity(model, x, sigmas=sigmas, positions=positions, **kw)
    took = time.perf_counter() - t
    sampled = {f"patch:{s:g}": v.per_input.tolist() for (_, s), v in sampled.items()}
    print(f"{folder}: {name} checked; {len(sigmas)} sigmas: every patch about {one * len(sigmas):.0f} s, "
          f"{positions} sampled {took:.0f} s", flush=True)
    return stored, sampled, one * len(sigmas), took


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", help="one-model vision.py run folders with checkpoint.pt")
    p.add_argument("--positions", type=positive_int, default=8, help="patches sampled per image and sigma")
    args = p.parse_args()
    torch.set_num_threads(1)
    runs = [stored_run(folder) for folder in args.folders]  # every refusal before minutes of measuring
    reference = next((run["model"] for _, run in runs if run["model"].startswith("vit")), None)
    if reference is None:
        sys.exit("no ViT among the folders: nothing to pair against")
    if all(run["model"] == reference for _, run in runs):
        sys.exit(f"no model but {reference} among the folders: nothing to pair with it (give the other models' too)")
    stored, sampled, before, after = {}, {}, 0.0, 0.0
    for folder, (name, run) in zip(args.folders, runs):
        a, b, t_all, t_sampled = remeasure(folder, name, run, args.positions)
        stored[run["model"], run["seed"]], sampled[run["model"], run["seed"]] = a, b
        before, after = before + t_all, after + t_sampled
    full, part = paired_differences(stored, reference), paired_differences(sampled, reference)
    moves = []
    for model, d in full["models"].items():
        for key, x in d["diff"].items():
            y = part["models"][model]["diff"][key]
            if x["stderr"] > 0:
                z = abs(x["mean"] - y["mean"]) / x["stderr"]
            else:  # no error to measure the move in: any move is infinitely many
                z = math.inf if x["mean"] != y["mean"] else 0.0
            moves.append(z)
            print(f"{model} - {reference} {key}: every patch {x['mean']:+.4f} +- {x['stderr']:.4f} | "
                  f"{args.positions} sampled {y['mean']:+.4f} +- {y['stderr']:.4f} | moved {z:.2f} s.e.")
    print(f"{len(moves)} paired differences: {sum(z > 2 for z in moves)} moved beyond 2 s.e., the most "
          f"{max(moves):.2f}; the patch sweeps took {before / 60:.1f} min with every patch, {after / 60:.1f} sampled")


if __name__ == "__main__":
    main()
