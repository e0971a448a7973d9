"""Do vision transformers learn lower-sensitivity functions than CNNs, ConvMixers and MLPs? (Sec. 5, App. A.1-A.3.)

Trains each --model on the same data with the same optimiser (SGD, as the paper) and measures, every few epochs, the
token-wise sensitivity on a fixed subset of the training set: Gaussian noise N(0, sigma^2) on one p x p patch of the
normalised image at a time, every patch in turn, the same patch grid for every architecture (Def. 4.1).

    python vision.py --model vit --sigma 0.1                       # CIFAR-10 (downloads it), hours on a CPU
    python vision.py --dataset fashionmnist --data-dir DATA --model vit vit-simple mlp mlp-sigmoid cnn \\
        --lr cnn=0.05 mlp-sigmoid=1.0 vit-simple=0.1 --n-train 3000 --epochs 30 --depth 4 --heads 4 --dim-head 16 \\
        --sigma 0.1 1 --sweep --mask patch scattered --match-acc 0.8 0.85 0.9 --seeds 0   # RESULTS.md, ~40 min
    python vision.py --dataset fake --model vit mlp --epochs 1 --n-train 200   # offline smoke test, seconds
    python report.py out/vision/seed0 out/vision/seed1 out/vision/seed2       # merge seeds run apart

Sec. 5's pretrained ImageNet models: imagenet.py. robustness.py trains these models with other objectives.
"""

import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import report
from common import gaussian, not_finite, patchify, predict, sensitivity, summarise, unpatchify
from convnets import CNN, ConvMixer, DenseNet121, ResNet18
from runs import (ArgumentParser, Run, add_run_flags, all_sum, checked, cli, for_training, fraction, nonnegative_float,
                  one_of, parse, per_name, positive_int, ranks, restore, seed, seed_all, setup, start_run, subset_size,
                  time_forward, torchvision_dataset)
from vits import SimpleViT, ViT

MODELS = ["vit", "vit-simple", "resnet18", "densenet121", "convmixer", "mlp", "mlp-sigmoid", "cnn"]
# (channels, size, classes) and where torchvision looks for the files (the offline error message names them)
DATASETS = {
    "cifar10": (3, 32, 10, "cifar-10-batches-py/ (or cifar-10-python.tar.gz)"),
    "svhn": (3, 32, 10, "train_32x32.mat and test_32x32.mat"),
    "fashionmnist": (1, 28, 10, "FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz"),
    "mnist01": (1, 28, 2, "MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz"),
    "fake": (3, 32, 10, None),
    "fake28": (1, 28, 10, None),
}
# per-model default learning rates of the paper (App. D): CIFAR-10 for the ViTs, ConvMixer and CNNs,
# Fashion-MNIST for the MLPs and the small CNN (the ViT has 0.1 on both)
LR = {"vit": 0.1, "vit-simple": 0.2, "convmixer": 0.06, "resnet18": 0.001, "densenet121": 0.005, "mlp": 0.1,
      "mlp-sigmoid": 0.5, "cnn": 0.005}
LR_MNIST01 = 0.01  # ViT-small and the MLP on MNIST 0 vs 1 [paper]
SWEEP = [0.03, 0.1, 0.3, 1, 3, 10, 30, 100]  # --sweep: noise stds from far below to far above the pixel range
CPU_SIZE = ("the README's CPU-sized protocol (its ViT alone: 13-18 min on one thread): python vision.py --dataset "
            "fashionmnist --n-train 3000 --epochs 30 --depth 4 --heads 4 --dim-head 16 --sigma 0.1 1")


def add_flags(p):
    """The model, data, optimisation and sensitivity flags, which robustness.py shares. [author code]: the default
    of the authors' code; [paper]: stated in the paper."""
    g = p.add_argument_group("model")
    g.add_argument("--model", type=one_of(MODELS, "model"), nargs="+", default=["vit"], help=f"of {MODELS}, in turn")
    g.add_argument("--depth", type=positive_int, default=8, help="transformer blocks (ViTs), layers (ConvMixer)")
    g.add_argument("--heads", type=positive_int, default=32, help="attention heads (ViTs) [author code]")
    g.add_argument("--dim", type=positive_int, default=64, help="token width (ViTs, ConvMixer) [author code]")
    g.add_argument("--dim-head", type=positive_int, default=64, help="width of one attention head [author code]")
    g.add_argument("--mlp-dim", type=positive_int, default=512, help="hidden width of the ViTs' MLP [author code]")
    g.add_argument("--dropout", type=fraction, default=0.1, help="dropout of ViT-small [author code]")
    g.add_argument("--patch-size", type=positive_int, default=None, help="ViT/ConvMixer patch in pixels: default 4 "
                   "[author code, CIFAR-10; the paper's one size for the other sets], 7 on MNIST 0 vs 1 [our choice]")
    g.add_argument("--no-patch-norm", action="store_true", help="ViTs without the LayerNorm on each raw patch")
    g.add_argument("--no-block-norm", action="store_true", help="ViTs without the LayerNorm before each attention and "
                   "MLP (the final one kept): nothing in the blocks removes a token's scale")
    g.add_argument("--input-patch-norm", action="store_true", help="the MLPs and the CNN with a LayerNorm of each "
                   "--patch-size patch of the image in front, as the ViT's tokeniser normalises a patch")
    g.add_argument("--mlp-hidden", type=positive_int, nargs="+", default=[512, 128], help="hidden widths of the MLPs")
    g.add_argument("--spt-shift", type=str, default="1", choices=["1", "half"], help="ViT-small's shifted patches: "
                   "one pixel in four directions [author code], or half a patch diagonally [Lee et al.]")
    g = p.add_argument_group("data")
    g.add_argument("--dataset", type=str, default="cifar10", choices=list(DATASETS),
                   help="fake, fake28: random images, for offline checks")
    g.add_argument("--data-dir", type=str, default="data", help="where the dataset files are (or are downloaded to)")
    g.add_argument("--n-train", type=positive_int, default=None, help="a random subset of the training images")
    g.add_argument("--n-test", type=positive_int, default=None, help="the first this many test images")
    g.add_argument("--data-seed", type=seed, default=0, help="seed of the training subset (fixed across --seeds)")
    g.add_argument("--augment", action="store_true", help="random crops (pad 4) and flips (32x32 sets only)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", type=str, default="sgd", choices=["sgd", "adam"], help="paper: SGD (Fig. 14: Adam)")
    g.add_argument("--lr", type=per_name(MODELS, "learning rate"), nargs="+", default=[], help="learning rate for all "
                   "models (0.05) or per model (cnn=0.05 vit=0.1); a model not named keeps the paper's rate (LR above)")
    g.add_argument("--momentum", type=checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)"), default=0.0,
                   help="SGD momentum [author code: none]")  # 1 and above: the steps never decay (diverges)
    g.add_argument("--weight-decay", type=nonnegative_float, default=0.0, help="weight decay [author code: none]")
    g.add_argument("--schedule", type=str, default="constant", choices=["constant", "step", "cosine"],
                   help="lr schedule: constant, step (x0.5 every 8 epochs, the authors'), cosine to 0")
    g.add_argument("--epochs", type=positive_int, default=50, help="training epochs, at most [author code]")
    g.add_argument("--until-acc", type=checked(float, lambda v: 0 < v <= 1, "a train accuracy in (0, 1]"),
                   default=None, help="stop at the first evaluation whose train accuracy reaches this")
    g.add_argument("--patience", type=positive_int, default=None, help="stop when this many evaluations in a row "
                   "bring no training loss 1%% below the best so far")
    g.add_argument("--steps", type=positive_int, default=None, help="SGD steps instead of --epochs (the same number "
                   "of updates whatever --n-train)")
    g.add_argument("--batch-size", type=positive_int, default=100, help="images per step (paper: 100, MNIST 50)")
    g.add_argument("--seeds", type=seed, nargs="+", default=[0], help="initialisation/order seeds")
    g.add_argument("--amp", action="store_true", help="bf16 autocast for training (CUDA only)")
    g.add_argument("--compile", action="store_true", help="torch.compile the training step (evaluation and "
                   "sensitivity stay eager)")
    g = p.add_argument_group("sensitivity")
    g.add_argument("--sigma", type=nonnegative_float, nargs="+", default=[0.1], help="noise std(s) on the [-1, 1] "
                   "pixels; the first is the headline [author code: 0.1]")
    g.add_argument("--sweep", action="store_true", help=f"also measure every final model at sigma in {SWEEP} (Fig. 17)")
    g.add_argument("--mask", type=str, nargs="+", default=["patch"], choices=["patch", "scattered", "global"],
                   help="patch: one patch of the grid at a time (Def. 4.1); scattered: p^2 random pixels shared by a "
                   "batch (the authors' released estimator); global: the whole image, std sigma/sqrt(T) (App. A.2)")
    g.add_argument("--sens-patch", type=positive_int, default=None, help="patch grid (default: --patch-size)")
    g.add_argument("--sens-seed", type=seed, default=0, help="seed of the noise: the same for every model (paired)")
    g.add_argument("--reps", type=positive_int, default=1, help="noise draws per (image, patch)")
    g.add_argument("--sens-positions", type=positive_int, default=None, help="sample this many patches per image and "
                   "draw, with replacement (default: every patch)")
    g.add_argument("--n-sens", type=positive_int, default=500, help="training images the sensitivity is measured on")
    g.add_argument("--eval-every", type=positive_int, default=5, help="epochs between evaluations [author code]")
    g.add_argument("--sens-during", type=str, default="every", choices=["every", "needed"],
                   help="the sensitivity during training: at every evaluation (the curves of sensitivity.png), or "
                   "only where a reported number reads it: the last evaluation and the two around each --match-acc "
                   "crossing (the same numbers, a fraction of the evaluations' time)")
    g.add_argument("--flat-patches", type=nonnegative_float, default=None, help="also measure the final model "
                   "(patch mask, first sigma) on the flat and the other patches apart: flat if the clean patch's "
                   "pixel std is below this, on the [-1, 1] scale")
    g.add_argument("--match-acc", type=checked(float, lambda v: 0 < v <= 1, "train accuracies in (0, 1]"), nargs="+",
                   default=[], help="read the sensitivity where train accuracy first crosses these levels (App. A.1)")
    return p


def check_flags(p, args):
    """What no single flag's type can check: the patch sizes against the images (filled in when not given), --amp."""
    size = DATASETS[args.dataset][1]
    args.patch_size = args.patch_size or (7 if args.dataset == "mnist01" else 4)
    args.sens_patch = args.sens_patch or args.patch_size
    for flag, p_ in [("--patch-size", args.patch_size), ("--sens-patch", args.sens_patch)]:
        if size % p_:
            p.error(f"{flag} {p_} does not divide the {size}x{size} images")
    if args.amp and not (args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())):
        p.error("--amp (bf16 autocast) needs a CUDA device")
    if args.augment and size != 32:  # a 4-pixel pad and crop would move a 28x28 digit a seventh of its size
        p.error(f"--augment (crops padded by 4, flips) is for the 32x32 datasets, not {args.dataset}")


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    add_flags(p)
    g = add_run_flags(p, unit="epochs", default_name="<dataset>-<models>")
    g.add_argument("--save-model", action="store_true", help="save each final model to <run>/<model>-seed<k>.pt")
    args = parse(p, "vision", argv)
    check_flags(p, args)
    return args


# -----------------------------------------------------------------------------
# data: each dataset lives on the device as uint8, normalised and augmented in batches (no DataLoader)


def load_dataset(name, data_dir, device):
    """{'train_x', 'test_x'} uint8 (N, C, H, W) and {'train_y', 'test_y'} int64, on the device; missing files are
    downloaded by torchvision (offline, the error names the files to provide)."""
    channels, size, classes, files = DATASETS[name]
    if name.startswith("fake"):  # random images of the right shape, for tests and smoke runs
        g = torch.Generator().manual_seed(0)
        data = {f"{s}_x": torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8)
                for s, n in [("train", 1000), ("test", 200)]}
        data.update({f"{s}_y": torch.randint(0, classes, (n,), generator=g) for s, n in [("train", 1000),
                                                                                         ("test", 200)]})
        return {k: v.to(device) for k, v in data.items()}
    import torchvision.datasets as tvd

    if name == "svhn":  # checked before torchvision downloads 600 MB that it then cannot read
        try:
            import scipy.io  # noqa: F401  torchvision reads SVHN's .mat files with it
        except ImportError:
            raise ValueError("--dataset svhn needs scipy, with which torchvision reads SVHN's .mat files: "
                             "pip install scipy") from None
    cls = {"cifar10": tvd.CIFAR10, "svhn": tvd.SVHN, "fashionmnist": tvd.FashionMNIST, "mnist01": tvd.MNIST}[name]
    data = {}
    for split, train in [("train", True), ("test", False)]:
        kw = {"split": "train" if train else "test"} if name == "svhn" else {"train": train}
        ds = torchvision_dataset(cls, data_dir, files, **kw)  # downloads; offline, names the files to provide
        x = torch.as_tensor(ds.data)
        x = x.permute(0, 3, 1, 2) if x.ndim == 4 and x.shape[-1] == 3 else x  # CIFAR is NHWC
        x = x[:, None] if x.ndim == 3 else x  # MNIST-like: add the channel
        y = torch.as_tensor(ds.labels if name == "svhn" else ds.targets).long()
        if name == "mnist01":  # App. A.1's binary task: the digits 0 and 1 only
            x, y = x[y <= 1], y[y <= 1]
        data[f"{split}_x"], data[f"{split}_y"] = x.contiguous().to(device), y.to(device)
    return data


def prepare_data(args, device):
    """The dataset on the device, cut to a random --n-train subset of the training images drawn with --data-seed
    (the same for every --seeds) and the first --n-test test images; sizes larger than the data are a ValueError."""
    data = load_dataset(args.dataset, args.data_dir, device)
    n_train = subset_size("--n-train", args.n_train, len(data["train_x"]), f"{args.dataset} training images")
    n_test = subset_size("--n-test", args.n_test, len(data["test_x"]), f"{args.dataset} test images")
    subset_size("--n-sens", args.n_sens, n_train, "training images (--n-train) to measure on")
    g = torch.Generator().manual_seed(args.data_seed)  # its own generator: --seeds never change the subset
    keep = torch.randperm(len(data["train_x"]), generator=g)[:n_train].to(device)
    data["train_x"], data["train_y"] = data["train_x"][keep], data["train_y"][keep]
    data["test_x"], data["test_y"] = data["test_x"][:n_test], data["test_y"][:n_test]
    return data


def normalize(x):
    """uint8 images -> floats in [-1, 1]: (x/255 - 0.5) / 0.5, the authors' Normalize((0.5,), (0.5,))."""
    return x.float().div(127.5).sub_(1.0)  # div makes a new tensor: a float input is never overwritten


def augment_batch(x, generator):
    """Random crop (zero-pad 4) and horizontal flip of a uint8 batch, as batched tensor ops."""
    B, _, H, W = x.shape
    flip = torch.rand(B, generator=generator, device=x.device) < 0.5  # which images are mirrored
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    padded = F.pad(x, (4, 4, 4, 4))  # (B, C, H + 8, W + 8), zeros around
    dy, dx = (torch.randint(0, 9, (2, B), generator=generator, device=x.device))  # each crop's top-left corner
    rows = (dy[:, None] + torch.arange(H, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(W, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    batch, chans = torch.arange(B, device=x.device), torch.arange(x.shape[1], device=x.device)
    return padded[batch[:, None, None, None], chans[None, :, None, None], rows, cols]  # one gather for all crops


# -----------------------------------------------------------------------------
# models: MLP and the patch norm here; ViT-small, ViT-simple and their blocks are in vits.py, ResNet-18,
# DenseNet-121, ConvMixer and the CNN in convnets.py


class MLP(nn.Module):
    def __init__(self, *, inputs, hidden, classes, activation):
        super().__init__()
        act = {"leakyrelu": nn.LeakyReLU, "sigmoid": nn.Sigmoid}[activation]  # the paper's two MLPs
        layers, width = [nn.Flatten()], inputs  # the image as one vector of pixels
        for h in hidden:
            layers += [nn.Linear(width, h), act()]
            width = h
        self.net = nn.Sequential(*layers, nn.Linear(width, classes))

    def forward(self, x):
        return self.net(x)


class PatchNorm(nn.Module):
    """A LayerNorm of each p x p patch of the image (its C*p*p pixels, with a learned scale and shift), as the ViT's
    tokeniser normalises a patch (there: the patch and its four shifts); --input-patch-norm puts it in front of the
    MLPs and the CNN. A flat patch (pixel std near 0) becomes unit-scale: small noise on it is magnified."""

    def __init__(self, channels, size, patch):
        super().__init__()
        self.patch, self.shape = patch, (channels, size, size)
        self.norm = nn.LayerNorm(channels * patch * patch)

    def forward(self, x):
        return unpatchify(self.norm(patchify(x, self.patch)), self.patch, self.shape)


def build_model(name, args, channels, size, classes):
    # the two ViTs share their size flags; the others take what they need
    vit_kw = dict(image=size, channels=channels, patch=args.patch_size, classes=classes, dim=args.dim, depth=args.depth,
                  heads=args.heads, dim_head=args.dim_head, mlp_dim=args.mlp_dim, patch_norm=not args.no_patch_norm,
                  block_norm=not args.no_block_norm)
    normed = lambda net: nn.Sequential(PatchNorm(channels, size, args.patch_size), net) if args.input_patch_norm \
        else net  # --input-patch-norm: the MLPs and the CNN get the ViT's per-patch LayerNorm in front
    if name == "vit":
        return ViT(**vit_kw, dropout=args.dropout, spt_shift=args.spt_shift)
    elif name == "vit-simple":
        return SimpleViT(**vit_kw)
    elif name == "resnet18":
        return ResNet18(channels=channels, classes=classes)
    elif name == "densenet121":
        return DenseNet121(channels=channels, classes=classes)
    elif name == "convmixer":
        return ConvMixer(channels=channels, classes=classes, dim=args.dim, depth=args.depth, patch=args.patch_size)
    elif name in ("mlp", "mlp-sigmoid"):
        act = "sigmoid" if name == "mlp-sigmoid" else "leakyrelu"
        return normed(MLP(inputs=channels * size * size, hidden=args.mlp_hidden, classes=classes, activation=act))
    elif name == "cnn":
        return normed(CNN(channels=channels, size=size, classes=classes))
    raise ValueError(f"unknown model {name!r}")


def ablation(name, args):
    """The normalisation ablation a model was built with, as a suffix of its run's label ('vit-no-patch-norm')."""
    vit = name.startswith("vit")
    return "".join(suffix for suffix, on in [("-no-patch-norm", vit and args.no_patch_norm),
                                             ("-no-block-norm", vit and args.no_block_norm),
                                             ("-patch-norm", name in ("mlp", "mlp-sigmoid", "cnn") and
                                              args.input_patch_norm)] if on)


def learning_rate(name, args):
    """The model's learning rate: the last --lr that names it (or names no model), else the paper's rate for it."""
    lr = args.lr if isinstance(args.lr, list) else [f"{m}={v}" for m, v in args.lr.items()]  # older runs: a dict
    for text in reversed(lr):
        model, _, value = text.rpartition("=")
        if model in ("", name):
            return float(value)
    return LR_MNIST01 if args.dataset == "mnist01" else LR[name]


# -----------------------------------------------------------------------------
# metrics


@torch.no_grad()
def evaluate(model, x, y):
    """(mean cross-entropy, accuracy) of the model in eval mode on uint8 images x, in float32 (also under --amp).
    Under torchrun each rank takes a slice of the images and the sums are added up."""
    model.eval()  # dropout off, BatchNorm on its running statistics
    rank, world = ranks()
    part = torch.arange(len(x), device=x.device).tensor_split(world)[rank]  # this rank's images (all of them alone)
    batch_size = 2048 if x.device.type == "cuda" else 256  # a CPU runs a small ViT 1.5x faster at 256 than 1000
    loss = correct = 0.0
    for idx in part.split(batch_size):
        out = model(normalize(x[idx])).float()  # float32 logits even under bf16 autocast
        loss += F.cross_entropy(out, y[idx], reduction="sum").item()  # sums: the mean is taken over all ranks
        correct += (out.argmax(1) == y[idx]).sum().item()
    loss, correct = all_sum(loss, correct)
    return loss / len(x), correct / len(x)


def measure_sensitivity(model, images, *, patch, sigmas, masks, seed, reps=1, positions=None, flat=None):
    """{(mask, sigma): Sensitivity} of the model on normalised images (N, C, H, W), in float32. The noise depends on
    `seed` alone: models measured with the same seed see identical perturbations (paired comparisons). The mask
    "flat" gives ("flat", sigma) and ("object", sigma): the patch mask on the patches whose clean pixel std is below
    `flat` and on the others, over the images that have both (the same images for every model)."""
    model.eval()  # dropout off: it would count as flips
    shape = images.shape[1:]

    def f(xb, idx):  # the estimator hands (B, T, D) patch tokens; the model sees whole images
        return model(unpatchify(xb, patch, shape)).float()

    def g(xb, idx):  # one "token" = the whole image
        return model(xb.view(-1, *shape)).float()

    out = {}
    tokens = patchify(images, patch)  # (N, T, C*p*p): token t is patch t of the grid
    T = tokens.shape[1]
    for sigma in sigmas:
        if "patch" in masks:  # Def. 4.1: one patch at a time
            out["patch", sigma] = sensitivity(f, tokens, gaussian(sigma), reps=reps, positions=positions, seed=seed)
        if "flat" in masks:  # where the flips are: on the background (flat patches) or on the object
            is_flat = tokens.std(-1) < flat  # (N, T)
            both = is_flat.any(1) & ~is_flat.all(1)
            for name, where in [("flat", is_flat[both]), ("object", ~is_flat[both])] if both.any() else []:
                out[name, sigma] = sensitivity(f, tokens[both], gaussian(sigma), mask=where, reps=reps, seed=seed)
        if "scattered" in masks:  # the authors' released estimator, the same number of evaluations
            out["scattered", sigma] = scattered_sensitivity(model, images, patch, sigma, T * reps, seed)
        if "global" in masks:  # App. A.2: one patch's noise energy (std sigma / sqrt(T)) over the whole image
            out["global", sigma] = sensitivity(g, images.flatten(1)[:, None], gaussian(sigma / math.sqrt(T)),
                                               reps=reps, seed=seed)
    return out


key = "{}:{:g}".format  # key(mask, sigma): how metrics.json names a measurement, 'patch:0.1'


def measure_during(model, images, args):
    """The measurement of an evaluation during training: the first --mask at every --sigma (the --sweep and the other
    masks come at the end)."""
    return measure_sensitivity(model, images, patch=args.sens_patch, sigmas=args.sigma, masks=args.mask[:1],
                               seed=args.sens_seed, reps=args.reps, positions=args.sens_positions)


def logged(sens, head):
    """A history row's sensitivity entries: sens@<mask>:<sigma> and its standard error for each measurement, and
    the headline one (`head`, the first mask and sigma) as "sens"."""
    row = {}
    for (mask, sigma), s in sens.items():
        row[f"sens@{key(mask, sigma)}"], row[f"sens_stderr@{key(mask, sigma)}"] = s.mean, s.stderr
    row["sens"], row["sens_stderr"] = sens[head].mean, sens[head].stderr
    return row


def scattered_copies(images, p, sigma, draws, generator):
    """`draws` noisy copies of a batch, draw-major: copy d * B + b is image b with N(0, sigma^2) noise on every
    channel of the pixels of mask d, shared by the batch, which p^2 (row, column) pairs drawn with replacement
    switch on (the authors' mask; a repeated pair makes it fewer pixels). Returns (copies, masks (draws, H, W))."""
    B, C, H, W = images.shape
    rows = torch.randint(H, (draws, p * p), generator=generator, device=images.device)  # p^2 pixels per draw,
    cols = torch.randint(W, (draws, p * p), generator=generator, device=images.device)  # drawn with replacement
    masks = torch.zeros(draws, H * W, dtype=torch.bool, device=images.device)
    masks.scatter_(1, rows * W + cols, True)  # a repeated (row, column) pair switches one pixel on once
    masks = masks.view(draws, 1, 1, H, W)  # broadcast over the batch and the channels
    noise = sigma * torch.randn((draws, B, C, H, W), generator=generator, device=images.device)
    return (images + noise * masks).view(draws * B, C, H, W), masks.view(draws, H, W)


@torch.no_grad()
def scattered_sensitivity(model, images, p, sigma, draws, seed, batch=100, rows=None):
    """The authors' released estimator, for comparison (not the paper's definition): per batch of 100 images,
    `draws` masks of p^2 scattered pixels, each shared by the batch. Returns a Sensitivity (one position). rows:
    images per forward pass (default 2,048 on a GPU, 100 on a CPU, where a small model runs up to 2x faster in batches
    of 100 than of 2,000); the draws are the same whatever it is."""
    gen = torch.Generator(images.device).manual_seed(seed)
    per_call = max(1, 2048 // batch)  # draws generated at once (their random numbers are drawn in this order)
    rows = rows or (2048 if images.device.type == "cuda" else 100)
    flips = torch.zeros(len(images), dtype=torch.long, device=images.device)  # per image, over all its draws
    for i in range(0, len(images), batch):  # the authors' batches of 100: each mask is shared by a batch
        xb = images[i:i + batch]
        clean = predict(model(xb), len(xb))  # the unperturbed predictions
        for d in range(0, draws, per_call):
            n = min(per_call, draws - d)
            copies = scattered_copies(xb, p, sigma, n, gen)[0]
            out = torch.cat([model(c) for c in copies.split(rows)]).float()
            if not_finite(out):
                raise ValueError("the model returned non-finite outputs on perturbed copies")
            flips[i:i + batch] += (predict(out, n * len(xb)).view(n, len(xb)) != clean).sum(0)  # (draws, B) -> (B,)
    return summarise(flips[:, None], torch.full_like(flips[:, None], draws), len(images) * draws)


# -----------------------------------------------------------------------------
# training


def lr_at(epoch, base, schedule, epochs):
    """Learning rate during (fractional) epoch `epoch` of `epochs`."""
    if schedule == "step":
        return base * 0.5 ** (int(epoch) // 8)  # the authors' StepLR(step_size=8, gamma=0.5)
    if schedule == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
    return base


def cross_entropy(model, images, labels):
    return F.cross_entropy(model(images).float(), labels)  # the paper's objective; robustness.py adds others


def make_optimizer(name, model, args):
    """SGD (the paper's, plain unless --momentum / --weight-decay) or Adam, at the model's learning rate."""
    lr = learning_rate(name, args)
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
    return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=args.weight_decay)


def train(*, name, seed, args, data, results, device, run=None, loss_fn=cross_entropy, noise_generators=(),
          done_when=None):
    """Train one model, evaluating it every --eval-every epochs and at the end; measure the final one under every
    --mask. robustness.py passes its run name, objective loss_fn(model, images, labels), the generators that draws
    from (checkpoints keep them) and the final key that marks its run done. Returns the model; None if it diverged
    (marked in metrics.json) or was done."""
    channels, size, classes, _ = DATASETS[args.dataset]
    run = run or Run(name + ablation(name, args), seed)
    if results.finished(run, done_when):  # a resumed run that got that far: nothing to do
        return None
    seed_all(seed)  # the initialisation depends on the seed alone
    model = build_model(name, args, channels, size, classes).to(device)
    print(f"{run}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    opt = make_optimizer(name, model, args)
    base_lr = opt.param_groups[0]["lr"]  # the schedule scales this
    gen = torch.Generator(device).manual_seed(seed)  # the order of the images and their augmentation
    generators = [gen, *noise_generators]
    x, y = data["train_x"], data["train_y"]  # uint8 images, on the device
    sens_images = normalize(x[: args.n_sens])  # a fixed subset of the (already shuffled) training set
    steps_per_epoch = math.ceil(len(x) / args.batch_size)  # the last batch of an epoch may be smaller
    num_steps = args.steps or args.epochs * steps_per_epoch  # --steps: the last epoch may be partial
    start, skipped = 0, None  # skipped: the weights at the last evaluation, if its sensitivity was not measured
    if snap := results.resume(run, "epoch"):  # checkpoints are taken at the end of an epoch
        start = min(restore(snap, model, opt, generators) * steps_per_epoch, num_steps)
        skipped = snap.get("skipped")
    rank, world = ranks()
    fwd = for_training(model, device, compile_model=args.compile)  # training steps only; measurements use model
    head = (args.mask[0], args.sigma[0])  # the headline measurement, logged as "sens"
    per_image = time_forward(model, normalize(x[:64]))  # a guess of the time to the end until steps are timed
    T, sigmas = (size // args.sens_patch) ** 2, len(args.sigma)  # forward passes: a step ~3x, an evaluation these
    guess = 3 * args.batch_size * per_image, per_image * (len(x) + len(data["test_x"]) + len(sens_images) * T * sigmas)
    progress = results.progress(run, start, num_steps, args.eval_every * steps_per_epoch, per_epoch=steps_per_epoch,
                                hint=CPU_SIZE, guess=guess, early=bool(args.until_acc or args.patience))  # an ETA
    t0, loss = time.time(), None
    for step in range(start, num_steps + 1):
        i = step % steps_per_epoch  # the step within its epoch
        progress.tick(step, (i == 0 and step // steps_per_epoch % args.eval_every == 0) or step == num_steps, loss)
        if i == 0 or step == num_steps:  # the end of an epoch: check, checkpoint, evaluate
            epoch = math.ceil(step / steps_per_epoch)
            if step > start and results.diverged(run, epoch, all_sum(loss.item())[0] / world, "epoch"):
                return None  # the last batch's loss, averaged over ranks
            evaluating = epoch % args.eval_every == 0 or step == num_steps
            results.checkpoint(run, epoch, evaluating, args.save_every, model, opt, generators,  # for --resume
                               skipped=skipped)
            if evaluating:
                row = {"epoch": epoch, "step": step}
                row["train_loss"], row["train_acc"] = evaluate(model, x, y)  # on the whole training subset
                if results.diverged(run, epoch, row["train_loss"], "epoch"):
                    return None
                row["test_loss"], row["test_acc"] = evaluate(model, data["test_x"], data["test_y"])
                history = results.data["runs"][str(run)]["history"]
                # --until-acc / --patience: the end point, read off the history (so --resume stops where it would have)
                stop = report.end_point(history + [row], args.until_acc, args.patience)
                # the --match-acc levels first reached now: their sensitivity is read between this evaluation and the
                # one before (report.at_train_accuracy), so under --sens-during needed that one is measured now
                crossed = [a for a in args.match_acc if max((h["train_acc"] for h in history), default=-1) < a
                           <= row["train_acc"]]
                if crossed and skipped is not None:  # its weights were kept for this: measured, then put back
                    now = {k: v.clone() for k, v in model.state_dict().items()}
                    model.load_state_dict(skipped)
                    history[-1].update(logged(measure_during(model, sens_images, args), head))
                    model.load_state_dict(now)
                skipped = None
                if args.sens_during == "every" or crossed or stop or step == num_steps:
                    sens = measure_during(model, sens_images, args)
                    row.update(logged(sens, head))
                else:  # not measured: kept in case the next evaluation crosses a --match-acc level
                    skipped = {k: v.detach().clone() for k, v in model.state_dict().items()}
                row["time"] = time.time() - t0
                results.log(run, row)  # metrics.json is rewritten now: Ctrl-C loses nothing measured
                said = f"sens {row['sens']:.4f} +- {row['sens_stderr']:.4f}" if "sens" in row else "sens not measured"
                print(f"{run} epoch {epoch:3d} | train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f} | "
                      f"test acc {row['test_acc']:.4f} | {said} | {row['time']:.0f}s")
            if step == num_steps or evaluating and stop:
                progress.end_early()  # the progress lines now say "final measurements"
                break
            perm = torch.randperm(len(x), generator=gen, device=device)  # a new order every epoch
            fwd.train()
        # the learning rate at this fraction of training (the schedule is a function of the fractional epoch)
        lr = lr_at(step // steps_per_epoch + i / steps_per_epoch, base_lr, args.schedule, num_steps / steps_per_epoch)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = perm[i * args.batch_size:(i + 1) * args.batch_size]  # this step's images: no DataLoader, no copy
        xb = augment_batch(x[idx], gen) if args.augment else x[idx]  # the whole batch: the generator stays in step
        # under torchrun every rank draws the same batch and trains on its slice of it
        mine = torch.arange(len(idx), device=device).tensor_split(world)[rank]
        with torch.autocast("cuda", torch.bfloat16, enabled=args.amp):  # bf16 for throughput only, never to measure
            loss = loss_fn(fwd, normalize(xb[mine]), y[idx][mine])  # uint8 -> [-1, 1] floats on the device
        opt.zero_grad(set_to_none=True)
        (loss * (len(mine) * world / len(idx))).backward()  # DDP averages over ranks: this makes it the batch mean
        opt.step()
    sens = final_sweep(model, sens_images, sens, args)
    results.final(run, final_record(row, stop, sens, results.data["runs"][str(run)]["history"], args, size))
    return model


def final_sweep(model, images, sens, args):
    """The final model under every --mask at every --sigma and the --sweep's, reusing what the last evaluation
    measured (sens), and the patch mask on flat and on object patches apart under --flat-patches.
    {(mask, sigma): Sensitivity}, by mask, then sigma."""
    sens = dict(sens)  # the caller's stays as it was
    sigmas = args.sigma + [s for s in SWEEP if s not in args.sigma] if args.sweep else args.sigma
    for mask in args.mask:
        todo = [s for s in sigmas if (mask, s) not in sens]
        sens.update(measure_sensitivity(model, images, patch=args.sens_patch, sigmas=todo, masks=[mask],
                                        seed=args.sens_seed, reps=args.reps, positions=args.sens_positions))
    if args.flat_patches is not None:  # at the first sigma
        sens.update(measure_sensitivity(model, images, patch=args.sens_patch, sigmas=args.sigma[:1],
                                        masks=["flat"], seed=args.sens_seed, reps=args.reps, flat=args.flat_patches))
    order = args.mask + ["flat", "object"]
    return dict(sorted(sens.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])))


def final_record(row, stop, sens, history, args, size):
    """A run's final record in metrics.json: its last evaluation (row), the end point it reached, every final
    sensitivity with its per-image values, the sensitivities at the --match-acc levels and the patch map."""
    final = {k: row[k] for k in ["sens", "sens_stderr", "train_acc", "test_acc", "train_loss", "test_loss", "epoch",
                                 "step"]}
    final["stopped"] = stop or "all epochs done"
    final["sens_at"] = {key(*k): {"sens": s.mean, "stderr": s.stderr} for k, s in sens.items()}
    # per image, for the paired differences between models (the same images and noise for every model and seed)
    final["per_image"] = {key(*k): [round(v, 6) for v in s.per_input.tolist()] for k, s in sens.items()}
    if args.match_acc:  # App. A.1: compare models at equal train accuracy, not at equal time
        keys = [f"sens@{key(*k)}" for k in sens if f"sens@{key(*k)}" in row]
        final["match_acc"] = report.at_train_accuracy(history, args.match_acc, keys)
    if "patch" in args.mask:  # where on the image the model is sensitive
        grid = size // args.sens_patch
        final["sens_map"] = sens["patch", args.sigma[0]].per_position.view(grid, grid).tolist()
    return final


# -----------------------------------------------------------------------------


def main(args):
    device = setup(args)
    data = prepare_data(args, device)  # before the run folder: a missing or corrupt dataset leaves nothing behind
    folder, results = start_run("vision", args, f"{args.dataset}-{'-'.join(args.model)}", device)
    results.data["data"] = {"n_train": len(data["train_x"]), "n_test": len(data["test_x"])}
    print(f"{args.dataset}: {len(data['train_x'])} train / {len(data['test_x'])} test images on {device}")
    try:
        with results.recording():  # Ctrl-C or SIGTERM: metrics kept, checkpoint written
            for name in args.model:
                for seed in args.seeds:
                    model = train(name=name, seed=seed, args=args, data=data, results=results, device=device)
                    if model is not None and args.save_model and results.write:  # for robustness.py --from-vision
                        torch.save(model.state_dict(), os.path.join(folder, f"{name}-seed{seed}.pt"))
            # every model against the first ViT: paired differences per image and seed, crossover sigmas
            results.data["paired"] = report.vision_paired(results.data)
            results.save()
            report.summary(results.data)
    finally:  # also after Ctrl-C: draw what there is (python report.py redraws it)
        if not args.no_figures and (paths := report.draw(results.data, folder)):
            print("wrote", *paths)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
