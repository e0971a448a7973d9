"""robustness.py: the generated corruptions (shape, dtype, range, strength growing with severity, identity limits),
the CIFAR-10-C reader on a tiny fake release, the regulariser's noise, sharpness, and a short end-to-end run."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import robustness as R
import vision

MONOTONE = [c for c in R.SEVERITY if c not in ("saturate", "pixelate", "elastic_transform")]


def smooth_images(n, c, s, seed=1):
    """Image-like uint8 inputs: random colours at 1/4 resolution, upsampled bilinearly."""
    z = torch.rand(n, c, s // 4, s // 4, generator=torch.Generator().manual_seed(seed))
    return (F.interpolate(z, size=(s, s), mode="bilinear", align_corners=False) * 255).round().to(torch.uint8)


def change(a, b):
    return (a.float() - b.float()).abs().mean().item()


@pytest.mark.parametrize("shape", [(3, 32), (1, 28)])
@pytest.mark.parametrize("name", list(R.SEVERITY))
def test_corruptions_keep_shape_dtype_range(name, shape):
    x = smooth_images(6, *shape)
    for s in range(1, 6):
        y = R.corrupt(x, name, s, torch.Generator().manual_seed(s))
        assert y.shape == x.shape and y.dtype == torch.uint8


@pytest.mark.parametrize("name", MONOTONE)
def test_strength_grows_with_severity(name):
    """Mean pixel change from the clean image grows with the severity (small tolerance for random draws)."""
    x = smooth_images(64, 3, 32)
    d = [change(R.corrupt(x, name, s, torch.Generator().manual_seed(0)), x) for s in range(1, 6)]
    assert all(b >= a - 0.3 for a, b in zip(d, d[1:])), d
    assert d[-1] > d[0] + 1, d


def test_severity_of_the_three_non_monotone_corruptions():
    """Saturate: severities 1-2 desaturate, 3-5 oversaturate. Pixelate: the effective resolution falls. Elastic: with
    the affine jitter removed, the local displacement grows (the release trades jitter for local distortion)."""
    x = smooth_images(32, 3, 32).float() / 255
    sat = lambda img: ((img.amax(1) - img.amin(1)) / img.amax(1).clamp_min(1e-6)).mean().item()  # noqa: E731
    s0 = sat(x)
    sats = [sat(R.saturate(x, R.SEVERITY["saturate"][s - 1], None)) for s in range(1, 6)]
    assert sats[0] < s0 and sats[1] < sats[0] and all(v > s0 for v in sats[2:])
    distinct = [len(torch.unique(R.pixelate(x, c, None)[0, 0, 0])) for c in R.SEVERITY["pixelate"]]
    assert distinct == sorted(distinct, reverse=True) and distinct[-1] <= int(32 * 0.65)
    local = [change(R.elastic_transform(x, (d, sm, 0.0), torch.Generator().manual_seed(0)), x)
             for d, sm, _ in R.SEVERITY["elastic_transform"][1:]]
    assert local == sorted(local) and local[-1] > local[0]


@pytest.mark.parametrize("name,identity", [("gaussian_noise", 0.0), ("speckle_noise", 0.0), ("impulse_noise", 0.0),
                                           ("contrast", 1.0), ("brightness", 0.0), ("saturate", (1.0, 0.0)),
                                           ("pixelate", 1.0), ("zoom_blur", 0.0), ("fog", (0.0, 2.0)),
                                           ("motion_blur", (1, 1.0)), ("elastic_transform", (0.0, 0.0, 0.0))])
def test_zero_strength_leaves_the_image_unchanged(name, identity):
    x = smooth_images(8, 3, 32).float() / 255
    y = R.CORRUPTIONS[name](x, identity, torch.Generator().manual_seed(0))
    assert torch.allclose(y, x, atol=1e-5), (y - x).abs().max()


def test_jpeg_at_quality_100_is_nearly_lossless_and_degrades():
    """Luminance at quality 100 (all quantisation steps 1) is nearly lossless; colour also loses the 4:2:0
    subsampled chroma; lower quality loses more."""
    grey = smooth_images(8, 1, 32).float() / 255
    assert (R.jpeg_compression(grey, 100, None) - grey).abs().mean() < 1 / 255
    x = smooth_images(8, 3, 32).float() / 255
    errors = [(R.jpeg_compression(x, q, None) - x).abs().mean().item() for q in [100, 80, 40, 10]]
    assert errors == sorted(errors)


def test_reader_of_the_official_release(tmp_path):
    """A fake release: <name>.npy (5 * 4, 32, 32, 3) and labels.npy; severity s is the s-th block of 4 rows."""
    x = np.arange(5 * 4 * 32 * 32 * 3, dtype=np.int64).reshape(20, 32, 32, 3) % 251
    np.save(tmp_path / "fog.npy", x.astype(np.uint8))
    np.save(tmp_path / "labels.npy", np.arange(20, dtype=np.uint8) % 10)
    images, labels = R.read_release(str(tmp_path), "fog", 3)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert torch.equal(images, torch.from_numpy(x[8:12].astype(np.uint8)).permute(0, 3, 1, 2))
    assert labels.tolist() == [8, 9, 0, 1]
    assert R.read_release(str(tmp_path), "fog", 5, n=2)[0].shape[0] == 2
    with pytest.raises(FileNotFoundError, match="zenodo"):
        R.read_release(str(tmp_path), "snow", 1)


def test_regulariser_noise_touches_one_patch_per_image():
    x = torch.zeros(16, 3, 32, 32)
    y = R.random_patch_noise(x, 8, 1.0, torch.Generator().manual_seed(0))
    from common import patchify
    touched = (patchify(y, 8) != 0).any(-1).sum(1)
    assert (touched == 1).all()


def test_sharpness_with_zero_std_is_zero_and_leaves_weights_untouched():
    args = vision.parse_args(["--dataset", "fake", "--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16"])
    for name in ["resnet18", "vit"]:
        torch.manual_seed(0)
        model = vision.build_model(name, args, 3, 32, 10)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        x = torch.randn(6, 3, 32, 32)
        zero = R.sharpness(model, x, 0.0, 2, torch.Generator().manual_seed(0))
        assert zero == {"shop": 0.0, "shop_stderr": 0.0, "shpred": 0.0, "shpred_stderr": 0.0}
        sharp = R.sharpness(model, x, 0.05, 3, torch.Generator().manual_seed(0))
        assert sharp["shop"] > 0 and 0 <= sharp["shpred"] <= 1 and sharp["shop_stderr"] > 0
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm stats too


def test_end_to_end_and_from_vision(tmp_path):
    small = ["--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16", "--mlp-dim", "32", "--n-train", "60",
             "--n-sens", "5", "--epochs", "1", "--out-dir", str(tmp_path), "--dataset", "fake28"]
    argv = small + ["--model", "vit", "--variants", "vanilla", "augment", "reg", "--corruptions", "gaussian_noise",
                    "fog", "--severities", "1", "5", "--n-corrupt", "20", "--n-sharp", "10", "--sharp-reps", "1",
                    "--run-name", "t"]
    R.main(R.parse_args(argv))
    data = json.loads((tmp_path / "robustness" / "t" / "metrics.json").read_text())
    assert set(data["runs"]) == {"vit-vanilla/seed0", "vit-augment/seed0", "vit-reg/seed0"}
    final = data["runs"]["vit-reg/seed0"]["final"]
    assert set(final["corruption_acc"]) == {"gaussian_noise", "fog"}
    assert set(final["corruption_acc"]["fog"]) == {"1", "5"}
    for key in ["sens", "sens_stderr", "train_acc", "test_acc", "mean_corruption_acc", "shop", "shpred"]:
        assert isinstance(final[key], float), key
    assert (tmp_path / "robustness" / "t" / "corruptions.png").exists()
    # a vision.py run saved with --save-model, evaluated without training
    vision.main(vision.parse_args(small + ["--model", "mlp", "--run-name", "v", "--save-model"]))
    argv = ["--from-vision", str(tmp_path / "vision" / "v"), "--corruptions", "contrast", "--severities", "2",
            "--n-corrupt", "10", "--n-sharp", "10", "--sharp-reps", "1", "--out-dir", str(tmp_path), "--run-name", "e"]
    data = R.main(R.parse_args(argv))
    assert set(data["runs"]) == {"mlp-vanilla/seed0"} and "shop" in data["runs"]["mlp-vanilla/seed0"]["final"]


def test_training_honours_vision_flags(tmp_path, monkeypatch):
    """robustness.py trains through vision.train_one, so vision's flags (here --optimizer adam) take effect."""
    made = []
    real = torch.optim.Adam
    monkeypatch.setattr(torch.optim, "Adam", lambda *a, **k: made.append(1) or real(*a, **k))
    argv = ["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--variants", "reg", "--optimizer", "adam",
            "--lr", "1e-3", "--epochs", "1", "--n-train", "40", "--n-sens", "4", "--corruptions", "contrast",
            "--severities", "1", "--n-corrupt", "10", "--n-sharp", "10", "--sharp-reps", "1",
            "--out-dir", str(tmp_path), "--run-name", "a"]
    data = R.main(R.parse_args(argv))
    assert made == [1]
    run = data["runs"]["mlp-reg/seed0"]
    assert [h["epoch"] for h in run["history"]] == [0, 1] and "mean_corruption_acc" in run["final"]
