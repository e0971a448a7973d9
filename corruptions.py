"""The corruptions of CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019), generated in torch on the device, and the reader
of the official release. Data preparation for robustness.py, kept apart as nanoGPT keeps prepare.py.

Every corruption maps float images in [0, 1], (B, C, H, W), to corrupted ones, batched, drawing its randomness from a
torch.Generator; the strength per severity 1..5 is the constant of Hendrycks' CIFAR generator (make_cifar_c.py), and
each function takes the strength itself, so its identity limit (zero noise, contrast 1, ...) is a plain argument.
The release was made with ImageMagick, OpenCV, scikit-image, SciPy and PIL; each function here follows
make_cifar_c.py step by step (the same kernels, borders, 8-bit roundings and order of steps) and calls PIL itself for
pixelate and JPEG. Measured against the generator itself on 220 photographs (tools/cifar_c_fidelity.py; the table is
in RESULTS.md, CIFAR-10-C fidelity), at every severity:
- deterministic, equal to float rounding: zoom blur, contrast, pixelate, JPEG (0.00 grey levels apart on average),
  Gaussian blur, defocus blur, brightness, saturate (at most 0.07; no value more than 1 level apart);
- random, equal given the release's own draws (replayed into torch): Gaussian and speckle noise, motion blur, snow,
  fog, spatter (0.00 apart), glass blur (0.02); elastic transform 0.13-0.19 (OpenCV's fixed-point interpolation);
- random, the same distribution: shot noise, impulse noise, frost (mean change 0.94-1.03 of the release's).
Each random corruption changes an image by 0.94-1.04 times as much as the release on average, and is as sharp (0.98-
1.03). On 1-channel images the colour steps use luminance.

    x = corrupt(images_uint8, "snow", severity=3, generator=torch.Generator().manual_seed(0))
    x, y = read_release("CIFAR-10-C", "snow", severity=3)
"""

import functools
import io
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

# RobustBench's mean corruption accuracy is over the 15 standard corruptions; the release adds 4 more
STANDARD = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
            "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression"]
EXTRA = ["speckle_noise", "gaussian_blur", "spatter", "saturate"]
SEVERITY = {
    "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],  # noise std
    "shot_noise": [500, 250, 100, 75, 50],  # photons per unit intensity (Poisson)
    "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],  # fraction of salt-and-pepper values
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],  # disk radius, anti-alias sigma
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],  # sigma, max shift, passes
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],  # length, sigma; random angle in [-45, 45]
    "zoom_blur": [1.06, 1.11, 1.16, 1.21, 1.26],  # zoom factors np.arange(1, c, 0.01)
    "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9), (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
             (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85), (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
    # snow: flake mean, std, zoom, threshold, motion length, motion sigma, how much of the image is kept
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],  # weight of the image, of the frost
    "fog": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],  # strength, fractal decay
    "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],  # added to the HSV value
    "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],  # factor towards the mean
    "elastic_transform": [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                          (0.1, 0.03, 0.03)],  # displacement, its smoothness, affine jitter; fractions of the size
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],  # downscale factor
    "jpeg_compression": [80, 65, 58, 50, 40],  # JPEG quality
    "speckle_noise": [0.06, 0.10, 0.12, 0.16, 0.20],  # multiplicative noise std
    "gaussian_blur": [0.4, 0.6, 0.7, 0.8, 1.0],  # sigma
    "spatter": [(0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0), (0.65, 0.3, 1, 0.69, 0.5, 0),
                (0.65, 0.1, 0.7, 0.69, 0.6, 1), (0.65, 0.1, 0.5, 0.68, 0.6, 1)],
    # spatter: liquid mean, std, blur sigma, threshold, strength (water) or mud blur sigma, mud (1) or water (0)
    "saturate": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],  # HSV saturation * a + b
}
FROST_FILES = ["frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg"]


def truncate(v):
    """np.uint8 of values in 0..255: truncated (1e-5 absorbs float32's rounding, so an exact k stays k)."""
    return (v + 1e-5).floor()


def grey(x):
    """Luminance (ITU-R 601, as OpenCV's RGB2GRAY), (B, 1, H, W); a 1-channel image is its own."""
    return x if x.shape[1] == 1 else (0.299 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])


def colour(rgb, channels, device):
    """An RGB colour (0..255) as a (1, C, 1, 1) tensor in [0, 1]; its luminance for 1-channel images."""
    c = torch.tensor(rgb, dtype=torch.float32, device=device)[None, :, None, None] / 255
    return grey(c) if channels == 1 else c


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


def pad(x, r, mode):
    """Pad the last two dimensions by r: "reflect" is OpenCV's default border (d c b | a b c d), "symmetric" SciPy's
    "reflect" (c b a | a b c d), "replicate" SciPy's "nearest"."""
    if mode != "symmetric":
        return F.pad(x, (r,) * 4, mode=mode)
    x = torch.cat([x[..., :r, :].flip(-2), x, x[..., -r:, :].flip(-2)], -2)
    return torch.cat([x[..., :r].flip(-1), x, x[..., -r:].flip(-1)], -1)


def filter2d(x, kernel, mode="reflect"):
    """Correlate every channel with one (k, k) kernel (as OpenCV's filter2D), the border padded by `mode`."""
    k = kernel.shape[-1]
    C = x.shape[1]
    return F.conv2d(pad(x, k // 2, mode), kernel.to(x)[None, None].expand(C, 1, k, k), groups=C)


def gaussian_kernel(sigma, radius=None, truncate=4.0):
    """SciPy's 1D Gaussian, normalised: radius int(truncate * sigma + 0.5) unless given."""
    radius = int(truncate * sigma + 0.5) if radius is None else radius
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-t**2 / (2 * sigma**2))
    return k / k.sum()


def gaussian_filter(x, sigma, mode="replicate", truncate=4.0):
    """SciPy's gaussian_filter of the last two dimensions: the 1D kernel down the columns, then along the rows."""
    k = gaussian_kernel(sigma, truncate=truncate).to(x)
    C, n = x.shape[1], len(k)
    x = F.conv2d(pad(x, n // 2, mode), k.view(1, 1, n, 1).expand(C, 1, n, 1), groups=C)
    return F.conv2d(x, k.view(1, 1, 1, n).expand(C, 1, 1, n), groups=C)


def gaussian_blur(x, sigma, g):
    """scikit-image's gaussian: SciPy's filter, truncated at 4 sigma, the border replicated ("nearest")."""
    return gaussian_filter(x, sigma)


def defocus_blur(x, c, g):
    """A disk of the given radius on a 17x17 grid, anti-aliased by a 3x3 Gaussian of sigma c[1]."""
    radius, alias = c
    t = torch.arange(-8, 9, dtype=torch.float32)
    disk = ((t[:, None] ** 2 + t[None, :] ** 2) <= radius**2).float()
    k = gaussian_kernel(alias, radius=1)
    disk = filter2d((disk / disk.sum())[None, None], torch.outer(k, k).float())[0, 0]
    return filter2d(x, disk)


def motion(x, radius, sigma, angle):
    """ImageMagick's MotionBlurImage of 8-bit images, angle in degrees per image (B,): output pixel p is the
    Gaussian-weighted mean (sigma, 2 ceil(radius) + 1 taps, weights exp(-i^2 / 2 sigma^2)) of the pixels at
    p + round(i (cos, sin)(angle)), i = 0, 1, ..., edges clamped; rounded to ImageMagick's 16-bit quantum, then
    truncated to the 8-bit PNG it returns (as the release's ImageMagick 6 Q16 does)."""
    B, C, H, W = x.shape
    taps = torch.arange(2 * math.ceil(radius) + 1, device=x.device, dtype=torch.float64)
    weights = torch.exp(-taps**2 / (2 * sigma**2))
    weights = (weights / weights.sum()).tolist()
    a = angle.double()[:, None] * math.pi / 180
    dx, dy = (torch.ceil(taps * a.cos() - 0.5).long(), torch.ceil(taps * a.sin() - 0.5).long())  # (B, taps)
    ys, xs = torch.arange(H, device=x.device), torch.arange(W, device=x.device)
    flat, out = x.double().flatten(2), torch.zeros(B, C, H * W, device=x.device, dtype=torch.float64)
    for i, w in enumerate(weights):
        rows = (ys[None] + dy[:, i, None]).clamp(0, H - 1)[:, :, None]  # (B, H, 1)
        cols = (xs[None] + dx[:, i, None]).clamp(0, W - 1)[:, None, :]  # (B, 1, W)
        out += w * flat.gather(2, (rows * W + cols).view(B, 1, H * W).expand(B, C, H * W))
    out = out.view(B, C, H, W)
    return ((out * 255 * 257).round() / 257).floor().to(x.dtype) / 255


def motion_blur(x, c, g):
    """ImageMagick's motion blur (radius, sigma) at an angle drawn uniformly in [-45, 45] degrees per image."""
    return motion(x, *c, torch.rand(len(x), generator=g, device=x.device) * 90 - 45)


def clipped_zoom(x, z):
    """make_cifar_c's clipped_zoom: the ceil(H / z) central rows and columns (from (H - ch) // 2), zoomed by SciPy
    (order 1, corner to corner) to round(ch * z), then trimmed back to H from ((round(ch * z) - H) // 2). The crop
    is whole pixels, so the zoom is quantised and its centre sits up to half a pixel up-left."""
    H, W = x.shape[-2:]
    ch, cw = math.ceil(H / z), math.ceil(W / z)
    top, left = (H - ch) // 2, (W - cw) // 2
    oh, ow = round(ch * z), round(cw * z)
    out = F.interpolate(x[..., top:top + ch, left:left + cw], size=(oh, ow), mode="bilinear", align_corners=True)
    top, left = (oh - H) // 2, (ow - W) // 2
    return out[..., top:top + H, left:left + W]


def zoom_blur(x, c, g):
    """The image averaged with its clipped zooms by 1, 1.01, ... up to c, the factors of np.arange(1, c, 0.01)."""
    factors = np.arange(1, c, 0.01).tolist()
    return (x + sum(clipped_zoom(x, z) for z in factors)) / (len(factors) + 1)


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


def through_pil(x, fn):
    """Apply fn (a PIL image -> a PIL image) to each image of x as the 8-bit image it is, on the CPU."""
    u8 = (x * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    out = [np.asarray(fn(Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a))) for a in u8]
    out = torch.from_numpy(np.stack(out)).to(x.device)
    return (out[:, None] if out.ndim == 3 else out.permute(0, 3, 1, 2)).float() / 255


def pixelate(x, c, g):
    """PIL's BOX resize to int(c * size), then back up with BOX (as the release)."""
    H, W = x.shape[-2:]
    return through_pil(x, lambda img: img.resize((int(W * c), int(H * c)), Image.BOX).resize((W, H), Image.BOX))


def jpeg_compression(x, quality, g):
    """PIL's JPEG codec (libjpeg; 4:2:0 chroma for colour), saved at this quality and read back, as the release."""
    def codec(img):
        buffer = io.BytesIO()
        img.save(buffer, "JPEG", quality=quality)
        return Image.open(buffer)

    return through_pil(x, codec)


def sample(x, read, align_corners):
    """Bilinear values of x at the pixel coordinates read (B, H, W, 2) as (x, y), the border reflected: about the
    edge pixels' centres with align_corners (OpenCV's BORDER_REFLECT_101), about their outer edges without (SciPy's
    "reflect")."""
    H, W = x.shape[-2:]
    size = torch.tensor([W, H], device=x.device, dtype=read.dtype)
    grid = read / (size - 1) * 2 - 1 if align_corners else (read + 0.5) / size * 2 - 1
    return F.grid_sample(x, grid.to(x.dtype), align_corners=align_corners, padding_mode="reflection")


def elastic_transform(x, c, g):
    """Two resamplings, as the release: an affine warp that moves three points by up to c[2] (OpenCV's warpAffine,
    positions on its 1/32-pixel grid), then a displacement field of uniform noise smoothed by a Gaussian of sigma
    c[1] (truncated at 3 sigma, SciPy's reflected border) and scaled by c[0] (SciPy's map_coordinates, order 1).
    c is in fractions of the image height."""
    B, _, H, W = x.shape
    disp, smooth, jitter = (v * H for v in c)
    centre, half = torch.tensor([H // 2, W // 2], dtype=torch.float64), min(H, W) // 3
    before = torch.stack([centre + half, centre + torch.tensor([half, -half]), centre - half])  # (3, 2) as (x, y)
    after = before + (torch.rand(B, 3, 2, generator=g, device=x.device).cpu().double() * 2 - 1) * jitter
    # the warp reads output point p at M p, M the affine map that takes the moved points back to the original ones
    M = torch.linalg.solve(torch.cat([after, torch.ones(B, 3, 1, dtype=torch.float64)], -1), before.expand(B, 3, 2))
    ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float64), torch.arange(W, dtype=torch.float64), indexing="ij")
    read = (torch.stack([xs, ys, torch.ones_like(xs)], -1).view(1, -1, 3) @ M).view(B, H, W, 2)
    x = sample(x, (read * 32).round().to(x.device) / 32, align_corners=True)
    if disp == 0:
        return x  # severity 1: SciPy then reads every pixel at its own place
    noise = torch.rand(B, 2, H, W, generator=g, device=x.device, dtype=torch.float64) * 2 - 1  # (dx, dy) fields
    field = gaussian_filter(noise, smooth, mode="symmetric", truncate=3) * disp
    read = torch.stack([xs, ys], -1).to(x.device)[None] + field.permute(0, 2, 3, 1)
    return sample(x, read, align_corners=False)


def glass_blur(x, c, g):
    """Blur, shuffle pixels locally, blur again: from the bottom-right corner up, each pixel takes the value of a
    neighbour at a random offset in [-max_shift, max_shift) (numpy's randint), one pass or two; on uint8 values in
    between. The release's "swap" (`x[h, w], x[h', w'] = x[h', w'], x[h, w]` on numpy views) is in fact this copy:
    the second assignment reads the value the first has just written, so each pass moves a value one step."""
    sigma, delta, passes = c
    B, C, H, W = x.shape
    x = truncate(gaussian_blur(x, sigma, g).clamp(0, 1) * 255).to(torch.uint8)
    rows = torch.arange(B, device=x.device)
    for _ in range(passes):
        for h in range(H - delta, delta, -1):
            for w in range(W - delta, delta, -1):
                dx, dy = torch.randint(-delta, delta, (2, B), generator=g, device=x.device)
                x[:, :, h, w] = x[rows, :, h + dy, w + dx]
    return gaussian_blur(x.float() / 255, sigma, g)


def snow(x, c, g):
    """Snowflakes: Gaussian noise, clipped-zoomed, thresholded, stored as an 8-bit image, motion-blurred by
    ImageMagick along a random angle in [-135, -45] and added with its 180-degree rotation, over the image lightened
    towards 1.5 grey + 0.5."""
    loc, scale, zoom_factor, threshold, radius, sigma, keep = c
    B, _, H, W = x.shape
    flakes = clipped_zoom(loc + scale * torch.randn(B, 1, H, W, generator=g, device=x.device), zoom_factor)
    flakes = torch.where(flakes < threshold, 0.0, flakes).clamp(0, 1)
    flakes = truncate(flakes * 255) / 255
    flakes = motion(flakes, radius, sigma, torch.rand(B, generator=g, device=x.device) * 90 - 135)
    x = keep * x + (1 - keep) * torch.maximum(x, grey(x) * 1.5 + 0.5)
    return x + flakes + flakes.flip(-2, -1)


def neighbours(v, fill):
    """v (B, 1, H, W) padded once with `fill`: at(dy, dx) is v moved so that pixel p holds v[p + (dy, dx)],
    |dy|, |dx| <= 2."""
    H, W = v.shape[-2:]
    padded = F.pad(v, (2, 2, 2, 2), value=fill)
    return lambda dy, dx: padded[..., 2 + dy:2 + dy + H, 2 + dx:2 + dx + W]


def canny(v, low=50, high=150):
    """OpenCV's Canny of 8-bit images (B, 1, H, W), aperture 3, L1 gradient: the Sobel gradient (border replicated),
    non-maximum suppression across the gradient's direction quantised to 0, 45, 90 or 135 degrees (OpenCV's
    fixed-point tan 22.5 test and its > / >= ties), then hysteresis: edges grow from pixels above `high` through
    8-connected ones above `low`."""
    sobel = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]])
    dx, dy = filter2d(v, sobel, "replicate"), filter2d(v, sobel.T, "replicate")  # integers: float32 is exact
    mag = dx.abs() + dy.abs()
    at = neighbours(mag, 0.0)  # the magnitude of a neighbour, 0 outside
    tg22 = int(0.4142135623730950488 * 2**15 + 0.5)
    ax, ay = dx.abs(), dy.abs() * 2**15
    horizontal = ay < ax * tg22
    vertical = ay > ax * tg22 + ax * 2**16
    diagonal = torch.where((dx < 0) != (dy < 0), (mag > at(-1, 1)) & (mag > at(1, -1)),
                           (mag > at(-1, -1)) & (mag > at(1, 1)))
    peak = torch.where(horizontal, (mag > at(0, -1)) & (mag >= at(0, 1)),
                       torch.where(vertical, (mag > at(-1, 0)) & (mag >= at(1, 0)), diagonal))
    weak = peak & (mag > low)
    edge = weak & (mag > high)
    while True:
        grown = weak & (F.max_pool2d(edge.float(), 3, 1, 1) > 0)
        if torch.equal(grown, edge):
            return edge
        edge = grown


def edge_distance(e, cap=20):
    """OpenCV's distanceTransform(DIST_L2, 5) to the nearest pixel of e (B, 1, H, W), truncated at cap: the 5x5
    chamfer distance, steps 1, 1.4 and 2.1969 in 16-bit fixed point, as a shortest path (pixels off the image do
    not count). Paths of length <= cap take at most cap steps, so cap rounds of relaxation are exact."""
    steps = {(dy, dx): round(w * 2**16) for dy in range(-2, 3) for dx in range(-2, 3)
             for w in [{1: 1.0, 2: 1.4, 5: 2.1969}.get(dy * dy + dx * dx)] if w}
    far = float(cap + 3) * 2**16
    d = torch.where(e, 0.0, far)  # integers below 2^24: float32 is exact
    for _ in range(cap):
        at = neighbours(d, far)
        d = torch.stack([at(dy, dx) + w for (dy, dx), w in steps.items()] + [d]).amin(0)
    return (d.double() / 2**16).clamp(max=cap)


def box3(x):
    """OpenCV's 3x3 blur: the sum of each pixel's neighbourhood times 1/9 (in double), the border reflected."""
    return filter2d(x.double(), torch.ones(3, 3, dtype=torch.float64)) * (1 / 9)


def equalize(v):
    """OpenCV's equalizeHist of 8-bit images (B, 1, H, W), each on its own histogram: the darkest value present
    goes to 0, the others to round(cdf above it * 255 / pixels above it) in float32; an image of one value stays."""
    B = len(v)
    flat = v.reshape(B, -1).long()
    hist = torch.zeros(B, 256, device=v.device).scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float))
    cdf = hist.cumsum(1)
    low = cdf.gather(1, (hist > 0).float().argmax(1, keepdim=True))  # the count of the darkest value present
    scale = (255 / (flat.shape[1] - low)).float()
    lut = ((cdf - low).float() * scale).round().clamp(0, 255)
    lut = torch.where(low == flat.shape[1], torch.arange(256.0, device=v.device), lut)
    return lut.gather(1, flat).view_as(v).to(v.dtype)


def water(liquid):
    """The water texture of spatter from the 8-bit liquid layer (B, 1, H, W), step by step as make_cifar_c.py: the
    distance to Canny's edges truncated at 20, a 3x3 blur truncated to 8 bits, equalised, embossed (OpenCV's
    filter2D to 8 bits, rounded), blurred again to 8 bits; times the liquid."""
    dist = box3(edge_distance(canny(liquid), 20)).floor()
    emboss = torch.tensor([[-2.0, -1, 0], [-1, 1, 1], [0, 1, 2]], dtype=torch.float64)
    dist = box3(filter2d(equalize(dist), emboss).round().clamp(0, 255)).round()
    return liquid.double() * dist


def spatter(x, c, g):
    """Liquid spatter: Gaussian noise blurred and thresholded, as water (severities 1-3: its edge-distance texture,
    embossed, pale turquoise added) or mud (4-5: the blobs, blurred, blended in brown)."""
    loc, scale, sigma, threshold, strength, mud = c
    B, C, H, W = x.shape
    liquid = gaussian_blur(loc + scale * torch.randn(B, 1, H, W, generator=g, device=x.device), sigma, g)
    liquid = torch.where(liquid < threshold, 0.0, liquid)
    if mud:
        m = gaussian_blur((liquid > threshold).float(), strength, g)
        m = torch.where(m < 0.8, 0.0, m)
        return x * (1 - m) + colour((63, 42, 20), C, x.device) * m
    liquid = truncate(liquid * 255) % 256  # astype(np.uint8): above 255 it wraps around (as on x86)
    m = water(liquid).float()
    m = m / m.amax((2, 3), keepdim=True).clamp(min=1e-12) * strength
    return x + m * colour((175, 238, 238), C, x.device)


@functools.lru_cache(maxsize=4)  # read once per folder, not once per batch and severity
def load_frost(folder):
    """The six frost textures of Hendrycks' release, each scaled to 0.2 of its size as the generator does: a tuple
    of (3, h, w) float tensors in [0, 255], not to be changed (they are cached). A missing folder or file is a
    FileNotFoundError that says where to get them."""
    textures = []
    for name in FROST_FILES:
        path = os.path.join(folder or "", name)
        if not folder or not os.path.isfile(path):
            raise FileNotFoundError(f"frost needs the six frost images of Hendrycks' release ({', '.join(FROST_FILES)}"
                                    ", in ImageNet-C/create_c/ of github.com/hendrycks/robustness) in frost_dir= "
                                    f"(--frost-dir); {path + ' is missing' if folder else 'no folder was given'}")
        try:
            img = torch.from_numpy(np.array(Image.open(path).convert("RGB"), dtype=np.float32)).permute(2, 0, 1)
        except OSError as e:
            raise ValueError(f"{path} is present but not a readable image ({e})") from None
        h, w = img.shape[1:]
        textures.append(F.interpolate(img[None], size=(round(h * 0.2), round(w * 0.2)), mode="bilinear",
                                      align_corners=False)[0].round())  # cv2.resize of an 8-bit image
    return tuple(textures)


def frost(x, c, g, textures):
    """c[0] x + c[1] frost, on 0..255 values: per image a random crop of one of the first five textures (the
    generator draws randint(5) of its six files)."""
    B, C, H, W = x.shape
    pick = torch.randint(5, (B,), generator=g, device=x.device)
    u = torch.rand(2, B, generator=g, device=x.device)  # the crop's start: randint(0, size - H), as a fraction
    crops = x.new_empty(B, 3, H, W)
    for k in range(5):
        tex, n = textures[k].to(x.device), (pick == k).nonzero().squeeze(1)
        top = (u[0, n] * (tex.shape[1] - H)).long().clamp(max=tex.shape[1] - H - 1)
        left = (u[1, n] * (tex.shape[2] - W)).long().clamp(max=tex.shape[2] - W - 1)
        rows = (top[:, None] + torch.arange(H, device=x.device))[:, :, None]  # (n, H, 1)
        cols = (left[:, None] + torch.arange(W, device=x.device))[:, None, :]  # (n, 1, W)
        crops[n] = tex[:, rows, cols].permute(1, 0, 2, 3)  # (n, 3, H, W)
    crops = crops / 255
    return x * c[0] + (grey(crops) if C == 1 else crops) * c[1]


CORRUPTIONS = {name: globals()[name] for name in SEVERITY}


def check_corruption(name, severity):
    """A ValueError unless name is one of the 19 corruptions and severity one of 1..5 (not an index: 0 or -1 would
    silently mean severity 5 or 4)."""
    if not isinstance(name, str) or name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; choose from {', '.join(CORRUPTIONS)}")
    if not isinstance(severity, int) or isinstance(severity, bool) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be one of 1, 2, 3, 4, 5, got {severity!r}")


def corrupt(images, name, severity, generator, frost_dir=None):
    """uint8 (B, C, H, W) images -> the corrupted uint8 images (truncated, as in the released files). frost_dir: the
    folder of the six frost textures (only for frost)."""
    check_corruption(name, severity)
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4:
        raise ValueError(f"images must be a uint8 (B, C, H, W) tensor, got {getattr(images, 'dtype', type(images))} "
                         f"of shape {tuple(getattr(images, 'shape', ()))}")
    fn = CORRUPTIONS[name]
    if name == "frost":
        textures = load_frost(frost_dir)
        fn = lambda x, c, g: frost(x, c, g, textures)  # noqa: E731
    x = fn(images.float() / 255, SEVERITY[name][severity - 1], generator)
    return truncate(x.clamp(0, 1) * 255).to(torch.uint8)


def check_release(folder, names, image_shape):
    """Open every file of the release that `names` need (mapped, not read) and check it before any training: a
    missing, unreadable or misshapen file, labels that do not match, or images of another size than image_shape
    (C, H, W) of the dataset, are a ValueError (FileNotFoundError when missing) naming the file."""
    C, H, W = image_shape
    labels = None
    for file in ["labels.npy"] + [f"{name}.npy" for name in names]:
        path = os.path.join(folder, file)
        try:
            a = np.load(path, mmap_mode="r")
        except FileNotFoundError:
            raise FileNotFoundError(f"no {path}: get CIFAR-10-C from https://zenodo.org/record/2535967, or drop "
                                    "--cifar10c-dir to generate the corruptions") from None
        except (ValueError, OSError) as e:
            raise ValueError(f"{path} is present but not a readable .npy array ({e})") from None
        if labels is None:
            if a.ndim != 1 or len(a) % 5 or not np.issubdtype(a.dtype, np.integer):
                raise ValueError(f"{path} holds {a.dtype} of shape {a.shape}: expected integer labels in 5 severity "
                                 "blocks")
            labels = a
        elif a.shape != (len(labels), H, W, C) or a.dtype != np.uint8:
            raise ValueError(f"{path} holds {a.dtype} of shape {a.shape}: expected uint8 {(len(labels), H, W, C)} "
                             f"(one image per label, the dataset's {C}x{H}x{W} images)")


def read_release(folder, name, severity, n=None):
    """The official CIFAR-10-C arrays: <name>.npy (50000, 32, 32, 3) uint8, severity s = rows (s-1)*10000 on; the
    first n of them (all by default). Returns uint8 images (n, 3, 32, 32) and int64 labels."""
    check_corruption(name, severity)
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be None (all) or a number of images >= 1, got {n!r}")
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
    if n is not None and n > per:
        raise ValueError(f"--n-corrupt {n} asks for more than the {per} images per severity in {name}.npy")
    rows = slice((severity - 1) * per, (severity - 1) * per + (n or per))
    images = torch.from_numpy(np.array(x[rows])).permute(0, 3, 1, 2)  # a copy of the mapped rows, NHWC -> NCHW
    return images, torch.from_numpy(y[rows].astype(np.int64))
