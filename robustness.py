"""Does lower sensitivity go with robustness and flat minima? (Sec. 7.1, 7.2 of the paper.)

Trains vision.py's models (vanilla, with Gaussian-noise augmentation, or with the sensitivity regulariser), then
measures on the same models: the token-wise sensitivity, the accuracy under common corruptions (CIFAR-10-C, read from
the official release or generated here in torch, severities 1-5), and two sharpness measures of the minimum (Table 2).

    python robustness.py --paper         # ResNet-18, DenseNet-121, ViT-small, ViT-simple, ViT + aug, ViT + reg
    python robustness.py --dataset fashionmnist --data-dir DATA --model vit --variants vanilla --n-train 3000 \\
        --epochs 20 --depth 4 --heads 4 --dim-head 16 --sigma 1   # the CPU-scale check of Table 2 (README),
    # and the same with --variants reg --lr 0.2 --epochs 40 (CE is weighted 1 - p = 0.5: twice the lr, equal accuracy)
    python robustness.py --from-vision out/vision/cifar10-vit   # evaluate saved vision.py models (--save-model)

The regulariser (Sec. 7.1): loss = (1 - p) CE(f(x), y) + p MSE(f(x + noise on one random patch), f(x)), p = --reg,
noise std --reg-std [author code: 0.5 and 1]. Sharpness (Sec. 7.2): ShOp = E_x E_eps |f_{theta+eps}(x) - f_theta(x)|_1
and ShPred = E_x E_eps 1[argmax differs], eps ~ N(0, --sharp-std^2) on every weight, --sharp-reps draws, on the
training set, in eval mode with the BatchNorm statistics untouched.
"""

import argparse
import math
import os
import pickle
import sys

import numpy as np
import torch
import torch.nn.functional as F

import vision
from common import (ArgumentParser, check_args, cli, load_results, patchify, plot_curves, pyplot, save_figure,
                    seed_all, setup, start_run, subset_size, unpatchify)

# -----------------------------------------------------------------------------
# corruptions: float images in [0, 1], (B, C, H, W), batched on the device. Strength per severity 1..5 from the
# CIFAR generator of Hendrycks & Dietterich (2019); each function takes the strength itself, so its identity limit
# (zero noise, contrast 1, ...) is a plain argument.

SEVERITY = {
    "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],  # noise std
    "shot_noise": [500, 250, 100, 75, 50],  # photons per unit intensity (Poisson)
    "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],  # fraction of salt-and-pepper values
    "speckle_noise": [0.06, 0.10, 0.12, 0.16, 0.20],  # multiplicative noise std
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],  # disk radius, anti-alias sigma
    "gaussian_blur": [0.4, 0.6, 0.7, 0.8, 1.0],  # sigma
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],  # length, sigma; random angle in [-45, 45]
    "zoom_blur": [0.06, 0.11, 0.16, 0.21, 0.26],  # largest zoom - 1, in steps of 0.01
    "fog": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],  # strength, fractal decay
    "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],  # added to the HSV value
    "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],  # factor towards the mean
    "saturate": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],  # HSV saturation * a + b
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],  # downscale factor
    "jpeg_compression": [80, 65, 58, 50, 40],  # JPEG quality
    "elastic_transform": [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                          (0.1, 0.03, 0.03)],  # displacement, its smoothness, affine jitter; fractions of the size
}


def gaussian_noise(x, c, g):
    return x + c * torch.randn(x.shape, generator=g, device=x.device)


def shot_noise(x, c, g):
    return torch.poisson(x * c, generator=g) / c


def impulse_noise(x, c, g):
    """Each value independently becomes 0 or 1 (half each) with probability c."""
    u = torch.rand(x.shape, generator=g, device=x.device)
    return torch.where(u < c / 2, 0.0, torch.where(u < c, 1.0, x))


def speckle_noise(x, c, g):
    return x + x * c * torch.randn(x.shape, generator=g, device=x.device)


def filter2d(x, kernel):
    """Convolve every channel with one (k, k) kernel, reflecting at the border."""
    k = kernel.shape[-1]
    C = x.shape[1]
    x = F.pad(x, (k // 2,) * 4, mode="reflect") if k // 2 < x.shape[-1] else x
    return F.conv2d(x, kernel.to(x)[None, None].expand(C, 1, k, k), groups=C)


def gaussian_kernel(sigma, radius=None):
    radius = radius if radius is not None else max(1, math.ceil(4 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=torch.float32)
    k = torch.exp(-t**2 / (2 * sigma**2))
    return torch.outer(k, k) / k.sum() ** 2


def gaussian_blur(x, sigma, g):
    return filter2d(x, gaussian_kernel(sigma))


def defocus_blur(x, c, g):
    """A disk of the given radius on a 17x17 grid, anti-aliased by a 3x3 Gaussian of sigma c[1]."""
    radius, alias = c
    t = torch.arange(-8, 9, dtype=torch.float32)
    disk = ((t[:, None] ** 2 + t[None, :] ** 2) <= radius**2).float()
    disk = filter2d((disk / disk.sum())[None, None], gaussian_kernel(alias, radius=1))[0, 0]
    return filter2d(x, disk)


def shift(x, dy, dx):
    """Bilinear translation of each image by (dy, dx) pixels (per-image tensors), edges clamped."""
    B, _, H, W = x.shape
    ys, xs = torch.meshgrid(torch.arange(H, device=x.device), torch.arange(W, device=x.device), indexing="ij")
    gy = (ys[None] - dy[:, None, None]) / (H - 1) * 2 - 1
    gx = (xs[None] - dx[:, None, None]) / (W - 1) * 2 - 1
    return F.grid_sample(x, torch.stack([gx, gy], -1), align_corners=True, padding_mode="border")


def motion_blur(x, c, g):
    """ImageMagick-style one-sided motion blur: Gaussian-weighted copies shifted along a random angle."""
    length, sigma = c
    angle = (torch.rand(len(x), generator=g, device=x.device) * 90 - 45) * math.pi / 180
    out = torch.zeros_like(x)
    weights = [math.exp(-(d**2) / (2 * sigma**2)) for d in range(length)]
    for d, w in enumerate(weights):
        out += w * shift(x, d * torch.sin(angle), d * torch.cos(angle))
    return out / sum(weights)


def zoom(x, factor):
    """Zoom into the centre by `factor` (bilinear), keeping the size."""
    H, W = x.shape[-2:]
    theta = torch.tensor([[1 / factor, 0, 0], [0, 1 / factor, 0]], dtype=x.dtype, device=x.device)
    grid = F.affine_grid(theta.expand(len(x), 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False)


def zoom_blur(x, c, g):
    factors = torch.arange(1, 1 + c + 1e-9, 0.01).tolist()
    return (x + sum(zoom(x, z) for z in factors)) / (len(factors) + 1)


def plasma_fractal(n, size, decay, g, device):
    """n diamond-square height maps (n, size, size) in [0, 1]; size a power of two."""
    m = torch.zeros(n, size, size, device=device)
    step, wibble = size, 100.0

    def wibbled(a):
        return a / 4 + wibble * (torch.rand(a.shape, generator=g, device=device) * 2 - 1) * wibble

    while step >= 2:
        h = step // 2
        corners = m[:, ::step, ::step]
        sq = corners + corners.roll(-1, 1)
        m[:, h::step, h::step] = wibbled(sq + sq.roll(-1, 2))  # squares: centre = mean of 4 corners
        centres, corners = m[:, h::step, h::step], m[:, ::step, ::step]
        m[:, ::step, h::step] = wibbled(centres + centres.roll(1, 1) + corners + corners.roll(-1, 2))  # diamonds
        m[:, h::step, ::step] = wibbled(centres + centres.roll(1, 2) + corners + corners.roll(-1, 1))
        step, wibble = h, wibble / decay
    m = m - m.amin((1, 2), keepdim=True)
    return m / m.amax((1, 2), keepdim=True)


def fog(x, c, g):
    strength, decay = c
    H, W = x.shape[-2:]
    size = 1 << max(H, W).bit_length() if max(H, W) & (max(H, W) - 1) else max(H, W)
    top = x.amax((1, 2, 3), keepdim=True)
    x = x + strength * plasma_fractal(len(x), size, decay, g, x.device)[:, None, :H, :W]
    return x * top / (top + strength)


def value(x):
    return x.amax(1, keepdim=True)  # HSV value of RGB (the pixel itself for grey images)


def brightness(x, c, g):
    """Add c to the HSV value with hue and saturation unchanged: RGB scales with the value."""
    v = value(x)
    v_new = (v + c).clamp(0, 1)
    return torch.where(v > 0, x * v_new / v.clamp_min(1e-12), v_new.expand_as(x))


def contrast(x, c, g):
    mean = x.mean((2, 3), keepdim=True)
    return (x - mean) * c + mean


def saturate(x, c, g):
    """HSV saturation -> s * a + b with hue and value unchanged (grey images have no saturation: unchanged)."""
    if x.shape[1] == 1:
        return x
    a, b = c
    v = value(x)
    s = (v - x.amin(1, keepdim=True)) / v.clamp_min(1e-12)
    s_new = (s * a + b).clamp(0, 1)
    coloured = v - (v - x) * s_new / s.clamp_min(1e-12)  # each channel keeps its place between min and max
    grey = v * torch.tensor([1.0, 0.0, 0.0], device=x.device)[None, :, None, None]  # hue 0 (red) for grey pixels
    grey = v - (v - grey) * s_new
    return torch.where(s > 0, coloured, grey)


def pixelate(x, c, g):
    """Box-downscale to c times the size, then back up (nearest)."""
    H, W = x.shape[-2:]
    small = F.interpolate(x, size=(int(H * c), int(W * c)), mode="area")
    return F.interpolate(small, size=(H, W), mode="nearest")


LUMA_Q = torch.tensor([16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
                       14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113,
                       92, 49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99.0]).view(8, 8)
CHROMA_Q = torch.full((8, 8), 99.0)
CHROMA_Q[:4, :4] = torch.tensor([17, 18, 24, 47, 18, 21, 26, 66, 24, 26, 56, 99, 47, 66, 99, 99.0]).view(4, 4)


def dct_matrix():
    k, n = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    m = torch.cos((2 * n + 1) * k * math.pi / 16) * math.sqrt(2 / 8)
    m[0] /= math.sqrt(2)
    return m  # orthonormal 8-point DCT-II


def jpeg_plane(p, table, quality):
    """Quantise one plane (B, H, W) in [0, 255] through 8x8 block DCTs with the IJG-scaled table."""
    scale = 5000 / quality if quality < 50 else 200 - 2 * quality
    q = ((table * scale + 50) / 100).floor().clamp(1, 255).to(p)
    B, H, W = p.shape
    ph, pw = -H % 8, -W % 8
    p = F.pad(p[:, None], (0, pw, 0, ph), mode="replicate")[:, 0] - 128
    blocks = p.unfold(1, 8, 8).unfold(2, 8, 8)  # (B, H/8, W/8, 8, 8)
    d = dct_matrix().to(p)
    coef = d @ blocks @ d.T
    blocks = d.T @ ((coef / q).round() * q) @ d
    out = blocks.permute(0, 1, 3, 2, 4).reshape(B, H + ph, W + pw) + 128
    return out[:, :H, :W]


def jpeg_compression(x, quality, g):
    """Baseline JPEG of the given quality: YCbCr, 4:2:0 chroma subsampling (PIL's default), 8x8 DCT quantisation."""
    x = x * 255
    if x.shape[1] == 1:
        return jpeg_plane(x[:, 0], LUMA_Q, quality)[:, None] / 255
    r, gr, b = x.unbind(1)
    y = 0.299 * r + 0.587 * gr + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * gr + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * gr - 0.081312 * b
    y = jpeg_plane(y, LUMA_Q, quality)
    H, W = x.shape[-2:]
    chroma = []
    for ch in (cb, cr):  # subsample 2x2, compress, upsample
        small = F.avg_pool2d(ch[:, None], 2, ceil_mode=True)[:, 0]
        small = jpeg_plane(small, CHROMA_Q, quality)
        chroma.append(F.interpolate(small[:, None], scale_factor=2, mode="nearest")[:, 0, :H, :W])
    cb, cr = chroma
    rgb = torch.stack([y + 1.402 * (cr - 128), y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128),
                       y + 1.772 * (cb - 128)], 1)
    return rgb / 255


def elastic_transform(x, c, g):
    """A random affine jitter of three points, then a smooth random displacement field (bilinear, reflected)."""
    B, _, H, W = x.shape
    disp, smooth, jitter = (v * H for v in c)
    ys, xs = torch.meshgrid(torch.arange(H, device=x.device, dtype=x.dtype),
                            torch.arange(W, device=x.device, dtype=x.dtype), indexing="ij")
    centre, half = torch.tensor([H // 2, W // 2], dtype=x.dtype), min(H, W) // 3
    src = torch.stack([centre + half, torch.stack([centre[0] + half, centre[1] - half]), centre - half])  # (3, 2)
    dst = src + (torch.rand(B, 3, 2, generator=g, device=x.device) * 2 - 1).cpu() * jitter
    ones = torch.ones(3, 1, dtype=x.dtype)
    M = torch.linalg.solve(torch.cat([dst, ones.expand(B, 3, 1)], -1), src.expand(B, 3, 2)).to(x.device)  # dst->src
    pts = torch.stack([ys, xs, torch.ones_like(ys)], -1).view(1, -1, 3)  # output pixel -> where to read
    read = (pts @ M).view(B, H, W, 2)
    if disp > 0:
        noise = torch.rand(B, 2, H, W, generator=g, device=x.device) * 2 - 1
        field = filter2d(noise, gaussian_kernel(smooth, radius=min(math.ceil(3 * smooth), H // 2 - 1))) * disp
        read = read + field.permute(0, 2, 3, 1)
    grid = torch.stack([read[..., 1] / (W - 1), read[..., 0] / (H - 1)], -1) * 2 - 1
    return F.grid_sample(x, grid, align_corners=True, padding_mode="reflection")


CORRUPTIONS = {name: globals()[name] for name in SEVERITY}


def corrupt(images, name, severity, generator):
    """uint8 (B, C, H, W) images -> the corrupted uint8 images (rounded, as in the released files)."""
    x = CORRUPTIONS[name](images.float() / 255, SEVERITY[name][severity - 1], generator)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8)


def read_release(folder, name, severity, n=None):
    """The official CIFAR-10-C arrays: <name>.npy (50000, 32, 32, 3) uint8, severity s = rows (s-1)*10000 on."""
    arrays = []
    for file in [f"{name}.npy", "labels.npy"]:
        path = os.path.join(folder, file)
        try:
            arrays.append(np.load(path, mmap_mode="r"))
        except FileNotFoundError:
            raise FileNotFoundError(f"no {path}: get CIFAR-10-C from https://zenodo.org/record/2535967, or drop "
                                    "--cifar10c-dir to generate the corruptions") from None
        except (ValueError, OSError) as e:
            raise ValueError(f"{path} is present but not a readable .npy array ({e})") from None
    x, y = arrays
    if x.ndim != 4 or len(x) != len(y) or len(x) % 5:
        raise ValueError(f"{os.path.join(folder, name)}.npy has shape {x.shape} for {len(y)} labels: expected 5 "
                         "severity blocks of (N, H, W, C) images")
    per = len(x) // 5
    subset_size("--n-corrupt", n, per, f"images per severity in {name}.npy")
    rows = slice((severity - 1) * per, (severity - 1) * per + (n or per))
    images = torch.from_numpy(np.array(x[rows])).permute(0, 3, 1, 2)  # a copy of the mapped rows, NHWC -> NCHW
    return images, torch.from_numpy(y[rows].astype(np.int64))


# -----------------------------------------------------------------------------
# training objectives and sharpness


def random_patch_noise(images, patch, std, generator):
    """N(0, std^2) on one random patch (of the patch grid) of each image, as one batched mask."""
    tokens = patchify(torch.zeros_like(images), patch)  # (B, T, D)
    pick = torch.randint(tokens.shape[1], (len(images),), generator=generator, device=images.device)
    tokens[torch.arange(len(images), device=images.device), pick] = 1.0
    mask = unpatchify(tokens, patch, images.shape[1:])
    return images + std * torch.randn(images.shape, generator=generator, device=images.device) * mask


def make_loss(variant, args, generator):
    """loss_fn(model, normalised images, labels) of a training variant."""
    def vanilla(model, x, y):
        return F.cross_entropy(model(x).float(), y)

    def augment(model, x, y):  # Gaussian noise on the whole image, label kept
        return vanilla(model, x + args.augment_std * torch.randn(x.shape, generator=generator, device=x.device), y)

    def reg(model, x, y):  # (1 - p) CE + p MSE(f(x with one noisy patch), f(x)), the authors' regulariser
        out = model(x).float()
        noisy = model(random_patch_noise(x, args.sens_patch, args.reg_std, generator)).float()
        return (1 - args.reg) * F.cross_entropy(out, y) + args.reg * F.mse_loss(noisy, out)

    return {"vanilla": vanilla, "augment": augment, "reg": reg}[variant]


@torch.no_grad()
def sharpness(model, x, std, reps, generator, batch_size=500):
    """ShOp and ShPred (mean L1 change of the logits, fraction of changed predictions) when every weight gets
    N(0, std^2) noise, with their standard errors over the `reps` weight draws; eval mode, BatchNorm statistics as they
    are, the model's own weights never touched."""
    model.eval()
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    clean = torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]).float()
    shop, shpred = [], []
    for _ in range(reps):
        noisy = {k: p + std * torch.randn(p.shape, generator=generator, device=p.device) for k, p in params.items()}
        out = torch.cat([torch.func.functional_call(model, {**noisy, **buffers}, (x[i:i + batch_size],))
                         for i in range(0, len(x), batch_size)]).float()
        shop.append((out - clean).abs().sum(1).mean().item())
        shpred.append((out.argmax(1) != clean.argmax(1)).float().mean().item())
    result = {}
    for name, values in [("shop", shop), ("shpred", shpred)]:
        result[name] = float(np.mean(values))
        result[f"{name}_stderr"] = float(np.std(values, ddof=1) / np.sqrt(reps)) if reps > 1 else float("nan")
    return result


# -----------------------------------------------------------------------------
# the experiment


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       parents=[vision.base_parser()])  # every flag of vision.py's models, data, training, sensitivity
    # what to run
    p.add_argument("--variants", nargs="+", default=["vanilla"], choices=["vanilla", "augment", "reg"],
                   help="training variants, each applied to every --model")
    p.add_argument("--paper", action="store_true", help="the paper's six: resnet18, densenet121, vit, vit-simple "
                   "vanilla, vit + augment, vit + reg (overrides --model and --variants)")
    p.add_argument("--from-vision", type=str, default=None, help="evaluate the models saved by vision.py "
                   "--save-model in this run folder instead of training (its model and data flags are reused)")
    p.add_argument("--augment-std", type=float, default=0.1, help="std of the Gaussian-noise augmentation")
    p.add_argument("--reg", type=float, default=0.5, help="weight p of the sensitivity regulariser [author code]")
    p.add_argument("--reg-std", type=float, default=1.0, help="noise std on the regulariser's patch [author code]")
    # corruptions
    p.add_argument("--cifar10c-dir", type=str, default=None, help="the official CIFAR-10-C release (else generate)")
    p.add_argument("--corruptions", nargs="+", default=list(SEVERITY), help="corruptions to evaluate")
    p.add_argument("--severities", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="severities 1..5")
    p.add_argument("--n-corrupt", type=int, default=2000, help="test images per corruption and severity")
    # sharpness
    p.add_argument("--sharp-std", type=float, default=0.05, help="std of the weight noise [author code]")
    p.add_argument("--sharp-reps", type=int, default=5, help="weight-noise draws [author code]")
    p.add_argument("--n-sharp", type=int, default=2000, help="training images the sharpness is measured on")
    args = p.parse_args(argv)
    if args.from_vision:  # the saved run's own flags first, so that those given here take precedence
        try:
            saved = load_results(args.from_vision, "vision")["args"]
        except ValueError as e:
            p.error(f"--from-vision: {e}")
        known = vars(p.parse_args([]))
        skip = {"out_dir", "run_name", "plot", "save_model", "threads", "device"}
        args = p.parse_args([a for k, v in saved.items() if k in known and k not in skip for a in to_argv(k, v)]
                            + (argv if argv is not None else sys.argv[1:]))
    vision.check_arguments(p, args)
    if args.paper:
        args.model, args.variants = ["resnet18", "densenet121", "vit", "vit-simple"], ["vanilla"]
    bad = [c for c in args.corruptions if c not in SEVERITY]
    if bad:
        p.error(f"unknown corruption {bad[0]!r}; choose from {', '.join(SEVERITY)}")
    if any(not 1 <= s <= 5 for s in args.severities):
        p.error(f"--severities are 1..5, got {args.severities}")
    check_args(p, args, positive=["sharp_reps", "n_corrupt", "n_sharp"],
               nonnegative=["sharp_std", "augment_std", "reg_std", "reg"])
    if args.reg > 1:
        p.error(f"--reg is a weight in [0, 1], got {args.reg}")
    if args.cifar10c_dir and not os.path.isdir(args.cifar10c_dir):
        p.error(f"--cifar10c-dir {args.cifar10c_dir}: no such folder (get CIFAR-10-C from "
                "https://zenodo.org/record/2535967, or leave the flag out to generate the corruptions)")
    if args.cifar10c_dir:  # checked before any training
        missing = [f for f in ["labels.npy"] + [f"{c}.npy" for c in args.corruptions]
                   if not os.path.isfile(os.path.join(args.cifar10c_dir, f))]
        if missing:
            p.error(f"--cifar10c-dir {args.cifar10c_dir}: no {', '.join(missing)} there (get CIFAR-10-C from "
                    "https://zenodo.org/record/2535967, or leave the flag out to generate the corruptions)")
    return args


def to_argv(key, value):
    """A saved vision.py argument back to its command-line form."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [flag] if value else []
    if value is None or value == {} or value == []:
        return []
    if isinstance(value, dict):  # --lr per model
        return [flag] + [f"{m}={v}" for m, v in value.items()]
    return [flag] + [str(v) for v in value] if isinstance(value, list) else [flag, str(value)]


def evaluate_model(model, args, data, gen, device):
    """Sensitivity, accuracies, corruption accuracy per corruption and severity, ShOp, ShPred."""
    final = {}
    final["train_loss"], final["train_acc"] = vision.evaluate(model, data["train_x"], data["train_y"])
    final["test_loss"], final["test_acc"] = vision.evaluate(model, data["test_x"], data["test_y"])
    sens = vision.measure_sensitivity(model, vision.normalize(data["train_x"][: args.n_sens]), args.sens_patch,
                                      args.sigma[:1], ["patch"], args.sens_seed, args.reps, args.sens_positions)
    sens = next(iter(sens.values()))
    final["sens"], final["sens_stderr"] = sens.mean, sens.stderr
    acc = {}
    for name in args.corruptions:
        acc[name] = {}
        for s in args.severities:
            if args.cifar10c_dir:
                x, y = read_release(args.cifar10c_dir, name, s, args.n_corrupt)
                x, y = x.to(device), y.to(device)
            else:
                x, y = data["test_x"][: args.n_corrupt], data["test_y"][: args.n_corrupt]
                x = corrupt(x, name, s, gen)
            acc[name][str(s)] = vision.evaluate(model, x, y)[1]
    final["corruption_acc"] = acc
    final["mean_corruption_acc"] = float(np.mean([a for per in acc.values() for a in per.values()]))
    final.update(sharpness(model, vision.normalize(data["train_x"][: args.n_sharp]), args.sharp_std, args.sharp_reps,
                           gen))
    return final


def plot(data, folder):
    """Fig. 9: accuracy per corruption (mean over severities) per model, sensitivity in the legend; and the
    sensitivity against the mean corruption accuracy."""
    plt = pyplot()
    groups = {}
    for run, r in data["runs"].items():
        if r["final"].get("corruption_acc"):
            groups.setdefault(run.rsplit("/", 1)[0], []).append(r["final"])
    if not groups:
        return []
    names = list(next(iter(groups.values()))[0]["corruption_acc"])
    fig, ax = plt.subplots(figsize=(max(8, len(names)), 4))
    width = 0.8 / len(groups)
    for i, (label, finals) in enumerate(groups.items()):
        means = [np.mean([np.mean(list(f["corruption_acc"][c].values())) for f in finals]) for c in names]
        sens = np.mean([f["sens"] for f in finals])
        ax.bar(np.arange(len(names)) + i * width, means, width, label=f"{label} (sens {sens:.4f}, {len(finals)} seeds)")
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, [n.replace("_", "\n") for n in names], fontsize=7)
    ax.set_ylabel("test accuracy (mean over severities)")
    ax.legend(fontsize=7)
    paths = [save_figure(fig, f"{folder}/corruptions.png")]
    fig, ax = plt.subplots(figsize=(5, 4))
    for label, finals in groups.items():
        ax.errorbar(np.mean([f["sens"] for f in finals]), np.mean([f["mean_corruption_acc"] for f in finals]),
                    xerr=np.mean([f["sens_stderr"] for f in finals]), fmt="o", label=label)
    ax.set_xlabel("sensitivity (train subset)")
    ax.set_ylabel("mean corruption accuracy")
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, f"{folder}/sensitivity_vs_robustness.png"))
    hists = {label: [r["history"] for run, r in data["runs"].items() if run.startswith(label + "/") and r["history"]]
             for label in groups}
    if any(hists.values()):
        fig, ax = plt.subplots(figsize=(5, 4))
        for label, h in hists.items():
            if h:
                plot_curves(ax, h, "epoch", "sens", label)
        ax.set_xlabel("epoch")
        ax.set_ylabel("sensitivity")
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, f"{folder}/sensitivity.png"))
    return paths


def main(args):
    if args.plot:
        print("wrote", *plot(load_results(args.plot, "robustness"), args.plot))
        return None
    device = setup(args)
    data = vision.prepare_data(args, device)  # the same subsets as vision.py; before the run folder
    if not args.cifar10c_dir:
        subset_size("--n-corrupt", args.n_corrupt, len(data["test_x"]), "test images (--n-test)")
    subset_size("--n-sharp", args.n_sharp, len(data["train_x"]), "training images (--n-train)")
    name = "from-vision" if args.from_vision else f"{args.dataset}-{'-'.join(args.model)}"
    folder, results = start_run("robustness", args, name, device)
    shape = vision.DATASETS[args.dataset][:3]
    if args.from_vision:
        jobs = [(m, "vanilla", s) for m in args.model for s in args.seeds]
    elif args.paper:
        jobs = [(m, "vanilla", s) for m in args.model for s in args.seeds]
        jobs += [("vit", v, s) for v in ["augment", "reg"] for s in args.seeds]
    else:
        jobs = [(m, v, s) for m in args.model for v in args.variants for s in args.seeds]
    try:
        with results.recording():
            for model_name, variant, seed in jobs:
                run = f"{model_name}-{variant}/seed{seed}"
                gen = torch.Generator(device).manual_seed(seed)
                if args.from_vision:
                    seed_all(seed)
                    model = vision.build_model(model_name, args, *shape).to(device)
                    path = os.path.join(args.from_vision, f"{model_name}-seed{seed}.pt")
                    try:
                        model.load_state_dict(torch.load(path, map_location=device))
                    except FileNotFoundError:
                        raise FileNotFoundError(f"no {path}: run vision.py with --save-model first") from None
                    except (RuntimeError, pickle.UnpicklingError, EOFError) as e:
                        raise ValueError(f"{path} is not a {model_name} checkpoint of these flags ({e})") from None
                else:
                    model = vision.train_one(model_name, seed, args, data, shape, results, device, folder, run=run,
                                             loss_fn=make_loss(variant, args, gen))
                    if model is None:  # diverged: marked in metrics.json, nothing to measure
                        continue
                final = evaluate_model(model, args, data, gen, device)
                results.final(run, final)
                print(f"{run} | train acc {final['train_acc']:.4f} | test acc {final['test_acc']:.4f} | sens "
                      f"{final['sens']:.4f} +- {final['sens_stderr']:.4f} | mean corruption acc "
                      f"{final['mean_corruption_acc']:.4f} | ShOp {final['shop']:.4f} +- {final['shop_stderr']:.4f} "
                      f"| ShPred {final['shpred']:.4f} +- {final['shpred_stderr']:.4f}")
    finally:
        paths = plot(results.data, folder)
        if paths:
            print("wrote", *paths)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
