"""The corruptions of CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019), generated in torch on the device, and the reader
of the official release. Data preparation for robustness.py, kept apart as nanoGPT keeps prepare.py.

Every corruption maps float images in [0, 1], (B, C, H, W), to corrupted ones, batched, drawing its randomness from a
torch.Generator; the strength per severity 1..5 is the constant of Hendrycks' CIFAR generator (make_cifar_c.py), and
each function takes the strength itself, so its identity limit (zero noise, contrast 1, ...) is a plain argument.
The release was made with ImageMagick, OpenCV, scikit-image and PIL; where this file approximates one of their
operations the function says how (the README lists them all). On 1-channel images the colour steps use luminance.

    x = corrupt(images_uint8, "snow", severity=3, generator=torch.Generator().manual_seed(0))
    x, y = read_release("CIFAR-10-C", "snow", severity=3)
"""

import math
import os

import numpy as np
import torch
import torch.nn.functional as F

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


def filter2d(x, kernel, mode="reflect"):
    """Convolve every channel with one (k, k) kernel; mode: the border, "reflect" (OpenCV's default) or "replicate"
    (scikit-image's gaussian)."""
    k = kernel.shape[-1]
    C = x.shape[1]
    x = F.pad(x, (k // 2,) * 4, mode=mode) if k // 2 < x.shape[-1] else x
    return F.conv2d(x, kernel.to(x)[None, None].expand(C, 1, k, k), groups=C)


def gaussian_kernel(sigma, radius=None):
    radius = radius if radius is not None else max(1, math.ceil(4 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=torch.float32)
    k = torch.exp(-t**2 / (2 * sigma**2))
    return torch.outer(k, k) / k.sum() ** 2


def gaussian_blur(x, sigma, g):
    return filter2d(x, gaussian_kernel(sigma), mode="replicate")


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


def motion_blur(x, c, g, angles=(-45, 45)):
    """ImageMagick-style one-sided motion blur: Gaussian-weighted copies shifted along a random angle (degrees)."""
    length, sigma = c
    lo, hi = angles
    angle = (torch.rand(len(x), generator=g, device=x.device) * (hi - lo) + lo) * math.pi / 180
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
    """The image averaged with its zooms by 1, 1.01, ... up to c, the factors of np.arange(1, c, 0.01) exactly."""
    factors = np.arange(1, c, 0.01).tolist()
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


def glass_blur(x, c, g):
    """Blur, shuffle pixels locally, blur again: from the bottom-right corner up, each pixel swaps with a neighbour
    at a random offset in [-max_shift, max_shift) (numpy's randint), one pass or two; on uint8 values in between."""
    sigma, delta, passes = c
    B, C, H, W = x.shape
    x = (gaussian_blur(x, sigma, g).clamp(0, 1) * 255).to(torch.uint8)  # np.uint8 truncates, as .to does
    rows = torch.arange(B, device=x.device)
    for _ in range(passes):
        for h in range(H - delta, delta, -1):
            for w in range(W - delta, delta, -1):
                dx, dy = torch.randint(-delta, delta, (2, B), generator=g, device=x.device)
                here, there = x[:, :, h, w].clone(), x[rows, :, h + dy, w + dx]  # (B, C) each
                x[:, :, h, w] = there
                x[rows, :, h + dy, w + dx] = here
    return gaussian_blur(x.float() / 255, sigma, g)


def snow(x, c, g):
    """Snowflakes: Gaussian noise zoomed in, thresholded, motion-blurred along a random angle in [-135, -45] and
    added with its 180-degree rotation, over the image lightened towards 1.5 grey + 0.5."""
    loc, scale, zoom_factor, threshold, length, sigma, keep = c
    B, _, H, W = x.shape
    flakes = zoom(loc + scale * torch.randn(B, 1, H, W, generator=g, device=x.device), zoom_factor)
    flakes = torch.where(flakes < threshold, 0.0, flakes).clamp(0, 1)
    flakes = (flakes * 255).floor() / 255  # the release stores the layer as an 8-bit image before blurring it
    flakes = motion_blur(flakes, (length, sigma), g, angles=(-135, -45))
    x = keep * x + (1 - keep) * torch.maximum(x, grey(x) * 1.5 + 0.5)
    return x + flakes + flakes.flip(-2, -1)


def box3(x):
    """OpenCV's 3x3 blur: the mean of each pixel's neighbourhood, the border reflected."""
    return filter2d(x, torch.full((3, 3), 1 / 9))


def edges(v):
    """Edge pixels of 8-bit images (B, 1, H, W): where the Sobel gradient (L1 norm, as OpenCV's Canny) exceeds
    Canny's high threshold 150 (no thinning or hysteresis)."""
    kx = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]])
    return filter2d(v, kx).abs() + filter2d(v, kx.T).abs() > 150


def edge_distance(e, cap):
    """Distance of each pixel to the nearest True pixel of e (B, 1, H, W), capped at `cap`: a chamfer
    approximation of OpenCV's L2 distance transform (steps 1 and sqrt 2), exact within the cap's range."""
    d = torch.where(e, 0.0, float(cap))
    for _ in range(cap):
        shifted = F.pad(d, (1, 1, 1, 1), value=float(cap)).unfold(2, 3, 1).unfold(3, 3, 1)  # (B, 1, H, W, 3, 3)
        step = torch.tensor([[2**0.5, 1, 2**0.5], [1, 0, 1], [2**0.5, 1, 2**0.5]], device=d.device)
        d = (shifted + step).amin((-2, -1)).clamp(max=cap)
    return d


def equalize(v):
    """OpenCV's equalizeHist of 8-bit images (B, 1, H, W), each on its own histogram."""
    B = len(v)
    flat = v.reshape(B, -1).long()
    hist = torch.zeros(B, 256, device=v.device).scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float))
    cdf = hist.cumsum(1)
    low = cdf.gather(1, (hist > 0).float().argmax(1, keepdim=True))  # the count of the darkest value present
    lut = ((cdf - low) * 255 / (flat.shape[1] - low).clamp(min=1)).round().clamp(0, 255)
    return lut.gather(1, flat).view_as(v)


def spatter(x, c, g):
    """Liquid spatter: blurred Gaussian noise, thresholded, as water (severities 1-3: its edge-distance texture,
    embossed, pale turquoise added) or mud (4-5: the blobs, blurred, blended in brown)."""
    loc, scale, sigma, threshold, strength, mud = c
    B, C, H, W = x.shape
    liquid = gaussian_blur(loc + scale * torch.randn(B, 1, H, W, generator=g, device=x.device), sigma, g)
    liquid = torch.where(liquid < threshold, 0.0, liquid)
    if mud:
        m = gaussian_blur((liquid > threshold).float(), strength, g)
        m = torch.where(m < 0.8, 0.0, m)
        return x * (1 - m) + colour((63, 42, 20), C, x.device) * m
    liquid = (liquid * 255).clamp(0, 255).floor()  # the release's uint8 layer
    dist = box3(edge_distance(edges(liquid), 20)).floor()
    emboss = torch.tensor([[-2.0, -1, 0], [-1, 1, 1], [0, 1, 2]])
    dist = box3(filter2d(equalize(dist), emboss).round().clamp(0, 255))
    m = liquid * dist
    m = m / m.amax((2, 3), keepdim=True).clamp(min=1e-12) * strength
    return x + m * colour((175, 238, 238), C, x.device)


def load_frost(folder):
    """The six frost textures of Hendrycks' release, each scaled to 0.2 of its size as the generator does: a list
    of (3, h, w) float tensors in [0, 255]. A missing folder or file is a FileNotFoundError that says where to get
    them."""
    from PIL import Image

    textures = []
    for name in FROST_FILES:
        path = os.path.join(folder or "", name)
        if not folder or not os.path.isfile(path):
            raise FileNotFoundError(f"frost needs the six frost images of Hendrycks' release ({', '.join(FROST_FILES)}"
                                    ", in ImageNet-C/create_c/ of github.com/hendrycks/robustness) in --frost-dir; "
                                    f"{path if folder else 'no --frost-dir was given'}")
        try:
            img = torch.from_numpy(np.array(Image.open(path).convert("RGB"), dtype=np.float32)).permute(2, 0, 1)
        except OSError as e:
            raise ValueError(f"{path} is present but not a readable image ({e})") from None
        h, w = img.shape[1:]
        textures.append(F.interpolate(img[None], size=(round(h * 0.2), round(w * 0.2)), mode="bilinear",
                                      align_corners=False)[0])
    return textures


def frost(x, c, g, textures):
    """c[0] x + c[1] frost, on 0..255 values: per image a random crop of one of the first five textures (the
    generator draws randint(5) of its six files)."""
    B, C, H, W = x.shape
    pick = torch.randint(5, (B,), generator=g, device=x.device)
    u = torch.rand(2, B, generator=g, device=x.device)  # where the crop starts, as a fraction of the free range
    crops = x.new_empty(B, 3, H, W)
    for k in range(5):
        tex, n = textures[k].to(x.device), (pick == k).nonzero().squeeze(1)
        top = (u[0, n] * (tex.shape[1] - H + 1)).long().clamp(max=tex.shape[1] - H)
        left = (u[1, n] * (tex.shape[2] - W + 1)).long().clamp(max=tex.shape[2] - W)
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
    """uint8 (B, C, H, W) images -> the corrupted uint8 images (rounded, as in the released files). frost_dir: the
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
    return (x.clamp(0, 1) * 255).round().to(torch.uint8)


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
