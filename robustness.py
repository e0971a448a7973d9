"""Does lower sensitivity go with robustness and flat minima? (Sec. 7.1, 7.2 of the paper.)

Trains vision.py's models (vanilla, with Gaussian-noise augmentation, or with the sensitivity regulariser), then
measures on the same models: the token-wise sensitivity, the accuracy under common corruptions (CIFAR-10-C, read from
the official release or generated here in torch, severities 1-5), and two sharpness measures of the minimum (Table 2).

    python robustness.py --paper-fig9 --cifar10c-dir CIFAR-10-C   # the six models of Fig. 9 on the official release
    python robustness.py --dataset fashionmnist --data-dir DATA --model vit --variants vanilla augment --epochs 20 \\
        --n-train 3000 --depth 4 --heads 4 --dim-head 16 --patch-size 7 --sigma 1 --frost-dir FROST   # README
    # and the same with --variants reg --lr 0.2 --epochs 40 (CE is weighted 1 - p = 0.5: twice the lr, equal accuracy)
    python robustness.py --from-vision out/vision/cifar10-vit   # evaluate saved vision.py models (--save-model)

The regulariser (Sec. 7.1): loss = (1 - p) CE(f(x), y) + p MSE(f(x + noise on one random patch), f(x)), p = --reg,
noise std --reg-std [author code: 0.5 and 1]. Sharpness (Sec. 7.2): ShOp = E_x E_eps |f_{theta+eps}(x) - f_theta(x)|_1
and ShPred = E_x E_eps 1[argmax differs], eps ~ N(0, --sharp-std^2) on every weight, --sharp-reps draws, on the
training set, in eval mode with the BatchNorm statistics untouched.
"""

import os
import pickle

import numpy as np
import torch
import torch.nn.functional as F

import report
import vision
from common import patchify, unpatchify
from corruptions import (EXTRA, SEVERITY, STANDARD, check_corruption, check_release, corrupt, load_frost,
                         read_release)
from runs import (ArgumentParser, Run, add_run_flags, checked, cli, given, nonnegative_float, one_of, parse,
                  parse_with, positive_int, ranks, seed_all, setup, start_run, subset_size)

# -----------------------------------------------------------------------------
# training objectives and sharpness


def random_patch_noise(images, patch, std, generator):
    """N(0, std^2) on one random patch (of the patch grid) of each image, as one batched mask."""
    tokens = patchify(torch.zeros_like(images), patch)  # (B, T, D)
    pick = torch.randint(tokens.shape[1], (len(images),), generator=generator, device=images.device)  # one per image
    tokens[torch.arange(len(images), device=images.device), pick] = 1.0  # ones on the picked patch
    mask = unpatchify(tokens, patch, images.shape[1:])  # (B, C, H, W): 1 on that patch's pixels, 0 elsewhere
    return images + std * torch.randn(images.shape, generator=generator, device=images.device) * mask


def make_loss(variant, args, generator):
    """loss_fn(model, normalised images, labels) of a training variant."""
    def vanilla(model, x, y):
        return F.cross_entropy(model(x).float(), y)

    def augment(model, x, y):  # Gaussian noise on the whole image, label kept
        return vanilla(model, x + args.augment_std * torch.randn(x.shape, generator=generator, device=x.device), y)

    def reg(model, x, y):  # (1 - p) CE + p MSE(f(x with one noisy patch), f(x)), the authors' regulariser
        out = model(x).float()  # the clean logits
        noisy = model(random_patch_noise(x, args.sens_patch, args.reg_std, generator)).float()  # one patch perturbed
        # the MSE term penalises a change of the logits under one patch of noise: a smooth proxy of the sensitivity,
        # whose indicator 1[argmax changes] has no gradient; the gradient flows through both passes, as the authors'
        return (1 - args.reg) * F.cross_entropy(out, y) + args.reg * F.mse_loss(noisy, out)

    return {"vanilla": vanilla, "augment": augment, "reg": reg}[variant]


@torch.no_grad()
def sharpness(model, x, std, reps, generator, batch_size=500):
    """ShOp and ShPred (mean L1 change of the logits, fraction of changed predictions) when every weight gets
    N(0, std^2) noise, with their standard errors over the `reps` weight draws; eval mode, BatchNorm statistics as they
    are, the model's own weights never touched."""
    model.eval()  # BatchNorm on its running statistics, dropout off
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())  # BatchNorm's statistics: kept, never perturbed
    clean = torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]).float()  # f_theta(x)
    shop, shpred = [], []
    for _ in range(reps):
        noisy = {k: p + std * torch.randn(p.shape, generator=generator, device=p.device) for k, p in params.items()}
        # the model run with theta + eps, its own parameters untouched (no copy of the module, no restore)
        out = torch.cat([torch.func.functional_call(model, {**noisy, **buffers}, (x[i:i + batch_size],))
                         for i in range(0, len(x), batch_size)]).float()
        shop.append((out - clean).abs().sum(1).mean().item())  # E_x |f_{theta+eps}(x) - f_theta(x)|_1
        shpred.append((out.argmax(1) != clean.argmax(1)).float().mean().item())  # E_x 1[argmax differs]
    result = {}
    for name, values in [("shop", shop), ("shpred", shpred)]:
        result[name] = float(np.mean(values))
        result[f"{name}_stderr"] = float(np.std(values, ddof=1) / np.sqrt(reps)) if reps > 1 else float("nan")  # draws
    return result


# -----------------------------------------------------------------------------
# corruption accuracy, for any model of [0, 1] images


class Normalize(torch.nn.Module):
    """(x - mean) / std per channel in front of a model, so that it takes [0, 1] images like torchvision's and
    RobustBench's models; robustness.py's own models (trained on [-1, 1] pixels) are evaluated this way."""

    def __init__(self, mean, std):
        super().__init__()
        mean, std = (torch.as_tensor(v, dtype=torch.float32).reshape(-1) for v in (mean, std))  # one per channel
        if mean.shape != std.shape or not bool((std > 0).all() and std.isfinite().all()):
            raise ValueError(f"Normalize needs a mean and a finite std > 0 per channel, got {mean.tolist()}, "
                             f"{std.tolist()}")
        self.register_buffer("mean", mean.view(1, -1, 1, 1))
        self.register_buffer("std", std.view(1, -1, 1, 1))

    def forward(self, x):
        if x.shape[1] != self.mean.shape[1]:  # never broadcast 1-channel images to 3 channels without a word
            raise ValueError(f"Normalize has {self.mean.shape[1]} channels, the images {x.shape[1]}")
        return (x - self.mean) / self.std  # (B, C, H, W), per channel


@torch.no_grad()
def accuracy(model, images, labels, batch_size=500):
    """Accuracy of a model of [0, 1] float images on uint8 images (eval mode)."""
    model.eval()  # uint8 -> [0, 1] floats in batches: the images stay uint8 on the device
    correct = 0
    for i in range(0, len(images), batch_size):
        out = model(images[i:i + batch_size].float() / 255)
        if not bool(torch.isfinite(out).all()):  # a NaN model is no classifier: say so instead of scoring argmax
            raise ValueError("the model returned non-finite outputs: no accuracy can be read from them")
        correct += (out.argmax(1) == labels[i:i + batch_size]).sum().item()
    return correct / len(images)


def default_corruptions(cifar10c_dir, frost_dir):
    """All 19 of the release, but frost when it would be generated without its six textures."""
    return [c for c in STANDARD + EXTRA if c != "frost" or cifar10c_dir or frost_dir]


def evaluate_corruptions(model, images=None, labels=None, *, corruptions=None, severities=(1, 2, 3, 4, 5),
                         cifar10c_dir=None, n=None, frost_dir=None, seed=0):
    """Corruption accuracy of `model`, any module of [0, 1] float images (B, C, H, W) -> logits. The corrupted
    images are read from the official release in cifar10c_dir (its first n images per severity, all by default),
    or generated here from the clean uint8 `images` (with `labels`; for CIFAR-10 they are the release's source, so
    pass them with cifar10c_dir too for the clean accuracy). Returns {"clean_acc": on the same images (None without),
    "corruption_acc": {name: {severity: acc}}, "mean_corruption_acc": over the 15 standard corruptions measured
    (RobustBench's number), "mean_extra_acc": over the 4 extra ones measured, "skipped": {name: why}}. corruptions=None
    is all 19, but frost when generated without frost_dir (its textures): it is then skipped, and "skipped" says so.
    `images` may be uint8 or floats in [0, 1] (a torchvision ToTensor batch); names, severities, sizes and the frost
    textures are checked before any work."""
    skipped = {}
    if corruptions is None:
        corruptions = default_corruptions(cifar10c_dir, frost_dir)
        if "frost" not in corruptions:
            skipped["frost"] = "generating it needs frost_dir=, the folder of the release's six frost textures"
    if isinstance(corruptions, str) or not all(isinstance(c, str) for c in corruptions):
        raise TypeError(f"corruptions must be a list of names, got {corruptions!r}")
    for name in corruptions:
        for s in severities:
            check_corruption(name, s)
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be None (all) or a number of images >= 1, got {n!r}")
    if images is not None:
        if images.is_floating_point():  # [0, 1] floats, as torchvision's ToTensor gives: back to their 8-bit values
            if not bool(((images >= 0) & (images <= 1)).all()):
                raise ValueError("float images must lie in [0, 1] (or pass uint8 images in 0..255)")
            images = (images * 255).round().to(torch.uint8)
        if labels is None or len(labels) != len(images):
            raise ValueError(f"labels must give one label per image: {len(images)} images, "
                             f"{None if labels is None else len(labels)} labels")
    elif not cifar10c_dir:
        raise ValueError("evaluate_corruptions needs the clean images to corrupt, or cifar10c_dir (the release)")
    if "frost" in corruptions and not cifar10c_dir:  # its textures, before any work
        try:
            load_frost(frost_dir)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{e}; or leave 'frost' out of corruptions= (the default leaves it out without "
                                    "frost_dir=)") from None
    device = next(iter(model.parameters()), torch.empty(0)).device  # a model with no parameters runs on the CPU
    model.to(device)  # a wrapper's buffers beside its model's parameters (Normalize's mean and std stayed on the CPU)
    gen = torch.Generator(device).manual_seed(seed)  # the random corruptions' draws: the same for every model
    out = {"corruption_acc": {}, "clean_acc": None, "skipped": skipped}
    if images is not None:
        images, labels = images[:n].to(device), labels[:n].to(device)
        out["clean_acc"] = accuracy(model, images, labels)
    for name in corruptions:
        out["corruption_acc"][name] = {}
        for s in severities:
            if cifar10c_dir:  # the release: 10,000 corrupted test images per corruption and severity
                x, y = (t.to(device) for t in read_release(cifar10c_dir, name, s, n))
            else:  # generated from the clean test images, 2,000 at a time (the memory of one chunk)
                x, y = torch.cat([corrupt(images[i:i + 2000], name, s, gen, frost_dir)
                                  for i in range(0, len(images), 2000)]), labels
            out["corruption_acc"][name][str(s)] = accuracy(model, x, y)
    for key, names in [("mean_corruption_acc", STANDARD), ("mean_extra_acc", EXTRA)]:  # over corruptions x severities
        accs = [a for c in names if c in out["corruption_acc"] for a in out["corruption_acc"][c].values()]
        out[key] = float(np.mean(accs)) if accs else None
    out["standard_measured"] = sum(c in out["corruption_acc"] for c in STANDARD)  # RobustBench's mean needs 15
    return out


# -----------------------------------------------------------------------------
# the experiment

FIG9 = [("resnet18", "vanilla"), ("densenet121", "vanilla"), ("vit", "vanilla"), ("vit-simple", "vanilla"),
        ("vit", "augment"), ("vit", "reg")]  # the six models of the paper's Fig. 9
# what --from-vision cannot honour: how the saved models were trained and what vision.py measured at their end
TRAINING_FLAGS = ["--variants", "--paper-fig9", "--augment-std", "--reg", "--reg-std", "--optimizer", "--lr",
                  "--momentum", "--weight-decay", "--schedule", "--epochs", "--until-acc", "--patience", "--steps",
                  "--batch-size", "--amp", "--compile", "--augment", "--eval-every", "--sens-during", "--match-acc",
                  "--sweep", "--mask", "--flat-patches", "--save-every"]


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    vision.add_flags(p)  # every flag of vision.py's models, data, training and sensitivity
    g = p.add_argument_group("robustness")
    g.add_argument("--variants", type=str, nargs="+", default=["vanilla"], choices=["vanilla", "augment", "reg"],
                   help="training variants, each applied to every --model")
    g.add_argument("--paper-fig9", action="store_true", help="the paper's six models of Fig. 9: resnet18, "
                   "densenet121, vit, vit-simple, vit + augment, vit + reg (instead of --model and --variants)")
    g.add_argument("--from-vision", type=str, default=None, help="evaluate the models saved by vision.py "
                   "--save-model in this run folder instead of training (its model and data flags are reused)")
    g.add_argument("--augment-std", type=nonnegative_float, default=0.1, help="std of the Gaussian-noise augmentation")
    g.add_argument("--reg", type=checked(float, lambda v: 0 <= v <= 1, "a weight in [0, 1]"), default=0.5,
                   help="weight p of the sensitivity regulariser [author code]")
    g.add_argument("--reg-std", type=nonnegative_float, default=1.0, help="noise std on the regulariser's patch "
                   "[author code]")
    g = p.add_argument_group("corruptions")
    g.add_argument("--cifar10c-dir", type=str, default=None, help="the official CIFAR-10-C release (else generate)")
    g.add_argument("--frost-dir", type=str, default=None, help="the six frost textures of Hendrycks' generator, to "
                   "generate frost (not needed with --cifar10c-dir)")
    g.add_argument("--corruptions", type=one_of(list(SEVERITY), "corruption"), nargs="+", default=None,
                   help="corruptions to evaluate (default: the 15 standard ones and the 4 extras of the release; "
                   "generated, frost only with --frost-dir)")
    g.add_argument("--severities", type=checked(int, lambda v: 1 <= v <= 5, "an integer from 1 to 5"), nargs="+",
                   default=[1, 2, 3, 4, 5], help="severities 1..5")
    g.add_argument("--n-corrupt", type=positive_int, default=None, help="test images per corruption and severity "
                   "(default: all, the release's 10,000 for CIFAR-10)")
    g = p.add_argument_group("sharpness")
    g.add_argument("--sharp-std", type=nonnegative_float, default=0.05, help="std of the weight noise [author code]")
    g.add_argument("--sharp-reps", type=positive_int, default=5, help="weight-noise draws [author code]")
    g.add_argument("--n-sharp", type=positive_int, default=2000, help="training images the sharpness is measured on")
    add_run_flags(p, unit="epochs", default_name="<dataset>-<models>, fig9 or from-vision")
    args = parse(p, "robustness", argv)
    if args.from_vision and (dropped := [f for f in TRAINING_FLAGS if given(argv, f)]):  # else taken in silence
        p.error("--from-vision evaluates the models vision.py saved, as they were trained and measured: drop "
                + " and ".join(dropped))
    if args.mask[0] != "patch":  # else the curves' sensitivity would be another mask's than the final one's
        p.error(f"--mask {' '.join(args.mask)}: robustness.py's sensitivity is the patch mask's (Def. 4.1): put patch "
                "first (the other masks are measured beside it at the end)")
    if args.from_vision:  # the saved run's model and data flags first, so that those given here take precedence
        args = parse_with(p, argv, args.from_vision, "vision")
    vision.check_flags(p, args)
    if args.corruptions is None:
        args.corruptions = default_corruptions(args.cifar10c_dir, args.frost_dir)
    if args.paper_fig9 and given(argv, "--model", "--variants"):
        p.error("--paper-fig9 trains the six models of Fig. 9: drop --model and --variants, or drop --paper-fig9")
    if args.paper_fig9:  # the models and variants Fig. 9 needs, for the data and the checks below
        args.model = list(dict.fromkeys(m for m, _ in FIG9))
        args.variants = list(dict.fromkeys(v for _, v in FIG9))
    if args.cifar10c_dir and not os.path.isdir(args.cifar10c_dir):
        p.error(f"--cifar10c-dir {args.cifar10c_dir}: no such folder (get CIFAR-10-C from "
                "https://zenodo.org/record/2535967, or leave the flag out to generate the corruptions)")
    if args.cifar10c_dir:  # every file opened and checked before any training
        channels, size = vision.DATASETS[args.dataset][:2]
        try:
            check_release(args.cifar10c_dir, args.corruptions, (channels, size, size))
        except (FileNotFoundError, ValueError) as e:
            p.error(f"--cifar10c-dir: {e}")
    elif "frost" in args.corruptions:
        try:
            load_frost(args.frost_dir)
        except (FileNotFoundError, ValueError) as e:
            p.error(f"{e}; or leave frost out of --corruptions")
    return args


def evaluate_model(model, args, data, seed):
    """Sensitivity, accuracies, corruption accuracy per corruption and severity, ShOp, ShPred of a trained model."""
    final = {}
    # the same measurements vision.py makes, then corruption accuracy and sharpness of the same model
    final["train_loss"], final["train_acc"] = vision.evaluate(model, data["train_x"], data["train_y"])
    final["test_loss"], final["test_acc"] = vision.evaluate(model, data["test_x"], data["test_y"])
    sens = vision.measure_sensitivity(model, vision.normalize(data["train_x"][: args.n_sens]), patch=args.sens_patch,
                                      sigmas=args.sigma[:1], masks=["patch"], seed=args.sens_seed, reps=args.reps,
                                      positions=args.sens_positions)
    sens = next(iter(sens.values()))  # the one (patch, first sigma) measurement
    final["sens"], final["sens_stderr"] = sens.mean, sens.stderr
    channels = data["train_x"].shape[1]
    on_01 = torch.nn.Sequential(Normalize([0.5] * channels, [0.5] * channels), model)  # vision.normalize's [-1, 1]
    final.update(evaluate_corruptions(on_01, data["test_x"], data["test_y"], corruptions=args.corruptions,
                                      severities=args.severities, cifar10c_dir=args.cifar10c_dir, n=args.n_corrupt,
                                      frost_dir=args.frost_dir, seed=seed))
    gen = torch.Generator(data["train_x"].device).manual_seed(seed)  # the weight noise of the sharpness
    final.update(sharpness(model, vision.normalize(data["train_x"][: args.n_sharp]), args.sharp_std, args.sharp_reps,
                           gen))
    return final


def main(args):
    device = setup(args)
    data = vision.prepare_data(args, device)  # the same subsets as vision.py; before the run folder
    if not args.cifar10c_dir:
        subset_size("--n-corrupt", args.n_corrupt, len(data["test_x"]), "test images (--n-test)")
    subset_size("--n-sharp", args.n_sharp, len(data["train_x"]), "training images (--n-train)")
    name = "from-vision" if args.from_vision else "fig9" if args.paper_fig9 else \
        f"{args.dataset}-{'-'.join(args.model)}"
    folder, results = start_run("robustness", args, name, device)
    if len([c for c in STANDARD if c in args.corruptions]) < len(STANDARD):
        print(f"note: mean_corruption_acc is over {sum(c in args.corruptions for c in STANDARD)} of the 15 standard "
              "corruptions" + ("" if "frost" in args.corruptions else " (frost needs --frost-dir)"))
    shape = vision.DATASETS[args.dataset][:3]  # (channels, size, classes)
    # the (model, variant, seed) triples to train and evaluate, in order
    if args.from_vision:
        jobs = [(m, "vanilla", s) for m in args.model for s in args.seeds]
    elif args.paper_fig9:
        jobs = [(m, v, s) for m, v in FIG9 for s in args.seeds]
    else:
        jobs = [(m, v, s) for m in args.model for v in args.variants for s in args.seeds]
    try:
        with results.recording():  # Ctrl-C or SIGTERM: metrics kept, checkpoint written
            for model_name, variant, seed in jobs:
                run = Run(f"{model_name}-{variant}", seed)
                if results.finished(run, "corruption_acc"):
                    continue
                # the noise of augment and reg: a stream per rank (each draws for its own slice of the batch)
                gen = torch.Generator(device).manual_seed(seed + 1_000_003 * ranks()[0])
                if args.from_vision:  # a model vision.py trained and saved: evaluate it as it is
                    seed_all(seed)
                    model = vision.build_model(model_name, args, *shape).to(device)
                    path = os.path.join(args.from_vision, f"{model_name}-seed{seed}.pt")
                    try:
                        model.load_state_dict(torch.load(path, map_location=device))
                    except FileNotFoundError:
                        raise FileNotFoundError(f"no {path}: run vision.py with --save-model first") from None
                    except (RuntimeError, pickle.UnpicklingError, EOFError) as e:
                        raise ValueError(f"{path} is not a {model_name} checkpoint of these flags ({e})") from None
                else:  # trained here, with the variant's objective, through vision.py's own loop
                    model = vision.train(name=model_name, seed=seed, args=args, data=data, results=results,
                                         device=device, run=run, loss_fn=make_loss(variant, args, gen),
                                         noise_generators=[gen], done_when="corruption_acc")
                    if model is None:  # diverged: marked in metrics.json, nothing to measure
                        continue
                final = evaluate_model(model, args, data, seed)  # sensitivity, corruptions, sharpness
                results.final(run, final)
                print(f"{run} | train acc {final['train_acc']:.4f} | test acc {final['test_acc']:.4f} | sens "
                      f"{final['sens']:.4f} +- {final['sens_stderr']:.4f} | mean corruption acc "
                      f"{final['mean_corruption_acc']:.4f} | ShOp {final['shop']:.4f} +- {final['shop_stderr']:.4f} "
                      f"| ShPred {final['shpred']:.4f} +- {final['shpred_stderr']:.4f}")
            results.data["summary"] = report.robustness_summary(results.data)  # per model, and the correlation
            results.save()
    finally:  # also after Ctrl-C: draw what there is (python report.py redraws it)
        if not args.no_figures and (paths := report.draw(results.data, folder)):
            print("wrote", *paths)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
