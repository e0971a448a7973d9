"""How close are corruptions.py's generated corruptions to the generator that made CIFAR-10-C?

Runs Hendrycks & Dietterich's own generator (ImageNet-C/create_c/make_cifar_c.py of github.com/hendrycks/robustness,
read from a clone and executed, never copied) and ours on the same natural 32x32 photographs, then prints per
corruption and severity:
- deterministic corruptions: the mean absolute difference from the reference in grey levels, and the share of values
  off by more than 2 levels;
- random ones (their draws cannot be shared): the ratio ours / reference of the mean absolute change from the clean
  image, and of a sharpness statistic (the mean absolute 4-neighbour Laplacian of the output);
- random ones again, given the reference's own random draws (replayed into torch.randn / rand / randint for the first
  images): the mean absolute difference and the share off by more than 2 levels, as for the deterministic ones;
- whether the five severities come in the reference's order (ranked by the mean absolute change; a swap of two
  severities that the reference or ours cannot tell apart, within 2 standard errors over images, is not counted).

The reference needs scikit-image, OpenCV, SciPy, Wand and ImageMagick's MagickWand library, which the repository does
not: run it in a scratch environment, then compare in the repository's:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install numpy scipy scikit-image opencv-python-headless Wand pillow
    apt-get install libmagickwand-dev            # the library Wand loads
    git clone https://github.com/hendrycks/robustness /tmp/robustness
    /tmp/refenv/bin/python tools/cifar_c_fidelity.py reference /tmp/robustness/ImageNet-C/create_c --out /tmp/ref.npz
    python tools/cifar_c_fidelity.py compare /tmp/ref.npz --frost-dir /tmp/robustness/ImageNet-C/create_c
    python tools/cifar_c_fidelity.py fixture /tmp/ref.npz     # rewrites tests/fixtures/cifar_c_reference.npz

The photographs are scikit-image's bundled colour photographs, scaled so the short side is 128, 96 and 64 pixels
and cut into 32x32 tiles (220 images). make_cifar_c.py was written for 2018's libraries; the few calls that have
since changed name are mapped to today's (skimage's `multichannel=True` is `channel_axis=-1`, `np.float_` is
`np.float64`, `np.fromstring` of bytes is `np.frombuffer`, scipy.ndimage.interpolation is scipy.ndimage).
"""

import argparse
import contextlib
import math
import os
import sys
import types
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # corruptions.py, imported only where ours run (the reference environment has no torch)
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "cifar_c_reference.npz")
PHOTOS = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png", "ihc.png"]
DETERMINISTIC = ["defocus_blur", "zoom_blur", "brightness", "contrast", "saturate", "pixelate", "jpeg_compression",
                 "gaussian_blur"]
RANDOM = ["gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "glass_blur", "motion_blur", "snow",
          "frost", "fog", "elastic_transform", "spatter"]
# random corruptions whose every draw is numpy's normal, uniform or randint (impulse noise draws from scikit-image's
# own generator, shot noise is Poisson, frost picks files): their draws can be replayed into ours
REPLAYABLE = ["gaussian_noise", "speckle_noise", "glass_blur", "motion_blur", "snow", "fog", "elastic_transform",
              "spatter"]
N_REPLAY = 32  # images replayed per corruption and severity


def photographs():
    """uint8 (N, 32, 32, 3) tiles of scikit-image's colour photographs at three scales."""
    import skimage.data
    from PIL import Image

    tiles = []
    for name in PHOTOS:
        img = Image.open(os.path.join(os.path.dirname(skimage.data.__file__), name)).convert("RGB")
        for short in (128, 96, 64):
            scale = short / min(img.size)
            a = np.array(img.resize((round(img.size[0] * scale), round(img.size[1] * scale)), Image.LANCZOS))
            for top in range(0, a.shape[0] - 31, 32):
                for left in range(0, a.shape[1] - 31, 32):
                    tiles.append(a[top:top + 32, left:left + 32])
    return np.stack(tiles)


def load_reference(folder):
    """The distortion functions of make_cifar_c.py in `folder`, executed with today's library names."""
    import scipy.ndimage
    import skimage.filters

    path = os.path.join(folder, "make_cifar_c.py")
    source = open(path).read()
    start, end = "# /////////////// Distortion Helpers", "# /////////////// End Distortions"
    if start not in source or end not in source:
        sys.exit(f"{path} is not hendrycks/robustness's make_cifar_c.py (its distortion section is missing)")
    sys.modules.setdefault("scipy.ndimage.interpolation", scipy.ndimage)
    np.float_ = np.float64
    np.fromstring = lambda s, dtype: np.frombuffer(s, dtype)

    def gaussian(image, sigma=1, multichannel=None, **kw):
        return skimage.filters.gaussian(image, sigma=sigma, channel_axis=-1 if multichannel else None, **kw)

    from PIL import Image

    module = types.ModuleType("make_cifar_c")
    module.np, module.Image = np, Image  # imported above the section
    exec(compile(source[source.index(start):source.index(end)], path, "exec"), module.__dict__)
    module.gaussian = gaussian
    return module


@contextlib.contextmanager
def recording(log):
    """Append every draw of numpy's normal, uniform and randint to log as (kind, standardised values): normal as
    (v - loc) / scale, uniform as (v - low) / (high - low), randint as is, i.e. what torch's randn, rand and randint
    would have returned."""
    real = np.random.normal, np.random.uniform, np.random.randint

    def normal(loc=0.0, scale=1.0, size=None):
        v = real[0](loc, scale, size)
        log.append(("randn", (np.asarray(v) - loc) / scale))
        return v

    def uniform(low=0.0, high=1.0, size=None):
        v = real[1](low, high, size)
        log.append(("rand", (np.asarray(v) - low) / (high - low)))
        return v

    def randint(low, high=None, size=None):
        v = real[2](low, high, size)
        log.append(("randint", np.asarray(v)))
        return v

    np.random.normal, np.random.uniform, np.random.randint = normal, uniform, randint
    try:
        yield
    finally:
        np.random.normal, np.random.uniform, np.random.randint = real


def reference(args):
    from PIL import Image

    out_path = os.path.abspath(args.out)
    ref = load_reference(args.folder)
    images = photographs()
    out = {"images": images}
    os.chdir(args.folder)  # frost reads ./frost*.png
    for name in DETERMINISTIC + RANDOM:
        fn = getattr(ref, name)
        for severity in range(1, 6):
            np.random.seed(severity)
            out[f"{name}/{severity}"] = np.stack([np.uint8(fn(Image.fromarray(x), severity)) for x in images])
            if name not in REPLAYABLE:
                continue
            for i, x in enumerate(images[:N_REPLAY]):  # again, recording the draws
                log = []
                with recording(log):
                    out[f"replay/{name}/{severity}/{i}"] = np.uint8(fn(Image.fromarray(x), severity))
                for kind in ("randn", "rand", "randint"):
                    draws = [v.astype(np.float32 if kind != "randint" else np.int8) for k, v in log if k == kind]
                    out[f"replay/{name}/{severity}/{i}/{kind}"] = np.concatenate([d.ravel() for d in draws] or [[]])
                    out[f"replay/{name}/{severity}/{i}/{kind}_shapes"] = np.array(
                        [list(d.shape) + [0] * (3 - d.ndim) for d in draws], dtype=np.int64).reshape(-1, 3)
        print(name, flush=True)
    np.savez_compressed(out_path, **out)
    print(f"{len(images)} images -> {out_path}")


def ours(images, name, severity, frost_dir=None, device="cpu"):
    """corruptions.corrupt of uint8 (N, H, W, C) images on `device`, seeded by the severity, as uint8 (N, H, W, C)."""
    import torch

    import corruptions  # the repository's, on sys.path from the top of this file

    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)
    g = torch.Generator(device).manual_seed(severity)
    y = corruptions.corrupt(x, name, severity, g, frost_dir=frost_dir)
    assert y.device == x.device, f"{name} moved the images from {x.device} to {y.device}"
    return y.permute(0, 2, 3, 1).cpu().numpy()


def draws_of(ref, key):
    """The reference's recorded draws for one image: {kind: [arrays in the shapes numpy drew them]}."""
    out = {}
    for kind in ("randn", "rand", "randint"):
        flat, at, out[kind] = ref[f"{key}/{kind}"], 0, []
        for shape in ref[f"{key}/{kind}_shapes"]:
            shape = tuple(int(v) for v in shape if v)
            out[kind].append(flat[at:at + math.prod(shape)].reshape(shape))
            at += math.prod(shape)
    return out


@contextlib.contextmanager
def replaying(draws):
    """torch.randn, rand and randint return the reference's draws (standardised) in order, one image at a time:
    a request takes as many of numpy's draws as it needs; per-pixel noise drawn by numpy as (H, W, C) is read as
    torch's (C, H, W)."""
    import torch

    real = torch.randn, torch.rand, torch.randint
    queues = {kind: list(arrays) for kind, arrays in draws.items()}

    def take(kind, size, dtype, device):
        size = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
        parts, n = [], math.prod(size)
        while sum(len(p) for p in parts) < n:
            a = queues[kind].pop(0)
            parts.append(np.ascontiguousarray(a.transpose(2, 0, 1) if a.ndim == 3 and len(size) == 4 else a).ravel())
        v = np.concatenate(parts)
        assert len(v) == n, f"{kind}{size}: the reference drew {len(v)} values"
        return torch.from_numpy(v.astype(np.float64)).view(size).to(device=device, dtype=dtype)

    torch.randn = lambda *size, generator=None, device=None, dtype=None: take("randn", size, dtype or torch.float32,
                                                                                device)
    torch.rand = lambda *size, generator=None, device=None, dtype=None: take("rand", size, dtype or torch.float32,
                                                                              device)
    torch.randint = lambda low, high, size, generator=None, device=None, dtype=None: take("randint", size,
                                                                                          dtype or torch.int64, device)
    try:
        yield
    finally:
        torch.randn, torch.rand, torch.randint = real


def replayed(ref, name, severity, i, device="cpu"):
    """Ours on the reference's image i with the reference's own draws, (1, H, W, C) uint8."""
    with replaying(draws_of(ref, f"replay/{name}/{severity}/{i}")):
        return ours(ref["images"][i:i + 1], name, severity, device=device)


def sharpness(x):
    x = x.astype(np.float64)
    return np.abs(4 * x[:, 1:-1, 1:-1] - x[:, :-2, 1:-1] - x[:, 2:, 1:-1] - x[:, 1:-1, :-2] - x[:, 1:-1, 2:]).mean()


def same_order(ref_changes, our_changes):
    """'same', 'same within noise' (every swapped pair is within 2 standard errors for the reference or for ours)
    or the two orders; changes: per severity, the per-image mean absolute change."""
    r, o = [list(np.argsort([c.mean() for c in ch]) + 1) for ch in (ref_changes, our_changes)]
    if r == o:
        return "same"
    for i in range(5):
        for j in range(i + 1, 5):
            d = [ch[j] - ch[i] for ch in (ref_changes, our_changes)]
            clear = [abs(v.mean()) > 2 * v.std() / math.sqrt(len(v)) for v in d]
            if all(clear) and np.sign(d[0].mean()) != np.sign(d[1].mean()):
                return f"ref {' '.join(map(str, r))}, ours {' '.join(map(str, o))}"
    return "same within noise"


def table(ref, frost_dir=None, names=None):
    """Per corruption: five cells (one per severity) and the order; each cell a dict of the measures."""
    images = ref["images"].astype(np.float64)
    out = {}
    for name in names or DETERMINISTIC + RANDOM:
        if name == "frost" and not frost_dir:
            continue
        cells, changes = [], ([], [])
        for s in range(1, 6):
            r, o = ref[f"{name}/{s}"], ours(ref["images"], name, s, frost_dir)
            changes[0].append(np.abs(r - images).mean((1, 2, 3)))
            changes[1].append(np.abs(o - images).mean((1, 2, 3)))
            if name in DETERMINISTIC:
                d = np.abs(o.astype(np.float64) - r)
                cells.append({"mean_abs": d.mean(), "off_by_2": (d > 2).mean()})
                continue
            cell = {"change_ratio": changes[1][-1].mean() / changes[0][-1].mean(),
                    "sharpness_ratio": sharpness(o) / sharpness(r)}
            if name in REPLAYABLE and f"replay/{name}/{s}/0" in ref:
                n = sum(f"replay/{name}/{s}/{i}" in ref for i in range(N_REPLAY))
                d = np.abs(np.concatenate([replayed(ref, name, s, i) for i in range(n)]).astype(np.float64) -
                           np.stack([ref[f"replay/{name}/{s}/{i}"] for i in range(n)]))
                cell.update(replay_mean_abs=d.mean(), replay_off_by_2=(d > 2).mean())
            cells.append(cell)
        out[name] = cells, same_order(*changes)
    return out


def compare(args):
    ref = np.load(args.reference)
    print(f"{len(ref['images'])} photographs. Deterministic: mean |ours - reference| in grey levels / share off by > 2."
          f" Random: ours / reference of the mean |change| / of the sharpness; with the reference's own draws "
          f"(first {N_REPLAY} images): mean |ours - reference| / share off by > 2.\n")
    print("| corruption | " + " | ".join(f"severity {s}" for s in range(1, 6)) + " | severity order |")
    print("|---|" + "---|" * 6)
    for name, (cells, order) in table(ref, args.frost_dir, args.only).items():
        text = []
        for c in cells:
            if "mean_abs" in c:
                text.append(f"{c['mean_abs']:.2f} / {c['off_by_2']:.1%}")
            else:
                t = f"{c['change_ratio']:.2f} / {c['sharpness_ratio']:.2f}"
                if "replay_mean_abs" in c:
                    t += f"; {c['replay_mean_abs']:.2f} / {c['replay_off_by_2']:.1%}"
                text.append(t)
        print(f"| {name} | " + " | ".join(text) + f" | {order} |")


def fixture(args):
    """For tests/test_corruptions.py: a few images with the reference's deterministic outputs, and one image per
    replayable corruption and severity with the reference's draws and output (the noises, whose replay is the
    formula itself, left out)."""
    ref = np.load(args.reference)
    pick = ((np.arange(args.images) + 0.5) * len(ref["images"]) / args.images).astype(int)
    out = {"images": ref["images"][pick]}
    out.update({f"{name}/{s}": ref[f"{name}/{s}"][pick] for name in DETERMINISTIC for s in range(1, 6)})
    # image 0 for every replayable corruption and severity; and an image whose liquid layer exceeds 1 at spatter's
    # severity 3 (np.uint8 then wraps it around), stored as replay image 1
    out["replay/images"] = ref["images"][[0, 4]]
    for name, s, i, j in [(name, s, 0, 0) for name in REPLAYABLE[2:] for s in range(1, 6)] + [("spatter", 3, 4, 1)]:
        key = f"replay/{name}/{s}/{i}"
        out.update({k.replace(key, f"replay/{name}/{s}/{j}"): ref[k] for k in ref.files
                    if k == key or k.startswith(key + "/")})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    np.savez_compressed(args.out, **out)
    print(f"{args.images} + 2 images -> {args.out} ({os.path.getsize(args.out) // 1024} KB)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reference", help="run make_cifar_c.py's corruptions (scratch environment)")
    r.add_argument("folder", help="ImageNet-C/create_c of a clone of hendrycks/robustness")
    r.add_argument("--out", default="cifar_c_reference.npz")
    c = sub.add_parser("compare", help="compare ours with a reference file (repository environment)")
    c.add_argument("reference")
    c.add_argument("--frost-dir", help="the frost textures (frost is skipped without them)")
    c.add_argument("--only", nargs="+", choices=DETERMINISTIC + RANDOM, metavar="CORRUPTION",
                   help="these corruptions only")
    f = sub.add_parser("fixture", help="write the test fixture from a reference file")
    f.add_argument("reference")
    f.add_argument("--images", type=int, default=1)
    f.add_argument("--out", default=FIXTURE)
    args = p.parse_args()
    if args.command == "reference":
        if not os.path.isfile(os.path.join(args.folder, "make_cifar_c.py")):
            p.error(f"{args.folder}: no make_cifar_c.py (give ImageNet-C/create_c of a clone of hendrycks/robustness)")
        try:
            reference(args)
        except ModuleNotFoundError as e:  # scipy, skimage, cv2, wand: not the repository's
            sys.exit(f"cifar_c_fidelity.py reference: no module {e.name}: the reference runs in a scratch environment "
                     "with the release's libraries (this file's docstring gives its setup)")
        return
    if not os.path.isfile(args.reference):
        p.error(f"{args.reference}: no such file (the reference command writes it)")
    try:  # a damaged or foreign file (an .npy, text): one line, not numpy's traceback
        with np.load(args.reference) as ref:
            has_images = "images" in ref.files
    except (OSError, ValueError, EOFError, TypeError, AttributeError, zipfile.BadZipFile):
        has_images = False
    if not has_images:
        p.error(f"{args.reference}: not a file the reference command wrote (no .npz archive with its images)")
    if args.command == "fixture" and args.images < 1:
        p.error(f"--images must be at least 1, got {args.images}")
    {"compare": compare, "fixture": fixture}[args.command](args)


if __name__ == "__main__":
    main()
