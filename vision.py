"""Do vision transformers learn lower-sensitivity functions than CNNs, ConvMixers and MLPs? (Sec. 5, App. A.1-A.3.)

Trains each --model on the same data with the same optimiser (SGD, as the paper) and measures, every few epochs, the
token-wise sensitivity on a fixed subset of the training set: Gaussian noise N(0, sigma^2) on one p x p patch of the
normalised image at a time, every patch in turn, the same patch grid for every architecture.

    python vision.py --model vit --sigma 0.1                       # CIFAR-10 (downloads it), the paper's headline
    python vision.py --dataset fashionmnist --data-dir DATA --model vit vit-simple mlp mlp-sigmoid cnn \\
        --lr cnn=0.05 mlp-sigmoid=1.0 vit-simple=0.1 --n-train 3000 --epochs 30 --depth 4 --heads 4 --dim-head 16 \\
        --sigma 0.1 1 --sweep --mask patch scattered --match-acc 0.8 0.85 0.9 --seeds 0   # the README's protocol
    python vision.py --dataset fake --model vit mlp --epochs 1 --n-train 200   # offline smoke test, seconds
    python vision.py --pretrained convnext_tiny vit_l_16 --imagenet-dir IMAGENET/train   # Sec. 5, no training
"""

import argparse
import math
import os
import time
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (all_sum, ArgumentParser, check_args, cli, gaussian, load_results, merge_results, model_of,
                    not_finite, patchify, plot_curves, pm, predict, pyplot, ranks, restore, resumed_args, save_combined,
                    save_figure, seed_all, sensitivity, setup, start_run, subset_size, summarise, unpatchify)
from common import paired_differences as common_paired

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


def base_parser():
    """The flags vision.py shares with robustness.py, which builds its parser on this one (argparse parents)."""
    p = ArgumentParser(add_help=False)
    # model
    p.add_argument("--model", nargs="+", default=["vit"], help=f"one or more of {MODELS}, trained in turn")
    p.add_argument("--depth", type=int, default=8, help="transformer blocks (ViTs) / mixer layers (ConvMixer)")
    p.add_argument("--heads", type=int, default=32, help="attention heads (ViTs) [author code: 32]")
    p.add_argument("--dim", type=int, default=64, help="token width (ViTs, ConvMixer) [author code: 64]")
    p.add_argument("--dim-head", type=int, default=64, help="width of one attention head (ViTs)")
    p.add_argument("--mlp-dim", type=int, default=512, help="hidden width of the transformer MLP [author code]")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout of ViT-small [author code: 0.1]")
    p.add_argument("--patch-size", type=int, default=None,
                   help="ViT/ConvMixer patch size; default 4 (CIFAR-10 [author code], and the paper's one size for the "
                   "other sets, so Fashion-MNIST too), 7 for MNIST 0 vs 1 (our choice)")
    p.add_argument("--no-patch-norm", action="store_true", help="ViTs without the LayerNorm on each raw patch "
                   "(both reference ViTs have it; it turns any noise on a blank patch into a full-size token change)")
    p.add_argument("--mlp-hidden", type=int, nargs="+", default=[512, 128],
                   help="hidden widths of the MLPs [author code: 784-512-128-10]")
    p.add_argument("--spt-shift", type=str, default="1", choices=["1", "half"], help="ViT-small's shifted patches: "
                   "one pixel in four directions [author code], or half a patch diagonally [Lee et al.]")
    # data
    p.add_argument("--dataset", type=str, default="cifar10", choices=list(DATASETS))
    p.add_argument("--data-dir", type=str, default="data", help="where the dataset files are (or are downloaded to)")
    p.add_argument("--n-train", type=int, default=None, help="train on a random subset of this many training images "
                   "(default: all)")
    p.add_argument("--n-test", type=int, default=None, help="test on the first this many test images (default: all)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the training subset (fixed across --seeds)")
    p.add_argument("--augment", action="store_true", help="random crops (pad 4) and flips (32x32 sets only)")
    # optimisation
    p.add_argument("--optimizer", type=str, default="sgd", choices=["sgd", "adam"], help="paper: SGD (Fig. 14: Adam)")
    p.add_argument("--lr", nargs="+", default=[], help="learning rate for all models (0.05) or per model "
                   "(cnn=0.05 vit=0.1); models not named keep the paper's rate for them (LR below)")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum [author code: none]")
    p.add_argument("--weight-decay", type=float, default=0.0, help="weight decay [author code: none]")
    p.add_argument("--schedule", type=str, default="constant", choices=["constant", "step", "cosine"],
                   help="lr schedule: constant, step (x0.5 every 8 epochs, the authors'), cosine to 0")
    p.add_argument("--epochs", type=int, default=50, help="training epochs [author code: 50]")
    p.add_argument("--steps", type=int, default=None, help="train for this many SGD steps instead of --epochs (the "
                   "last epoch may be partial): the same number of updates whatever --n-train")
    p.add_argument("--batch-size", type=int, default=100, help="images per step (paper: 100, MNIST 50)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="initialisation/order seeds")
    # sensitivity
    p.add_argument("--sigma", type=float, nargs="+", default=[0.1], help="noise std(s) on normalised pixels measured "
                   "during training; the first is the headline [author code: 0.1]")
    p.add_argument("--sweep", action="store_true", help=f"also measure every final model at sigma in {SWEEP} (Fig. 17)")
    p.add_argument("--mask", nargs="+", default=["patch"], choices=["patch", "scattered", "global"],
                   help="patch: N(0, sigma^2) on one patch of the grid at a time (Def. 4.1); scattered: on p^2 random "
                   "pixels shared by a batch of 100 (the authors' released estimator, not the paper's definition); "
                   "global: on the whole image at once with std sigma/sqrt(T), the same energy (App. A.2)")
    p.add_argument("--sens-patch", type=int, default=None, help="patch grid of the sensitivity; default: --patch-size")
    p.add_argument("--sens-seed", type=int, default=0, help="seed of the noise: every model and --seeds sees the same "
                   "perturbations of the same images, so differences between models are paired")
    p.add_argument("--reps", type=int, default=1, help="noise draws per (image, patch)")
    p.add_argument("--sens-positions", type=int, default=None,
                   help="sample this many patches per image and draw instead of every patch (large images)")
    p.add_argument("--n-sens", type=int, default=500, help="training images the sensitivity is measured on")
    p.add_argument("--eval-every", type=int, default=5, help="epochs between evaluations (and at the end) "
                   "[author code: 5]")
    p.add_argument("--match-acc", type=float, nargs="+", default=[], help="read each run's sensitivity where its "
                   "train accuracy first crosses these levels (interpolated between evaluations; App. A.1)")
    # system
    p.add_argument("--device", type=str, default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of this process (0: one; see README)")
    p.add_argument("--amp", action="store_true", help="bf16 autocast for training (CUDA only); the sensitivity is "
                   "measured in float32")
    p.add_argument("--compile", action="store_true", help="torch.compile the models")
    p.add_argument("--out-dir", type=str, default="out", help="results go to <out-dir>/<script>/<run-name>/")
    p.add_argument("--run-name", type=str, default=None, help="default: <dataset>-<models>")
    p.add_argument("--save-model", action="store_true", help="save each final model to <run>/<model>-seed<k>.pt")
    p.add_argument("--save-every", type=int, default=0, help="write the training state to <run>/checkpoint.pt every "
                   "this many epochs (0: only when Ctrl-C stops the run)")
    p.add_argument("--resume", type=str, default=None, help="continue the stopped run in this run folder from its "
                   "checkpoint.pt, with the flags it was started with (only --threads and --device come from here)")
    p.add_argument("--plot", type=str, nargs="+", default=None, help="only redraw the figures of this run folder; "
                   "several folders (seeds run apart, or --n-train sizes) are combined into a new one")
    return p


def check_arguments(p, args):
    """Validation of base_parser()'s flags (one-line errors naming the flag); fills in the patch-size defaults."""
    bad = [m for m in args.model if m not in MODELS]
    if bad:
        p.error(f"unknown model {bad[0]!r}; choose from {', '.join(MODELS)}")
    check_args(p, args, positive=["epochs", "steps", "batch_size", "reps", "n_sens", "eval_every", "depth", "heads",
                                  "dim", "dim_head", "mlp_dim", "mlp_hidden", "n_train", "n_test", "sens_positions",
                                  "patch_size", "sens_patch"],
               nonnegative=["sigma", "momentum", "weight_decay", "dropout", "seeds", "data_seed", "sens_seed",
                            "threads", "save_every"])
    if any(not 0 < a <= 1 for a in args.match_acc):
        p.error(f"--match-acc levels are train accuracies in (0, 1], got {args.match_acc}")
    if args.dropout >= 1:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    try:
        args.lr = parse_lrs(args.lr, args.model)
    except ValueError as e:
        p.error(str(e))
    channels, size, _, _ = DATASETS[args.dataset]
    args.patch_size = args.patch_size or (7 if args.dataset == "mnist01" else 4)
    args.sens_patch = args.sens_patch or args.patch_size
    for name in ["patch_size", "sens_patch"]:
        if size % getattr(args, name):
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)} does not divide the {size}x{size} images")
    if args.amp and not (args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())):
        p.error("--amp (bf16 autocast) needs a CUDA device")
    for folder in args.plot or []:
        if not os.path.exists(folder):
            p.error(f"--plot {folder}: no such run folder or metrics.json")
    if args.resume and not os.path.isfile(os.path.join(args.resume, "metrics.json")):
        p.error(f"--resume {args.resume}: no metrics.json there to continue")


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       parents=[base_parser()])
    # pretrained (Sec. 5, ImageNet): no training
    p.add_argument("--pretrained", nargs="+", default=None, choices=["convnext_tiny", "vit_l_16"],
                   help="measure torchvision's ImageNet models on --imagenet-dir instead of training")
    p.add_argument("--imagenet-dir", type=str, default=None, help="an ImageFolder of images (e.g. ImageNet train)")
    p.add_argument("--random-weights", action="store_true", help="--pretrained without downloading weights (tests)")
    args = p.parse_args(argv)
    check_arguments(p, args)
    if args.pretrained and not args.imagenet_dir:
        p.error("--pretrained needs --imagenet-dir (an ImageFolder of images)")
    if args.imagenet_dir and not os.path.isdir(args.imagenet_dir):
        p.error(f"--imagenet-dir {args.imagenet_dir}: no such folder")
    return args


# -----------------------------------------------------------------------------
# data: each dataset lives on the device as uint8, normalised and augmented in batches (no DataLoader)


def load_dataset(name, data_dir, device):
    """{'train_x', 'test_x'} uint8 (N, C, H, W) and {'train_y', 'test_y'} int64, on the device. Missing files are
    downloaded by torchvision; offline, a FileNotFoundError names the files to provide, and a file that is present
    but corrupt gets a ValueError naming it."""
    channels, size, classes, files = DATASETS[name]
    if name.startswith("fake"):  # random images of the right shape, for tests and smoke runs
        g = torch.Generator().manual_seed(0)
        data = {f"{s}_x": torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8)
                for s, n in [("train", 1000), ("test", 200)]}
        data.update({f"{s}_y": torch.randint(0, classes, (n,), generator=g) for s, n in [("train", 1000),
                                                                                         ("test", 200)]})
        return {k: v.to(device) for k, v in data.items()}
    import torchvision.datasets as tvd

    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise ValueError(f"--data-dir {data_dir} is a file, not a folder")
    cls = {"cifar10": tvd.CIFAR10, "svhn": tvd.SVHN, "fashionmnist": tvd.FashionMNIST, "mnist01": tvd.MNIST}[name]
    data = {}
    for split, train in [("train", True), ("test", False)]:
        kw = {"split": "train" if train else "test"} if name == "svhn" else {"train": train}
        try:
            ds = cls(root=data_dir, download=True, **kw)
        except Exception as e:  # offline, or a corrupt file: one clear message instead of a traceback
            bad = corrupt_file(cls, data_dir)
            if bad:
                raise ValueError(f"{bad[0]} is present but unreadable: {bad[1]}. Replace it with a good copy, or "
                                 "delete it (torchvision then extracts or downloads it again)") from None
            raise FileNotFoundError(f"cannot load {name} from {os.path.abspath(data_dir)} ({type(e).__name__}: "
                                    f"{str(e).splitlines()[0] if str(e) else ''}). Without a network, put {files} "
                                    "under that folder (or pass --data-dir), and torchvision will use them") from None
        x = torch.as_tensor(ds.data)
        x = x.permute(0, 3, 1, 2) if x.ndim == 4 and x.shape[-1] == 3 else x  # CIFAR is NHWC
        x = x[:, None] if x.ndim == 3 else x  # MNIST-like: add the channel
        y = torch.as_tensor(ds.labels if name == "svhn" else ds.targets).long()
        if name == "mnist01":
            keep = y <= 1
            x, y = x[keep], y[keep]
        data[f"{split}_x"], data[f"{split}_y"] = x.contiguous().to(device), y.to(device)
    return data


def corrupt_file(cls, root):
    """(path, problem) of the first file of a torchvision dataset that is present but damaged, else None: a wrong
    MD5 checksum (truncated or altered download), or an extracted MNIST-format file that cannot be parsed."""
    from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor
    from torchvision.datasets.utils import check_integrity

    if hasattr(cls, "resources"):  # MNIST, Fashion-MNIST: raw/<file>.gz and the extracted raw/<file>
        raw = os.path.join(root, cls.__name__, "raw")
        checks = [(os.path.join(raw, f), md5) for f, md5 in cls.resources]
        for gz, _ in checks:
            plain = gz[:-3]
            if os.path.exists(plain):
                try:
                    read_sn3_pascalvincent_tensor(plain)
                except Exception as e:
                    return plain, "not a complete IDX file" + (f" ({e})" if str(e) else "")
    elif hasattr(cls, "split_list"):  # SVHN
        checks = [(os.path.join(root, f), md5) for _, f, md5 in cls.split_list.values()]
    else:  # CIFAR-10
        folder = os.path.join(root, cls.base_folder)
        checks = [(os.path.join(root, cls.filename), cls.tgz_md5)]
        checks += [(os.path.join(folder, f), md5) for f, md5 in cls.train_list + cls.test_list]
    for path, md5 in checks:
        if os.path.exists(path) and not check_integrity(path, md5):
            return path, "its MD5 checksum is not the published one (a truncated or altered file)"
    return None


def prepare_data(args, device):
    """The dataset on the device, cut to what the flags select: a random --n-train subset of the training images
    drawn with --data-seed (the same for every --seeds), the first --n-test test images. Sizes larger than the data
    are a ValueError that says how many there are; so is an --n-sens larger than the training subset."""
    data = load_dataset(args.dataset, args.data_dir, device)
    n_train = subset_size("--n-train", args.n_train, len(data["train_x"]), f"{args.dataset} training images")
    n_test = subset_size("--n-test", args.n_test, len(data["test_x"]), f"{args.dataset} test images")
    subset_size("--n-sens", args.n_sens, n_train, "training images (--n-train) to measure on")
    g = torch.Generator().manual_seed(args.data_seed)
    keep = torch.randperm(len(data["train_x"]), generator=g)[:n_train].to(device)
    data["train_x"], data["train_y"] = data["train_x"][keep], data["train_y"][keep]
    data["test_x"], data["test_y"] = data["test_x"][:n_test], data["test_y"][:n_test]
    return data


def normalize(x):
    """uint8 images -> floats in [-1, 1]: (x/255 - 0.5) / 0.5, the authors' Normalize((0.5,), (0.5,))."""
    return x.float().div_(127.5).sub_(1.0)


def augment_batch(x, generator):
    """Random crop (zero-pad 4) and horizontal flip of a uint8 batch, as batched tensor ops."""
    B, _, H, W = x.shape
    flip = torch.rand(B, generator=generator, device=x.device) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    padded = F.pad(x, (4, 4, 4, 4))
    dy, dx = (torch.randint(0, 9, (2, B), generator=generator, device=x.device))
    rows = (dy[:, None] + torch.arange(H, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(W, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    return padded[torch.arange(B, device=x.device)[:, None, None, None], torch.arange(x.shape[1],
                  device=x.device)[None, :, None, None], rows, cols]


# -----------------------------------------------------------------------------
# models: ViT-small (SPT + LSA), ViT-simple, ResNet-18, DenseNet-121, ConvMixer, MLP, CNN


class FeedForward(nn.Module):
    def __init__(self, dim, hidden, dropout):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    """Multi-head self-attention, pre-norm. lsa=True is Locality Self-Attention (Lee et al. 2021): a learned
    temperature in place of 1/sqrt(d_head), and no token attends to itself (the diagonal is masked)."""

    def __init__(self, dim, heads, dim_head, dropout, lsa=False):
        super().__init__()
        self.heads, self.dropout, self.lsa = heads, dropout, lsa
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout))
        self.log_temperature = nn.Parameter(torch.tensor(math.log(dim_head**-0.5))) if lsa else None

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        mask, scale = None, None
        if self.lsa:
            mask = ~torch.eye(T, dtype=torch.bool, device=x.device)  # True = may attend
            q = q * self.log_temperature.exp()  # the learned scale
            scale = 1.0
        # softmax(q k^T * scale + mask) v, fused; the explicit form runs 2x slower on a CPU
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout, lsa=False):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleList([Attention(dim, heads, dim_head, dropout, lsa),
                                                    FeedForward(dim, mlp_dim, dropout)]) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        for attn, ff in self.layers:
            x = x + attn(x)
            x = x + ff(x)
        return self.norm(x)


class ShiftedPatchTokenization(nn.Module):
    """SPT (Lee et al. 2021): the image and four shifted copies, stacked on the channels, cut into patches,
    layer-normalised (patch_norm=False: not) and projected, so each token sees a little beyond its own patch.
    shift='1': one pixel left, right, up and down (the authors' vit_small.py, from vit-pytorch); shift='half': half a
    patch along the four diagonals (Lee et al.'s paper)."""

    def __init__(self, channels, patch, dim, patch_norm=True, shift="1"):
        super().__init__()
        self.patch = patch
        s = patch // 2 if shift == "half" else 1
        # F.pad amounts (left, right, top, bottom); a negative amount crops, so each pad moves the image
        self.shifts = ([(s, -s, s, -s), (-s, s, s, -s), (s, -s, -s, s), (-s, s, -s, s)] if shift == "half"
                       else [(s, -s, 0, 0), (-s, s, 0, 0), (0, 0, s, -s), (0, 0, -s, s)])
        self.norm = nn.LayerNorm(5 * channels * patch * patch) if patch_norm else nn.Identity()
        self.proj = nn.Linear(5 * channels * patch * patch, dim)

    def forward(self, img):
        x = torch.cat([img] + [F.pad(img, pad) for pad in self.shifts], dim=1)  # (B, 5C, H, W)
        return self.proj(self.norm(patchify(x, self.patch)))  # (B, T, dim)


class ViT(nn.Module):
    """ViT-small of Lee et al. (2021): SPT tokens, a class token, learned positions, LSA blocks, head on the class."""

    def __init__(self, *, image, channels, patch, classes, dim, depth, heads, dim_head, mlp_dim, dropout,
                 patch_norm=True, spt_shift="1"):
        super().__init__()
        self.tokens = ShiftedPatchTokenization(channels, patch, dim, patch_norm, spt_shift)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim))
        self.drop = nn.Dropout(dropout)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, lsa=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, img):
        x = self.tokens(img)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos
        return self.head(self.transformer(self.drop(x))[:, 0])


def sincos_2d(h, w, dim, temperature=10000.0):
    """Fixed 2-D sine-cosine position embedding (h*w, dim) of Beyer et al. (2022)."""
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4) / (dim // 4 - 1))
    y, x = y.flatten()[:, None] * omega, x.flatten()[:, None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


class SimpleViT(nn.Module):
    """ViT-simple of Beyer et al. (2022): plain patches, fixed sin-cos positions, no dropout, mean pooling."""

    def __init__(self, *, image, channels, patch, classes, dim, depth, heads, dim_head, mlp_dim, patch_norm=True):
        super().__init__()
        self.patch = patch
        patch_dim = channels * patch * patch
        self.embed = nn.Sequential(nn.LayerNorm(patch_dim) if patch_norm else nn.Identity(), nn.Linear(patch_dim, dim),
                                   nn.LayerNorm(dim))
        self.register_buffer("pos", sincos_2d(image // patch, image // patch, dim))
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout=0.0)
        self.head = nn.Linear(dim, classes)

    def forward(self, img):
        x = self.embed(patchify(img, self.patch)) + self.pos
        return self.head(self.transformer(x).mean(1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18: 3x3 stem at stride 1, no max-pool, four stages of two basic blocks."""

    def __init__(self, *, channels, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class DenseLayer(nn.Module):
    def __init__(self, cin, growth):
        super().__init__()
        self.net = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                 nn.BatchNorm2d(4 * growth), nn.ReLU(), nn.Conv2d(4 * growth, growth, 3, 1, 1,
                                                                                   bias=False))

    def forward(self, x):
        return torch.cat([x, self.net(x)], dim=1)  # each layer adds `growth` channels


class DenseNet121(nn.Module):
    """CIFAR DenseNet-121: growth 32, blocks (6, 12, 24, 16), bottlenecks, transitions halving the channels."""

    def __init__(self, *, channels, classes, growth=32, blocks=(6, 12, 24, 16)):
        super().__init__()
        c = 2 * growth
        layers = [nn.Conv2d(channels, c, 3, 1, 1, bias=False)]
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, growth))
                c += growth
            if i < len(blocks) - 1:  # transition: compress by 2, downsample by 2
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        self.features = nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU())
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class ConvMixer(nn.Module):
    """ConvMixer (Trockman & Kolter 2022): patch embedding, then depthwise (spatial) + pointwise (channel) convs."""

    def __init__(self, *, channels, classes, dim, depth, kernel=3, patch=4):
        super().__init__()
        self.embed = nn.Sequential(nn.Conv2d(channels, dim, patch, stride=patch), nn.GELU(), nn.BatchNorm2d(dim))
        self.spatial = nn.ModuleList([nn.Sequential(nn.Conv2d(dim, dim, kernel, groups=dim, padding="same"),
                                                    nn.GELU(), nn.BatchNorm2d(dim)) for _ in range(depth)])
        self.channel = nn.ModuleList([nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim))
                                      for _ in range(depth)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x)
        for spatial, channel in zip(self.spatial, self.channel):
            x = channel(x + spatial(x))  # residual around the depthwise conv only
        return self.head(x.mean((2, 3)))


class MLP(nn.Module):
    def __init__(self, *, inputs, hidden, classes, activation):
        super().__init__()
        act = {"leakyrelu": nn.LeakyReLU, "sigmoid": nn.Sigmoid}[activation]
        layers, width = [nn.Flatten()], inputs
        for h in hidden:
            layers += [nn.Linear(width, h), act()]
            width = h
        self.net = nn.Sequential(*layers, nn.Linear(width, classes))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    """The small Fashion-MNIST CNN: two 3x3 convs (32 channels), a 2x2 max-pool, a 128-unit layer, LeakyReLU after
    each (the paper's text; the authors' ConvNeuralNet has none after the second conv)."""

    def __init__(self, *, channels, size, classes):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.LeakyReLU(), nn.Conv2d(32, 32, 3, padding=1),
                                 nn.LeakyReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * (size // 2) ** 2, 128),
                                 nn.LeakyReLU(), nn.Linear(128, classes))

    def forward(self, x):
        return self.net(x)


def build_model(name, args, channels, size, classes):
    vit_kw = dict(image=size, channels=channels, patch=args.patch_size, classes=classes, dim=args.dim, depth=args.depth,
                  heads=args.heads, dim_head=args.dim_head, mlp_dim=args.mlp_dim, patch_norm=not args.no_patch_norm)
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
        activation = "sigmoid" if name == "mlp-sigmoid" else "leakyrelu"
        return MLP(inputs=channels * size * size, hidden=args.mlp_hidden, classes=classes, activation=activation)
    elif name == "cnn":
        return CNN(channels=channels, size=size, classes=classes)
    raise ValueError(f"unknown model {name!r}")


def parse_lrs(values, models):
    """['0.05'] -> {every model: 0.05}; ['cnn=0.05', 'vit=0.1'] -> per model. A ValueError says what is wrong."""
    out = {}
    for v in values:
        name, _, lr = v.rpartition("=")
        for m in [name] if name else models:
            if m not in MODELS:
                raise ValueError(f"--lr {v}: unknown model {m!r}")
            try:
                out[m] = float(lr)
            except ValueError:
                raise ValueError(f"--lr {v}: {lr!r} is not a number") from None
            if not 0 < out[m] < math.inf:
                raise ValueError(f"--lr {v}: the learning rate must be a finite number > 0")
    return out


def default_lr(model, dataset):
    if dataset == "mnist01":
        return LR_MNIST01
    return LR[model]


# -----------------------------------------------------------------------------
# metrics


@torch.no_grad()
def evaluate(model, x, y):
    """(mean cross-entropy, accuracy) of the model in eval mode on uint8 images x, in float32 (also under --amp).
    Under torchrun each rank takes a slice of the images and the sums are added up."""
    model.eval()
    rank, world = ranks()
    part = torch.arange(len(x), device=x.device).tensor_split(world)[rank]
    batch_size = 2048 if x.device.type == "cuda" else 256  # a CPU runs a small ViT 1.5x faster at 256 than 1000
    loss = correct = 0.0
    for idx in part.split(batch_size):
        out = model(normalize(x[idx])).float()
        loss += F.cross_entropy(out, y[idx], reduction="sum").item()
        correct += (out.argmax(1) == y[idx]).sum().item()
    loss, correct = all_sum(loss, correct)
    return loss / len(x), correct / len(x)


def measure_sensitivity(model, images, patch, sigmas, masks, seed, reps=1, positions=None):
    """{f"{mask}:{sigma:g}": Sensitivity} of the model on normalised images (N, C, H, W), in float32, for each mask
    (see --mask) and sigma. The noise depends on `seed` alone, so models measured with the same seed see identical
    perturbations of the same images (paired comparisons)."""
    model.eval()
    shape = images.shape[1:]

    def f(xb, idx):  # the estimator hands (B, T, D) patch tokens; the model sees whole images
        return model(unpatchify(xb, patch, shape)).float()

    def g(xb, idx):  # one "token" = the whole image
        return model(xb.view(-1, *shape)).float()

    out = {}
    tokens = patchify(images, patch)
    T = tokens.shape[1]
    for sigma in sigmas:
        if "patch" in masks:
            out[f"patch:{sigma:g}"] = sensitivity(f, tokens, gaussian(sigma), reps=reps, positions=positions, seed=seed)
        if "scattered" in masks:
            out[f"scattered:{sigma:g}"] = scattered_sensitivity(model, images, patch, sigma, T * reps, seed)
        if "global" in masks:
            out[f"global:{sigma:g}"] = sensitivity(g, images.flatten(1)[:, None], gaussian(sigma / math.sqrt(T)),
                                                   reps=reps, seed=seed)
    return out


def scattered_copies(images, p, sigma, draws, generator):
    """`draws` noisy copies of a batch, draw-major: copy d * B + b is image b with N(0, sigma^2) noise on every
    channel of the pixels of mask d, shared by the batch, which p^2 (row, column) pairs drawn with replacement
    switch on (the authors' mask; a repeated pair makes it fewer pixels). Returns (copies, masks (draws, H, W))."""
    B, C, H, W = images.shape
    rows = torch.randint(H, (draws, p * p), generator=generator, device=images.device)
    cols = torch.randint(W, (draws, p * p), generator=generator, device=images.device)
    masks = torch.zeros(draws, H * W, dtype=torch.bool, device=images.device)
    masks.scatter_(1, rows * W + cols, True)
    masks = masks.view(draws, 1, 1, H, W)
    noise = sigma * torch.randn((draws, B, C, H, W), generator=generator, device=images.device)
    return (images + noise * masks).view(draws * B, C, H, W), masks.view(draws, H, W)


@torch.no_grad()
def scattered_sensitivity(model, images, p, sigma, draws, seed, batch=100):
    """The estimator of the authors' released code, for comparison (not the paper's definition): per batch of 100
    images, `draws` masks of p^2 scattered pixels, each shared by the batch. Same number of evaluations as the patch
    mask when draws = T * reps. Returns a Sensitivity (per_position: the one overall rate)."""
    gen = torch.Generator(images.device).manual_seed(seed)
    per_call = max(1, 2048 // batch)  # draws per forward pass
    flips = torch.zeros(len(images), dtype=torch.long, device=images.device)
    for i in range(0, len(images), batch):
        xb = images[i:i + batch]
        clean = predict(model(xb), len(xb))
        for d in range(0, draws, per_call):
            n = min(per_call, draws - d)
            out = model(scattered_copies(xb, p, sigma, n, gen)[0]).float()
            if not_finite(out):
                raise ValueError("the model returned non-finite outputs on perturbed copies")
            flips[i:i + batch] += (predict(out, n * len(xb)).view(n, len(xb)) != clean).sum(0)
    return summarise(flips[:, None], torch.full_like(flips[:, None], draws), len(images) * draws)


# -----------------------------------------------------------------------------
# summaries across runs: paired differences, crossover sigmas, sensitivity at matched train accuracy


def paired_differences(runs):
    """common.paired_differences against the first ViT (else the first model), plus, for every other model, the
    crossover sigmas where the seed-mean curves of the two models cross."""
    finals = {run: r["final"] for run, r in runs.items() if r["final"].get("per_image")}
    models = list(dict.fromkeys(model_of(run) for run in finals))
    if len(models) < 2:
        return {}
    out = common_paired(runs, next((m for m in models if m.startswith("vit")), models[0]))
    for m, p in out["models"].items():
        p["crossover"] = crossovers(finals, m, out["reference"])
    return out


def crossovers(finals, model, ref):
    """{mask: [sigma, ...]} where the seed-mean sensitivity of `model` and `ref` are level, interpolated on log
    sigma between the measured sigmas; [] when one stays above the other."""
    def curve(name, mask):
        rows = [{float(k.split(":")[1]): v["sens"] for k, v in f["sens_at"].items() if k.startswith(mask + ":")}
                for run, f in finals.items() if model_of(run) == name]
        sigmas = sorted(set.intersection(*(set(r) for r in rows))) if rows else []
        return {s: sum(r[s] for r in rows) / len(rows) for s in sigmas}

    out = {}
    for mask in {k.split(":")[0] for f in finals.values() for k in f["sens_at"]}:
        a, b = curve(model, mask), curve(ref, mask)
        sigmas = [s for s in a if s in b]
        d = [a[s] - b[s] for s in sigmas]
        out[mask] = [math.exp(math.log(s0) + d0 / (d0 - d1) * (math.log(s1) - math.log(s0)))
                     for s0, s1, d0, d1 in zip(sigmas, sigmas[1:], d, d[1:]) if d0 * d1 < 0 or (d1 == 0 != d0)]
    return out


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
        w = 1.0 if i == 0 or hi["train_acc"] == lo["train_acc"] else \
            (level - lo["train_acc"]) / (hi["train_acc"] - lo["train_acc"])
        out[f"{level:g}"] = {k: lo[k] + w * (hi[k] - lo[k]) for k in ["epoch"] + keys}
    return out


# -----------------------------------------------------------------------------
# training


def lr_at(epoch, base, schedule, epochs):
    """Learning rate during (fractional) epoch `epoch`."""
    if schedule == "step":
        return base * 0.5 ** (int(epoch) // 8)  # the authors' StepLR(step_size=8, gamma=0.5)
    if schedule == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
    return base


def cross_entropy(model, images, labels):
    return F.cross_entropy(model(images).float(), labels)


def train_epoch(model, opt, x, y, *, batch_size, gen, lr_fn=None, augment=False, amp=False, loss_fn=cross_entropy,
                max_steps=None):
    """One pass over uint8 images x in a random order (or its first max_steps batches): batches are indexed,
    (augmented,) normalised and fed on the device. lr_fn(fraction of the epoch done) sets the learning rate;
    loss_fn(model, images, labels) the objective. Under torchrun (model wrapped in DDP) every rank draws the same
    order and augmentation, takes its slice of each batch, and weights its loss by its share, so that the averaged
    gradient is the single-process one. Returns the last batch's loss (one host sync per epoch)."""
    model.train()
    rank, world = ranks()
    perm = torch.randperm(len(x), generator=gen, device=x.device)
    steps = math.ceil(len(x) / batch_size)
    for i in range(min(steps, max_steps or steps)):
        if lr_fn is not None:
            for group in opt.param_groups:
                group["lr"] = lr_fn(i / steps)
        idx = perm[i * batch_size:(i + 1) * batch_size]
        xb = augment_batch(x[idx], gen) if augment else x[idx]  # the whole batch: the generator stays in step
        mine = torch.arange(len(idx), device=x.device).tensor_split(world)[rank]  # this rank's slice of the batch
        with torch.autocast("cuda", torch.bfloat16, enabled=amp):
            loss = loss_fn(model, normalize(xb[mine]), y[idx][mine])
        opt.zero_grad(set_to_none=True)
        (loss * (len(mine) * world / len(idx))).backward()  # DDP averages over ranks: the batch mean
        opt.step()
    return all_sum(loss.item())[0] / world


def make_optimizer(name, model, args):
    """SGD (the paper's, plain unless --momentum / --weight-decay) or Adam, at the model's learning rate."""
    lr = args.lr.get(name) or default_lr(name, args.dataset)
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
    return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=args.weight_decay)


def for_training(model, device, compile_model):
    """The module training runs through: under torchrun wrapped in DDP (BatchNorm synchronised on GPUs: PyTorch's
    SyncBatchNorm runs on GPUs only, so on a CPU each rank keeps its own batch statistics), and/or compiled."""
    if ranks()[1] > 1:
        if device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    return torch.compile(model) if compile_model else model


def train_one(name, seed, args, data, shape, results, device, folder, run=None, loss_fn=cross_entropy,
              generators=()):
    """Train one model, evaluating it every --eval-every epochs and at the end; run names it in metrics.json (default
    <model>/seed<k>), loss_fn(model, images, labels) is the objective (robustness.py passes its variants, and the
    generators they draw from, which a checkpoint keeps). Returns the model, or None if its loss diverged (metrics.json
    then marks the run) or if a resumed run had already finished."""
    channels, size, classes = shape
    run = run or f"{name}/seed{seed}"
    if results.finished(run):
        return None
    seed_all(seed)
    model = build_model(name, args, channels, size, classes).to(device)
    print(f"{run}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    opt = make_optimizer(name, model, args)
    lr = opt.param_groups[0]["lr"]
    gen = torch.Generator(device).manual_seed(seed)
    generators = [gen, *generators]
    start = 0
    if snap := results.resume(run, "epoch"):
        start = restore(snap, model, opt, generators)
        print(f"{run}: resumed after epoch {start}")
    fwd = for_training(model, device, args.compile)
    measured = model if ranks()[1] > 1 else fwd  # evaluation and sensitivity: sharded by hand, not through DDP
    x, y = data["train_x"], data["train_y"]
    sens_images = normalize(x[: args.n_sens])  # a fixed subset of the (already shuffled) training set
    steps_per_epoch = math.ceil(len(x) / args.batch_size)
    num_steps = args.steps or args.epochs * steps_per_epoch
    epochs = math.ceil(num_steps / steps_per_epoch)  # the last one partial when --steps is not a whole epoch
    head = f"{args.mask[0]}:{args.sigma[0]:g}"
    t0 = time.time()
    for epoch in range(start, epochs + 1):
        step = min(epoch * steps_per_epoch, num_steps)
        evaluating = epoch % args.eval_every == 0 or epoch == epochs
        results.checkpoint(run, epoch, evaluating, args.save_every, model, opt, generators)  # for --resume
        if evaluating:
            row = {"epoch": epoch, "step": step}
            row["train_loss"], row["train_acc"] = evaluate(measured, x, y)
            if results.diverged(run, epoch, row["train_loss"], "epoch"):
                return None
            row["test_loss"], row["test_acc"] = evaluate(measured, data["test_x"], data["test_y"])
            sens = measure_sensitivity(measured, sens_images, args.sens_patch, args.sigma, args.mask[:1],
                                       args.sens_seed, args.reps, args.sens_positions)
            for key, s in sens.items():
                row[f"sens@{key}"], row[f"sens_stderr@{key}"] = s.mean, s.stderr
            row["sens"], row["sens_stderr"] = sens[head].mean, sens[head].stderr
            row["time"] = time.time() - t0
            results.log(run, row)
            print(f"{run} epoch {epoch:3d} | train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f} | "
                  f"test acc {row['test_acc']:.4f} | sens {row['sens']:.4f} +- {row['sens_stderr']:.4f} | "
                  f"{row['time']:.0f}s")
        if epoch == epochs:
            break
        loss = train_epoch(fwd, opt, x, y, batch_size=args.batch_size, gen=gen, augment=args.augment, amp=args.amp,
                           lr_fn=lambda frac, e=epoch: lr_at(e + frac, lr, args.schedule, num_steps / steps_per_epoch),
                           loss_fn=loss_fn, max_steps=num_steps - step)
        if results.diverged(run, epoch + 1, loss, "epoch"):
            return None
    # the final model under every mask and, with --sweep, at every sigma of the sweep; what the last evaluation
    # measured is the same noise on the same model, so it is reused
    sigmas = args.sigma + [s for s in SWEEP if s not in args.sigma] if args.sweep else args.sigma
    for mask in args.mask:
        todo = [s for s in sigmas if f"{mask}:{s:g}" not in sens]
        sens.update(measure_sensitivity(measured, sens_images, args.sens_patch, todo, [mask], args.sens_seed,
                                        args.reps, args.sens_positions))
    sens = dict(sorted(sens.items(), key=lambda kv: (args.mask.index(kv[0].split(":")[0]), float(kv[0].split(":")[1]))))
    final = {k: row[k] for k in ["sens", "sens_stderr", "train_acc", "test_acc", "train_loss", "test_loss", "epoch",
                                 "step"]}
    final["sens_at"] = {k: {"sens": s.mean, "stderr": s.stderr} for k, s in sens.items()}
    final["per_image"] = {k: [round(v, 6) for v in s.per_input.tolist()] for k, s in sens.items()}
    if args.match_acc:
        keys = [f"sens@{k}" for k in sens if f"sens@{k}" in row]
        final["match_acc"] = at_train_accuracy(results.data["runs"][run]["history"], args.match_acc, keys)
    if "patch" in args.mask:
        grid = size // args.sens_patch
        final["sens_map"] = sens[f"patch:{args.sigma[0]:g}"].per_position.view(grid, grid).tolist()
    results.final(run, final)
    if args.save_model and results.write:
        torch.save(model.state_dict(), os.path.join(folder, f"{name}-seed{seed}.pt"))
    return model


# -----------------------------------------------------------------------------
# pretrained ImageNet models (Sec. 5): no training


def pretrained_run(args, results, device):
    import torchvision
    from torchvision import transforms

    tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    try:
        ds = torchvision.datasets.ImageFolder(args.imagenet_dir, transform=tf)
    except (FileNotFoundError, OSError) as e:
        raise FileNotFoundError(f"cannot read images from --imagenet-dir {args.imagenet_dir}: {e}") from None
    n = subset_size("--n-sens", args.n_sens, len(ds), f"images in {args.imagenet_dir}")
    g = torch.Generator().manual_seed(args.data_seed)
    pick = torch.randperm(len(ds), generator=g)[:n].tolist()
    images = torch.stack([ds[i][0] for i in pick]).to(device)
    labels = torch.tensor([ds[i][1] for i in pick], device=device)
    for name in args.pretrained:
        weights = None if args.random_weights else "DEFAULT"
        try:
            model = getattr(torchvision.models, name)(weights=weights).to(device).eval()
        except Exception as e:  # weights cannot be downloaded offline
            raise FileNotFoundError(f"cannot get the {name} weights ({type(e).__name__}); with no network put them "
                                    "in $TORCH_HOME/hub/checkpoints (see torchvision.models) or use --random-weights"
                                    ) from None
        final = {}
        if len(ds.classes) == 1000:  # an ImageNet folder: class index = ImageNet label
            with torch.no_grad():
                final["train_acc"] = (model(images).argmax(1) == labels).float().mean().item()
        sigmas = args.sigma + [s for s in SWEEP if s not in args.sigma] if args.sweep else args.sigma
        sens = measure_sensitivity(model, images, 16, sigmas, args.mask, args.sens_seed, args.reps,
                                   args.sens_positions)
        head = sens[f"{args.mask[0]}:{args.sigma[0]:g}"]
        final.update(sens=head.mean, sens_stderr=head.stderr,
                     sens_at={k: {"sens": s.mean, "stderr": s.stderr} for k, s in sens.items()},
                     per_image={k: [round(v, 6) for v in s.per_input.tolist()] for k, s in sens.items()})
        results.final(f"{name}/pretrained", final)
        print(f"{name}: sensitivity {final['sens']:.4f} +- {final['sens_stderr']:.4f} on {len(images)} images")


# -----------------------------------------------------------------------------
# figures (redrawn from metrics.json alone)


def plot(data, folder):
    """The figures of a run (or of combined runs) from its metrics.json: curves over training, the sigma sweep
    (Fig. 17), the per-patch maps, sensitivity against train accuracy, and the data-scale study."""
    plt = pyplot()
    groups = {}
    for run, r in data["runs"].items():
        if r["history"]:
            groups.setdefault(model_of(run), []).append(r)
    paths = []
    if groups:
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for name, runs in groups.items():
            hists = [r["history"] for r in runs]
            label = f"{name} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
            plot_curves(axes[0], hists, "epoch", "sens", label)
            plot_curves(axes[1], hists, "epoch", "train_acc", label)
            plot_curves(axes[2], hists, "epoch", "test_acc", label)
        for ax, t in zip(axes, ["sensitivity (train subset)", "train accuracy", "test accuracy"]):
            ax.set_title(t)
            ax.set_xlabel("epoch")
            ax.legend(fontsize=7)
        paths.append(save_figure(fig, f"{folder}/sensitivity.png"))
        fig, ax = plt.subplots(figsize=(5, 4))  # App. A.1: compare at equal train accuracy
        for i, (name, runs) in enumerate(groups.items()):
            for j, r in enumerate(runs):
                h = r["history"]
                ax.plot([x["train_acc"] for x in h], [x["sens"] for x in h], ".-", color=f"C{i}", alpha=0.7,
                        label=name if j == 0 else None)
        ax.set_xlabel("train accuracy")
        ax.set_ylabel(f"sensitivity ({data['args'].get('mask', ['patch'])[0]}, sigma {data['args']['sigma'][0]:g})"
                      if "args" in data and "sigma" in data["args"] else "sensitivity")
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, f"{folder}/sensitivity_vs_train_acc.png"))
    finals = {run: r["final"] for run, r in data["runs"].items() if r["final"].get("sens_at")}
    masks = sorted({k.split(":")[0] for f in finals.values() for k in f["sens_at"]})
    if finals and max(len(f["sens_at"]) for f in finals.values()) > len(masks):  # several sigmas: Fig. 17
        fig, axes = plt.subplots(1, len(masks), figsize=(5 * len(masks), 4), squeeze=False)
        for ax, mask in zip(axes[0], masks):
            for name in dict.fromkeys(model_of(run) for run in finals):
                rows = [{float(k.split(":")[1]): v["sens"] for k, v in f["sens_at"].items() if k.startswith(mask + ":")}
                        for run, f in finals.items() if model_of(run) == name]
                sigmas = sorted(set.intersection(*(set(r) for r in rows)))
                ys = torch.tensor([[r[s] for s in sigmas] for r in rows])
                line, = ax.plot(sigmas, ys.mean(0), "o-", label=f"{name} ({len(rows)} seeds)")
                if len(rows) > 1:
                    ax.fill_between(sigmas, ys.min(0).values, ys.max(0).values, color=line.get_color(), alpha=0.2)
            ax.set_xscale("log")
            ax.set_xlabel("sigma (noise std on normalised pixels)")
            ax.set_ylabel("sensitivity")
            ax.set_title(f"{mask} mask (band: range over seeds)", fontsize=9)
            ax.legend(fontsize=7)
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
        def error_bar(d):  # s.e. over seeds; with one seed, that seed's s.e. over images
            se = d["stderr"]
            if (se is None or se != se) and len(d.get("per_seed", {})) == 1:
                se = next(iter(d["per_seed"].values()))[1]
            return 0 if se is None or se != se else se

        scale = {int(n): p for n, p in data["data_scale"].items() if p}
        ref = next(iter(scale.values()))["reference"]
        sizes = Counter(k for p in scale.values() for k in {k for m in p["models"].values() for k in m["diff"]})
        keys = sorted(k for k, c in sizes.items() if c > 1 or len(scale) == 1)  # a curve needs two sizes
        fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
        for ax, key in zip(axes[0], keys):
            models = dict.fromkeys(m for p in scale.values() for m in p["models"])
            for name in models:
                pts = [(n, p["models"][name]["diff"][key]) for n, p in sorted(scale.items())
                       if name in p["models"] and key in p["models"][name]["diff"]]
                ax.errorbar([n for n, _ in pts], [d["mean"] for _, d in pts],
                            yerr=[error_bar(d) for _, d in pts], fmt="o-", capsize=3, label=f"{name} - {ref}")
            ax.axhline(0, color="gray", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_xlabel("training images")
            ax.set_ylabel("paired sensitivity difference (mean +- s.e.)")
            ax.set_title(key, fontsize=9)
            ax.legend(fontsize=7)
        paths.append(save_figure(fig, f"{folder}/data_scale.png"))
    return paths


def combine(folders):
    """One metrics.json from several vision.py run folders (seeds or models run as separate processes): their runs
    merged and the paired differences recomputed. Folders that differ in the number of training images become a
    data-scale study: the paired differences at each size."""
    sizes = {}
    for folder in folders:
        sizes.setdefault(load_results(folder, "vision").get("data", {}).get("n_train", 0), []).append(folder)
    if len(sizes) == 1:
        out = merge_results(folders, "vision")
        out["paired"] = paired_differences(out["runs"])
        return out
    out = {"script": "vision", "sources": list(folders), "args": load_results(folders[0], "vision")["args"], "runs": {}}
    out["data_scale"] = {str(n): paired_differences(merge_results(group, "vision")["runs"])
                         for n, group in sorted(sizes.items())}
    return out


def summary(data):
    """One line per model: its paired difference to the reference ViT at each key, mean +- s.e. over seeds."""
    paired = data.get("paired") or {}
    for name, p in paired.get("models", {}).items():
        parts = [f"{k} {pm(d['mean'], d['stderr'], d['seeds'])}" for k, d in p["diff"].items()]
        cross = {m: [f"{s:.3g}" for s in v] for m, v in p["crossover"].items() if v}
        parts += [f"level at sigma {cross}"] if cross else []
        print(f"{name} - {paired['reference']} | " + " | ".join(parts))


def main(args):
    if args.plot:
        if len(args.plot) == 1:
            data = load_results(args.plot[0], "vision")
            print("wrote", *plot(data, args.plot[0]))
            return None
        data = combine(args.plot)
        summary(data)
        return save_combined("vision", data, args, plot)
    device = setup(args)
    if args.resume:
        args = resumed_args(args, "vision")
    if args.pretrained:
        folder, results = start_run("vision", args, "imagenet-pretrained", device)
        with results.recording():
            pretrained_run(args, results, device)
        return results.data
    data = prepare_data(args, device)  # before the run folder: a missing or corrupt dataset leaves nothing behind
    channels, size, classes, _ = DATASETS[args.dataset]
    folder, results = start_run("vision", args, f"{args.dataset}-{'-'.join(args.model)}", device)
    results.data["data"] = {"n_train": len(data["train_x"]), "n_test": len(data["test_x"])}
    print(f"{args.dataset}: {len(data['train_x'])} train / {len(data['test_x'])} test images on {device}")
    try:
        with results.recording():
            for name in args.model:
                for seed in args.seeds:
                    train_one(name, seed, args, data, (channels, size, classes), results, device, folder)
            results.data["paired"] = paired_differences(results.data["runs"])
            results.save()
            summary(results.data)
    finally:
        print("wrote", *plot(results.data, folder))
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
