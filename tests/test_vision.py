"""vision.py: model shapes, the patch-grid sensitivity on a model with a known answer, the data pipeline, the offline
error, and short end-to-end runs on fake data."""

import itertools
import json
import math
import os
import sys
import time
import types
import urllib.error
import urllib.request
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import report
import runs
import vision
import vits
from common import paired_differences, patchify
from conftest import forward_sizes, loop_calls, printing
from runs import Results, strict_json
from test_common import phi

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

SMALL = ["--depth", "2", "--heads", "2", "--dim-head", "8", "--dim", "32", "--mlp-dim", "64", "--mlp-hidden", "64"]


@pytest.mark.parametrize("dataset", ["fake", "fake28"])
@pytest.mark.parametrize("name", vision.MODELS)
def test_model_output_shapes(name, dataset):
    """Every model maps (B, C, H, W) images to (B, classes) logits on 32x32x3 and 28x28x1 inputs."""
    args = vision.parse_args(["--dataset", dataset] + SMALL)
    C, S, K, _ = vision.DATASETS[dataset]
    model = vision.build_model(name, args, C, S, K).eval()
    assert model(torch.randn(3, C, S, S)).shape == (3, K)


class OnePatch(nn.Module):
    """Class 1 iff the mean of patch k (on the 4x4 grid of 32x32 images) exceeds 0."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, img):
        v = patchify(img, 8)[:, self.k].mean(1)
        return torch.stack([torch.zeros_like(v), v], 1)


def test_patch_sensitivity_of_a_one_patch_model_is_one_over_T_shaped():
    """Only patch k can flip it: per-patch map nonzero at k alone, and the mean is map[k] / T."""
    images = torch.randn(200, 3, 32, 32) * 0.05
    sens = vision.measure_sensitivity(OnePatch(5), images, patch=8, sigmas=[1.0], masks=["patch"], seed=0, reps=3)
    s = sens["patch", 1.0]
    assert s.per_position[5] > 0.2
    assert torch.equal(torch.cat([s.per_position[:5], s.per_position[6:]]), torch.zeros(15))
    assert s.mean == pytest.approx(s.per_position[5].item() / 16, rel=1e-5)


def test_global_noise_reaches_every_patch():
    """App. A.2: one global perturbation moves every patch, so the one-patch model flips more often per copy."""
    images = torch.randn(200, 3, 32, 32) * 0.05
    sens = vision.measure_sensitivity(OnePatch(5), images, patch=8, sigmas=[4.0], masks=["patch", "global"], seed=0,
                                      reps=3)
    assert sens["global", 4.0].evaluations == 600 and sens["global", 4.0].mean > 4 * sens["patch", 4.0].mean


def test_augmentation_draws_every_crop_and_both_flips():
    """Over 2,000 images every one of the 9 x 9 crop offsets of the 4-pixel zero padding occurs, and about half the
    images are mirrored (read off images whose pixels number their own positions)."""
    pos = torch.arange(1, 65, dtype=torch.uint8).view(1, 1, 8, 8)  # pixel (i, j) holds 8 i + j + 1: never 0
    out = vision.augment_batch(pos.expand(2000, 1, 8, 8).contiguous(), torch.Generator().manual_seed(0))
    seen, flips = set(), 0
    for img in out[:, 0]:
        for flipped, src in [(False, pos[0, 0]), (True, pos[0, 0].flip(1))]:
            padded = torch.nn.functional.pad(src, (4, 4, 4, 4))
            hits = [(dy, dx) for dy in range(9) for dx in range(9) if torch.equal(padded[dy:dy + 8, dx:dx + 8], img)]
            if hits:
                seen.add(hits[0])
                flips += flipped
                break
    assert seen == {(dy, dx) for dy in range(9) for dx in range(9)} and abs(flips - 1000) < 150


def test_global_noise_has_one_patchs_energy():
    """App. A.2 compares equal noise energy: the global mask puts std sigma / sqrt(T) on every pixel, so the mean of
    patch k's D = 192 values moves by N(0, sigma^2 / (T D)) and a patch at 0.05 flips with probability
    Phi(-0.05 sqrt(T D) / sigma), T = 16 (std sigma on every pixel would flip it at Phi(-0.05 sqrt(D) / sigma))."""
    images = torch.full((400, 3, 32, 32), 0.05)
    s = vision.measure_sensitivity(OnePatch(5), images, patch=8, sigmas=[4.0], masks=["global"], seed=0,
                                   reps=3)["global", 4.0]
    p = phi(-0.05 * math.sqrt(16 * 192) / 4.0)  # 0.244; without the sqrt(T) it would be 0.431
    assert abs(s.mean - p) < 4 * math.sqrt(p * (1 - p) / 1200)


def test_normalize_and_augment():
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    n = vision.normalize(x)
    assert n.min() >= -1 and n.max() <= 1 and n.dtype == torch.float32
    assert torch.equal(vision.normalize(torch.tensor([0, 255], dtype=torch.uint8)), torch.tensor([-1.0, 1.0]))
    floats = torch.tensor([0.0, 255.0])
    vision.normalize(floats)
    assert torch.equal(floats, torch.tensor([0.0, 255.0]))  # a float input is not overwritten
    a = vision.augment_batch(x, torch.Generator().manual_seed(0))
    assert a.shape == x.shape and a.dtype == torch.uint8
    torch.rand(5)  # the global generator moves on: the augmentation draws from the one it is given alone
    assert torch.equal(vision.augment_batch(x, torch.Generator().manual_seed(0)), a)
    # each augmented image is its source, possibly flipped, shifted by at most 4 pixels, padded with zeros
    for i in range(16):
        found = False
        for src in [x[i], x[i].flip(2)]:
            padded = torch.nn.functional.pad(src, (4, 4, 4, 4))
            for dy in range(9):
                for dx in range(9):
                    found |= torch.equal(padded[:, dy:dy + 32, dx:dx + 32], a[i])
        assert found


def test_offline_missing_dataset_is_a_clear_error(tmp_path, monkeypatch):
    """No files and no network: one message that names the files to provide, not a traceback."""
    def offline(*a, **k):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match=r"FashionMNIST/raw.*--data-dir"):
        vision.load_dataset("fashionmnist", str(tmp_path), torch.device("cpu"))


def test_svhn_without_scipy_is_a_clear_error_before_any_download(tmp_path, monkeypatch):
    """torchvision reads SVHN's .mat files with scipy, which requirements.txt leaves out: without it, one line that
    says so, before torchvision downloads 600 MB (the download is stood in for by a failure)."""
    import torchvision.datasets as tvd

    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy.io raises ImportError, installed or not
    monkeypatch.setattr(tvd, "SVHN", lambda *a, **k: pytest.fail("torchvision was asked for SVHN"))
    with pytest.raises(ValueError, match=r"^--dataset svhn needs scipy, .*: pip install scipy$"):
        vision.load_dataset("svhn", str(tmp_path), torch.device("cpu"))


def test_each_datasets_images_become_uint8_nchw_with_int64_labels(tmp_path, monkeypatch):
    """What torchvision gives, as each dataset's class holds it: CIFAR-10 (N, H, W, 3) with a list of targets, SVHN
    (N, 3, H, W) with .labels and a split, MNIST (N, H, W) with all ten digits, of which MNIST 0 vs 1 keeps the 0s
    and 1s. Each becomes (N, C, H, W) uint8 images and int64 labels, pixel for pixel."""
    import torchvision.datasets as tvd

    g = torch.Generator().manual_seed(0)
    made = {}  # (dataset, train): what the stand-in for torchvision's class held

    def stand_in(name, shape, attr, labels):
        class Data:
            def __init__(self, root, download, train=None, split=None):
                assert root == str(tmp_path) and download and (split is not None) == (name == "svhn")
                train = train if split is None else split == "train"
                n = 12 if train else 5
                self.data = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8).numpy()
                setattr(self, attr, labels(n))
                made[name, train] = self
        return Data

    for module in ["scipy", "scipy.io"]:  # SVHN's check that torchvision can read its .mat files, passed
        monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
    digits = lambda n: torch.arange(n) % 10  # noqa: E731
    monkeypatch.setattr(tvd, "CIFAR10", stand_in("cifar10", (32, 32, 3), "targets", lambda n: digits(n).tolist()))
    monkeypatch.setattr(tvd, "SVHN", stand_in("svhn", (3, 32, 32), "labels", lambda n: digits(n).numpy()))
    monkeypatch.setattr(tvd, "MNIST", stand_in("mnist01", (28, 28), "targets", digits))
    for name, nchw in [("cifar10", lambda x: x.permute(0, 3, 1, 2)), ("svhn", lambda x: x),
                       ("mnist01", lambda x: x[:, None])]:
        data = vision.load_dataset(name, str(tmp_path), torch.device("cpu"))
        channels, size = vision.DATASETS[name][:2]
        for split, train in [("train", True), ("test", False)]:
            src = made[name, train]
            x, y = nchw(torch.as_tensor(src.data)), torch.as_tensor(src.labels if name == "svhn" else src.targets)
            if name == "mnist01":
                x, y = x[y <= 1], y[y <= 1]
                assert len(y) == (4 if train else 2)  # of the digits 0-9, 0-1 (training) and 0-4 (test)
            assert data[f"{split}_x"].shape[1:] == (channels, size, size) and data[f"{split}_x"].dtype == torch.uint8
            assert torch.equal(data[f"{split}_x"], x) and torch.equal(data[f"{split}_y"], y.long())
            assert data[f"{split}_y"].dtype == torch.int64


def test_bad_arguments_are_rejected():
    for argv in [["--model", "vgg"], ["--sigma", "-0.1"], ["--dataset", "fake", "--sens-patch", "5"],
                 ["--epochs", "0"], ["--pretrained", "vit_l_16"], ["--lr", "-1"], ["--lr", "vgg=0.1"],
                 ["--lr", "cnn=fast"]]:
        with pytest.raises(SystemExit):
            vision.parse_args(argv)


def test_amp_needs_a_cuda_device_and_augment_a_32x32_dataset(monkeypatch, capsys):
    """--amp (bf16 autocast) is for CUDA: given on --device cpu, or on auto where torch sees no GPU, the flags are
    refused; on cuda, or auto with a GPU, they pass (nothing runs here). --augment is for the 32x32 datasets."""
    for device, gpu, ok in [("cpu", True, False), ("auto", False, False), ("auto", True, True), ("cuda", False, True),
                            ("cuda:1", False, True)]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        if ok:
            assert vision.parse_args(["--amp", "--device", device]).amp
        else:
            with pytest.raises(SystemExit):
                vision.parse_args(["--amp", "--device", device])
            assert "--amp (bf16 autocast) needs a CUDA device" in capsys.readouterr().err
    assert vision.parse_args(["--augment", "--dataset", "fake"]).augment
    with pytest.raises(SystemExit):
        vision.parse_args(["--augment", "--dataset", "fake28"])


def test_learning_rates_per_model():
    """The last --lr naming a model (or no model) is its rate; a model not named keeps the paper's rate for it."""
    args = vision.parse_args(["--model", "vit", "cnn", "mlp", "--lr", "0.3", "cnn=0.05"])
    assert [vision.learning_rate(m, args) for m in ["vit", "cnn", "mlp"]] == [0.3, 0.05, 0.3]
    args = vision.parse_args(["--model", "cnn", "vit", "--lr", "cnn=0.05", "0.2", "--dataset", "fashionmnist"])
    assert [vision.learning_rate(m, args) for m in ["cnn", "vit"]] == [0.2, 0.2]
    args = vision.parse_args(["--model", "cnn", "vit", "--lr", "vit=0.3", "--dataset", "fashionmnist"])
    assert [vision.learning_rate(m, args) for m in ["cnn", "vit"]] == [0.005, 0.3]
    assert vision.learning_rate("vit", vision.parse_args(["--dataset", "mnist01"])) == 0.01


@pytest.mark.slow
def test_end_to_end_on_fake_data(tmp_path, capsys, monkeypatch):
    """One epoch of two models, two sigmas and the global variant: metrics.json with the documented keys, figures, and
    the summary printed at the end (the data and each model's size at the start, a line per evaluation between). Each
    evaluation records the seconds since its run started: growing, and within the test's own wall time. The progress
    hears of every step, the checkpoints of every epoch's end."""
    calls = loop_calls(monkeypatch)
    argv = ["--dataset", "fake28", "--model", "vit", "mlp", "--epochs", "1", "--eval-every", "1", "--n-train", "100",
            "--n-test", "50", "--n-sens", "10", "--sigma", "0.1", "1", "--mask", "patch", "global",
            "--seeds", "0", "1", "--out-dir", str(tmp_path), "--run-name", "t", "--save-model"] + SMALL
    t0 = time.time()
    returned = vision.main(vision.parse_args(argv))
    wall = time.time() - t0
    out = capsys.readouterr().out
    assert "\nvit (2 seeds) | train acc " in out and "\nmlp - vit | patch:0.1 " in out, out
    assert out.splitlines()[1] == "fake28: 100 train / 50 test images on cpu"  # then each run's size, once
    sizes = {m: sum(p.numel() for p in vision.build_model(m, vision.parse_args(argv), 1, 28, 10).parameters()) / 1e6
             for m in ["vit", "mlp"]}
    for run in ["vit/seed0", "vit/seed1", "mlp/seed0", "mlp/seed1"]:
        assert out.count(f"\n{run}: {sizes[run[:3]]:.2f}M parameters\n") == 1, run
    folder = tmp_path / "vision" / "t"
    data = json.loads((folder / "metrics.json").read_text())
    assert set(data["runs"]) == {"vit/seed0", "vit/seed1", "mlp/seed0", "mlp/seed1"}
    assert data["paired"] == strict_json(returned["paired"]) and data["paired"]["models"]  # saved after the pairing
    final = data["runs"]["vit/seed0"]["final"]
    for key in ["sens", "sens_stderr", "train_acc", "test_acc"]:
        assert isinstance(final[key], float)
    assert set(final["sens_at"]) == {"patch:0.1", "patch:1", "global:0.1", "global:1"}
    assert final["sens"] == final["sens_at"]["patch:0.1"]["sens"]
    assert torch.tensor(final["sens_map"]).shape == (7, 7)
    assert [h["epoch"] for h in data["runs"]["mlp/seed1"]["history"]] == [0, 1]
    assert calls["progress"] == [(0, 1, 1)] * 4  # from step 0, one step, evaluating every epoch of one step
    assert calls["tick"] == [(0, True), (1, True)] * 4  # 4 runs of one step (100 images), both evaluated
    assert calls["checkpoint"] == [(0, True, 0), (1, True, 0)] * 4  # the epochs 0 and 1
    for name, run in data["runs"].items():
        assert 0 <= run["history"][0]["time"] <= run["history"][1]["time"] <= wall
        lines = [line for line in out.splitlines() if line.startswith(f"{name} epoch ")]  # one per evaluation
        assert len(lines) == len(run["history"]) and all(" | sens " in line for line in lines), name
    for png in ["sensitivity.png", "sigma_sweep.png", "sensitivity_maps.png"]:
        assert (folder / png).stat().st_size > 5000
    assert (folder / "vit-seed0.pt").exists()
    for png in folder.glob("*.png"):
        png.unlink()
    report.main(report.parse_args([str(folder)]))  # redrawn from metrics.json alone
    assert (folder / "sigma_sweep.png").stat().st_size > 5000
    unsaved = [a for a in argv if a != "--save-model"] + ["--run-name", "u", "--seeds", "0"]
    vision.main(vision.parse_args(unsaved))
    assert not list((tmp_path / "vision" / "u").glob("*.pt"))  # a model is saved only when asked


def test_a_run_stopped_in_its_first_epoch_draws_without_a_warning(tmp_path):
    """A vision run stopped before its first sensitivity (a GPU lend's budget ended it at epoch 0) still draws: the
    sensitivity panel says it is not measured yet, without matplotlib's warning that no curve has a label."""
    row = {"epoch": 0, "step": 0, "train_loss": 2.42, "train_acc": 0.1, "test_loss": 2.42, "test_acc": 0.1}
    data = {"script": "vision", "args": {}, "runs": {"vit/seed1": {"model": "vit", "seed": 1, "history": [row],
                                                                   "final": {}}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = report.draw(data, str(tmp_path))
    assert str(tmp_path / "sensitivity.png") in paths


@pytest.mark.slow
def test_compile_flag_runs_the_compiled_model(tmp_path, monkeypatch):
    """--compile trains and measures through torch.compile. The test traces with TorchDynamo's 'eager' backend
    (no code generation, seconds); the default inductor backend was checked by hand (minutes of compiling on a CPU)."""
    compiled = []
    real = torch.compile

    def compile_eager(model):
        compiled.append(model)
        return real(model, backend="eager")

    monkeypatch.setattr(torch, "compile", compile_eager)
    argv = ["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "32", "--epochs", "1", "--n-train", "100",
            "--n-test", "50", "--n-sens", "5", "--compile", "--out-dir", str(tmp_path), "--run-name", "c"]
    data = vision.main(vision.parse_args(argv))
    assert len(compiled) == 1 and isinstance(compiled[0], vision.MLP)
    assert 0 <= data["runs"]["mlp/seed0"]["final"]["train_acc"] <= 1


@pytest.mark.parametrize("name", ["vit", "vit-simple"])
def test_patch_norm_blows_up_noise_on_a_blank_patch(name):
    """With the patch LayerNorm, noise of std 0.01 on a constant (blank) patch moves its token as far as noise of
    std 1 does; --no-patch-norm removes the LayerNorm, and the token then moves 100x less."""
    def token_shift(extra, sigma):
        args = vision.parse_args(["--dataset", "fake28", "--patch-size", "7"] + SMALL + extra)
        torch.manual_seed(0)
        model = vision.build_model(name, args, 1, 28, 10).eval()
        embed = model.tokens if name == "vit" else lambda img: model.embed[:2](patchify(img, 7))  # norm, linear
        blank = -torch.ones(1, 1, 28, 28)  # black background in [-1, 1] pixels
        noisy = blank.clone()
        noisy[..., 7:14, 7:14] += sigma * torch.randn(1, 1, 7, 7, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            return (embed(noisy) - embed(blank))[0, 5].norm().item()  # token of patch (1, 1)

    with_norm = [token_shift([], s) for s in (0.01, 1.0)]
    without = [token_shift(["--no-patch-norm"], s) for s in (0.01, 1.0)]
    assert with_norm[0] > 0.3 * with_norm[1]
    assert without[0] == pytest.approx(without[1] / 100, rel=1e-3)


def test_the_patch_norm_makes_a_token_blind_to_its_patchs_scale():
    """With the patch LayerNorm, a patch scaled by 10 or by 1,000 gives the same token (to the LayerNorm's eps);
    without it the token moves with the scale."""
    def tokens(extra, scale):
        args = vision.parse_args(["--dataset", "fake28", "--patch-size", "7"] + SMALL + extra)
        torch.manual_seed(0)
        model = vision.build_model("vit", args, 1, 28, 10).eval()
        img = torch.randn(1, 1, 28, 28, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            return model.tokens(img * scale)

    assert torch.allclose(tokens([], 10), tokens([], 1000), atol=1e-3)
    assert not torch.allclose(tokens(["--no-patch-norm"], 10), tokens(["--no-patch-norm"], 1000), atol=1)


@pytest.mark.parametrize("name", ["vit", "vit-simple"])
def test_no_block_norm_removes_every_layernorm_in_the_blocks(name):
    """--no-block-norm: no LayerNorm before attention or MLP (the final one and the patch norm stay), so a block's
    attention branch sees a token's scale: x and 10 x give the same branch output with the norm, not without."""
    def model(extra):
        args = vision.parse_args(["--dataset", "fake28", "--patch-size", "7"] + SMALL + extra)
        torch.manual_seed(0)
        return vision.build_model(name, args, 1, 28, 10).eval()

    both = vision.parse_args(["--no-block-norm", "--no-patch-norm", "--input-patch-norm"])
    assert vision.ablation(name, both) == "-no-patch-norm-no-block-norm"  # the run's label: vit-no-patch-norm-...
    norms = lambda m: sum(isinstance(x, nn.LayerNorm) for x in m.transformer.layers.modules())  # noqa: E731
    assert norms(model([])) == 2 * 2 and norms(model(["--no-block-norm"])) == 0  # depth 2: attention + MLP each
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attn = model([]).transformer.layers[0][0]
        assert torch.allclose(attn(x), attn(10 * x), atol=1e-4)
        attn = model(["--no-block-norm"]).transformer.layers[0][0]
        assert not torch.allclose(attn(x), attn(10 * x), atol=1e-2)


@pytest.mark.parametrize("name", ["mlp", "mlp-sigmoid", "cnn"])
def test_input_patch_norm_puts_the_vits_patch_layernorm_in_front(name):
    """--input-patch-norm: the MLPs and the CNN start with a per-patch LayerNorm, which turns noise of std 0.01 on a
    flat patch into a unit-scale patch (each of its pixels about +-1) and leaves the other patches' scale alone."""
    args = vision.parse_args(["--dataset", "fake28", "--patch-size", "7", "--input-patch-norm"] + SMALL)
    model = vision.build_model(name, args, 1, 28, 10).eval()
    assert vision.ablation(name, args) == "-patch-norm" and vision.ablation("vit", args) == ""
    plain = vision.build_model(name, vision.parse_args(["--dataset", "fake28"] + SMALL), 1, 28, 10)
    assert isinstance(model[0], vision.PatchNorm) and not any(isinstance(m, vision.PatchNorm) for m in plain.modules())
    flat = -torch.ones(1, 1, 28, 28)
    flat[..., :7, :7] += 0.01 * torch.randn(1, 1, 7, 7, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = patchify(model[0](flat), 7)[0]  # (16, 49)
    assert out[0].std().item() == pytest.approx(1.0, rel=0.05) and out[1:].abs().max() < 1e-3  # eps keeps flat at 0


class ReadsTheBackground(nn.Module):
    """Class 1 iff the top half of an 8x8 image (its two upper 4x4 patches) is not constant."""

    def forward(self, img):
        v = (img[:, :, :4].flatten(1).std(1) > 1e-6).float()
        return torch.stack([1 - v, v], 1)


def test_flat_and_object_patches_are_measured_apart():
    """Images whose upper two patches are flat and lower two are not, and a model that flips whenever noise lands
    on the upper half: sensitivity 1 on the flat patches, 0 on the object patches, 0.5 with the patch mask, with
    `reps` draws per patch; an image with no flat patch, or with no other, is left out of both. `flat` bounds the
    pixels' standard deviation, not their variance."""
    images = torch.randn(11, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    images[:8, :, :4] = -1.0  # the background of 8 images; the ninth has none
    images[9] = -1.0  # and the tenth is background alone
    images[10, :, :4] = -1.0 + 0.05 * images[10, :, :4]  # a faint top half: std about 0.05 > 0.01 > its variance
    sens = vision.measure_sensitivity(ReadsTheBackground(), images, patch=4, sigmas=[0.1], masks=["patch", "flat"],
                                      seed=0, flat=0.01)
    assert sens["flat", 0.1].mean == 1 and sens["object", 0.1].mean == 0 and len(sens["flat", 0.1].per_input) == 8
    assert sens["patch", 0.1].per_input[:8].tolist() == [0.5] * 8
    thrice = vision.measure_sensitivity(ReadsTheBackground(), images, patch=4, sigmas=[0.1], masks=["flat"], seed=0,
                                        reps=3, flat=0.01)  # reps draws of noise per patch, as the patch mask's
    assert [thrice[k, 0.1].evaluations for k in ["flat", "object"]] == [3 * sens[k, 0.1].evaluations
                                                                         for k in ["flat", "object"]]
    none = vision.measure_sensitivity(ReadsTheBackground(), images[8:], patch=4, sigmas=[0.1], masks=["flat"], seed=0,
                                      flat=0.01)
    assert none == {}  # no image with both kinds of patch: nothing to measure, no error


# -----------------------------------------------------------------------------
# what the numbers mean: known answers for the metrics, options that take effect, the data


class Fixed(nn.Module):
    """A model with fixed logits per image: log-probabilities (log 0.5, log 0.25, log 0.25) for every input."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return torch.log(torch.tensor([0.5, 0.25, 0.25])).expand(len(x), 3) + self.w


def test_evaluate_gives_the_known_loss_and_accuracy():
    """Cross-entropy -log p(label) and accuracy = share of labels equal to the argmax (class 0), on any images; on a
    CPU the images go through the model 256 at a time (2,048 on a GPU)."""
    x = torch.randint(0, 256, (40, 1, 28, 28), dtype=torch.uint8)
    y = torch.tensor([0] * 10 + [1] * 20 + [2] * 10)
    loss, acc = vision.evaluate(Fixed(), x, y)
    assert acc == 0.25
    assert loss == pytest.approx((10 * math.log(2) + 30 * math.log(4)) / 40, rel=1e-6)
    model = Fixed()
    sizes = forward_sizes(model)
    assert vision.evaluate(model, x.repeat(15, 1, 1, 1), y.repeat(15)) == (pytest.approx(loss, rel=1e-6), acc)
    assert sizes == [256, 256, 88]


def test_learning_rate_schedules():
    """constant; step: halved every 8 epochs (the authors' StepLR); cosine: from the base to 0 over the epochs."""
    assert vision.lr_at(13.5, 0.1, "constant", 20) == 0.1
    assert [vision.lr_at(e, 0.1, "step", 50) for e in [0, 7.9, 8, 16.2, 24]] == pytest.approx([0.1, 0.1, 0.05,
                                                                                              0.025, 0.0125])
    assert [vision.lr_at(e, 0.1, "cosine", 10) for e in [0, 5, 10]] == pytest.approx([0.1, 0.05, 0.0], abs=1e-12)


class Spy(torch.optim.SGD):
    """SGD that records the learning rate of every step it takes."""

    lrs = []

    def step(self, closure=None):
        Spy.lrs.append(self.param_groups[0]["lr"])
        return super().step(closure)


def test_options_reach_the_optimizer(monkeypatch):
    """--momentum and --weight-decay reach SGD, --optimizer adam makes Adam, --lr per model reaches each model
    (others keep the paper's rate for the dataset; 0.01 on MNIST 0 vs 1)."""
    model = nn.Linear(2, 2)
    args = vision.parse_args(["--dataset", "fashionmnist", "--model", "cnn", "mlp", "--lr", "cnn=0.05",
                              "--momentum", "0.9", "--weight-decay", "0.001"])
    opt = vision.make_optimizer("cnn", model, args)
    assert isinstance(opt, torch.optim.SGD)
    assert opt.param_groups[0]["lr"] == 0.05 and opt.param_groups[0]["momentum"] == 0.9
    assert opt.param_groups[0]["weight_decay"] == 0.001
    assert vision.make_optimizer("mlp", model, args).param_groups[0]["lr"] == 0.1  # the paper's MLP rate
    adam = vision.make_optimizer("vit", model, vision.parse_args(["--optimizer", "adam", "--lr", "3e-4",
                                                                  "--weight-decay", "0.01"]))
    assert isinstance(adam, torch.optim.Adam) and adam.param_groups[0]["lr"] == 3e-4
    assert adam.param_groups[0]["weight_decay"] == 0.01
    mnist = vision.parse_args(["--dataset", "mnist01"])
    assert vision.make_optimizer("vit", model, mnist).param_groups[0]["lr"] == 0.01


def test_patch_defaults_and_what_an_evaluation_during_training_measures_and_logs():
    """--patch-size defaults to 4 (7 for MNIST 0 vs 1's 28x28 in 7x7 patches), --sens-patch to --patch-size; an
    evaluation during training measures the first --mask alone, and its row logs each measurement's mean and standard
    error, with the first as "sens"."""
    assert vision.parse_args(["--dataset", "mnist01"]).patch_size == 7
    assert vision.parse_args(["--dataset", "fashionmnist"]).patch_size == 4
    assert vision.parse_args(["--dataset", "fake28", "--patch-size", "7"]).sens_patch == 7
    args = vision.parse_args(["--dataset", "fake28", "--mask", "patch", "global", "--sigma", "0.5", "2",
                              "--patch-size", "7"])
    sens = vision.measure_during(PatchThreshold(0), torch.randn(6, 1, 28, 28), args)
    assert set(sens) == {("patch", 0.5), ("patch", 2.0)}
    row = vision.logged(sens, ("patch", 0.5))
    assert row["sens"] == sens["patch", 0.5].mean and row["sens_stderr"] == sens["patch", 0.5].stderr
    assert row["sens_stderr@patch:2"] == sens["patch", 2.0].stderr and row["sens@patch:2"] == sens["patch", 2.0].mean


@pytest.mark.slow
def test_steps_trains_exactly_that_many_sgd_steps(tmp_path, monkeypatch):
    """--steps 7 with 3 batches per epoch: 7 optimizer steps (the third epoch partial), whatever --epochs says."""
    Spy.lrs = []
    monkeypatch.setattr(torch.optim, "SGD", Spy)
    argv = ["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "8", "--n-train", "30", "--batch-size", "10",
            "--steps", "7", "--epochs", "50", "--n-test", "10", "--n-sens", "2", "--out-dir", str(tmp_path)]
    data = vision.main(vision.parse_args(argv))
    assert len(Spy.lrs) == 7
    assert data["runs"]["mlp/seed0"]["final"]["step"] == 7 and data["runs"]["mlp/seed0"]["final"]["epoch"] == 3


def test_locality_self_attention_never_attends_to_itself():
    """LSA masks the diagonal: with two tokens, each one's attention output is exactly the other's value."""
    torch.manual_seed(0)
    attn = vits.Attention(8, 2, 4, dropout=0.0, lsa=True).eval()
    x = torch.randn(1, 2, 8)
    v = attn.qkv(attn.norm(x)).view(1, 2, 3, 2, 4)[:, :, 2]  # (1, T, heads, hs)
    expected = attn.out(v[:, [1, 0]].reshape(1, 2, 8))
    assert torch.allclose(attn(x), expected, atol=1e-6)
    plain = vits.Attention(8, 2, 4, dropout=0.0, lsa=False).eval()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if k != "log_temperature"})
    assert not torch.allclose(plain(x), expected, atol=1e-3)


def test_attention_equals_its_formula():
    """Attention.forward is softmax(q k^T * scale) v over each head, heads concatenated per token, then the output
    projection: scale = dim_head^-1/2, or for LSA the learned exp(log_temperature) with the diagonal masked out."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    for lsa in [False, True]:
        attn = vits.Attention(8, 2, 4, dropout=0.0, lsa=lsa).eval()
        if lsa:
            attn.log_temperature.data.fill_(math.log(0.7))
        q, k, v = attn.qkv(attn.norm(x)).view(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)  # (B, heads, T, hs)
        scores = q @ k.transpose(-1, -2) * (0.7 if lsa else 4 ** -0.5)
        if lsa:
            scores = scores.masked_fill(torch.eye(5, dtype=torch.bool), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 8)
        assert torch.allclose(attn(x), attn.out(y), atol=1e-5), lsa


def test_the_data_split_depends_only_on_data_seed():
    """The training subset is drawn by --data-seed: the same for every --seeds, another for another --data-seed;
    the test set is the first --n-test test images. The fake dataset is 1,000 training and 200 test images."""
    def subset(*flags):
        args = vision.parse_args(["--dataset", "fake28", "--n-train", "50", "--n-test", "20", "--n-sens", "5", *flags])
        return vision.prepare_data(args, torch.device("cpu"))

    a, b, c = subset("--seeds", "0"), subset("--seeds", "7"), subset("--data-seed", "3")
    assert torch.equal(a["train_x"], b["train_x"]) and torch.equal(a["train_y"], b["train_y"])
    assert len(a["train_x"]) == 50 and not torch.equal(a["train_x"], c["train_x"])
    full = vision.load_dataset("fake28", "", torch.device("cpu"))
    assert full["train_x"].shape == (1000, 1, 28, 28) and full["test_x"].shape == (200, 1, 28, 28)  # random images
    assert len(full["train_y"]) == 1000 and len(full["test_y"]) == 200 and set(full["test_y"].tolist()) == {*range(10)}
    assert torch.equal(a["test_x"], full["test_x"][:20])
    rows = {tuple(r.flatten().tolist()) for r in full["train_x"]}
    assert all(tuple(r.flatten().tolist()) in rows for r in a["train_x"])  # a subset of the training images


class Oracle(nn.Module):
    """Predicts the class of the training images (their bright top-left pixel) and nothing else; lr 0 leaves it so."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return torch.stack([-x[:, 0, 0, 0], x[:, 0, 0, 0]], 1) * 10 + 0 * self.w


@pytest.mark.slow
def test_train_and_test_accuracy_are_measured_on_their_own_sets(tmp_path, monkeypatch):
    """A model right on every training image and wrong on every test image reports train accuracy 1 and test
    accuracy 0: the two are computed on different sets, each over all of it."""
    x = torch.zeros(20, 1, 28, 28, dtype=torch.uint8)
    y = torch.arange(20) % 2
    x[:, 0, 0, 0] = (y * 255).to(torch.uint8)
    data = {"train_x": x, "train_y": y, "test_x": x[:10], "test_y": 1 - y[:10]}
    monkeypatch.setattr(vision, "load_dataset", lambda *a: data)
    monkeypatch.setattr(vision, "build_model", lambda *a: Oracle())
    argv = ["--dataset", "fake28", "--model", "mlp", "--epochs", "1", "--lr", "1e-30", "--n-sens", "2",
            "--out-dir", str(tmp_path)]
    final = vision.main(vision.parse_args(argv))["runs"]["mlp/seed0"]["final"]
    assert final["train_acc"] == 1.0 and final["test_acc"] == 0.0


class PatchThreshold(nn.Module):
    """Class 1 iff the mean of patch k (4x4 grid, 7x7 patches of 28x28 images) exceeds 0."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, img):
        v = patchify(img, 7)[:, self.k].mean(1)
        return torch.stack([torch.zeros_like(v), v], 1)


def test_sweep_follows_the_closed_form_at_every_sigma():
    """The mean of D = 49 noisy values moves by N(0, sigma^2 / D): a patch at mean a flips with probability
    Phi(-a sqrt(D) / sigma) at every sigma of the sweep, and no other patch flips."""
    images = torch.full((300, 1, 28, 28), 0.2)
    sens = vision.measure_sensitivity(PatchThreshold(6), images, patch=7, sigmas=[0.3, 1.0, 3.0, 10.0],
                                      masks=["patch"], seed=0, reps=4)
    for sigma in [0.3, 1.0, 3.0, 10.0]:
        s = sens["patch", sigma]
        p = phi(-0.2 * 7 / sigma)
        assert abs(s.per_position[6].item() - p) < 4 * math.sqrt(p * (1 - p) / 1200) + 1e-9, (sigma, p)
        assert s.per_position.sum().item() == s.per_position[6].item()


def test_final_sweep_reuses_the_last_evaluation_orders_by_mask_then_sigma_and_leaves_its_input():
    """final_sweep measures only what the last evaluation did not (its entry comes back as the same object), at
    every --sigma and the --sweep's, and returns them by --mask order, then sigma; the caller's dict is unchanged."""
    args = vision.parse_args(["--dataset", "fake28", "--sens-patch", "7", "--mask", "patch", "global", "--sigma", "1",
                              "0.1", "--sweep", "--reps", "2"])
    images, model = torch.full((20, 1, 28, 28), 0.2), PatchThreshold(6)
    last = vision.measure_sensitivity(model, images, patch=7, sigmas=[1.0], masks=["patch"], seed=args.sens_seed,
                                      reps=2)
    given = dict(last)
    sens = vision.final_sweep(model, images, last, args)
    assert last == given  # the caller's dict as it was
    assert sens["patch", 1.0] is last["patch", 1.0]  # reused, not measured again
    sigmas = sorted({1.0, 0.1, *vision.SWEEP})
    assert list(sens) == [("patch", s) for s in sigmas] + [("global", s) for s in sigmas]
    again = vision.measure_sensitivity(model, images, patch=7, sigmas=[3.0], masks=["global"], seed=args.sens_seed,
                                       reps=2)["global", 3.0]  # measured with the run's seed and --reps
    assert torch.equal(sens["global", 3.0].per_input, again.per_input)


def test_paired_difference_of_two_models_on_the_same_noise():
    """Two one-patch models (margins 0.1 and 0.4) measured with the same seed: per image, the difference of their
    flip rates averages (Phi(-0.1 * 7) - Phi(-0.4 * 7)) / 16 at sigma 1, within its standard error over images."""
    images = torch.zeros(400, 1, 28, 28)
    images[:, :, :7, :7], images[:, :, 7:14, :7] = 0.1, 0.4  # patch 0 at 0.1, patch 4 at 0.4
    runs = {}
    for name, k in [("vit", 4), ("mlp", 0)]:
        s = vision.measure_sensitivity(PatchThreshold(k), images, patch=7, sigmas=[1.0], masks=["patch"], seed=3,
                                       reps=2)["patch", 1.0]
        runs[f"{name}/seed0"] = {"model": name, "seed": 0, "history": [],
                                 "final": {"per_image": {"patch:1": s.per_input.tolist()},
                                           "sens_at": {"patch:1": {"sens": s.mean}}}}
    p = report.vision_paired({"runs": runs})
    d = p["models"]["mlp"]["diff"]["patch:1"]
    expected = (phi(-0.7) - phi(-2.8)) / 16
    se = d["per_seed"]["seed0"][1]
    assert p["reference"] == "vit" and abs(d["mean"] - expected) < 4 * se and se > 0


def test_crossover_and_matched_accuracy_on_made_up_numbers():
    """Crossover: where the seed-mean curves cross, interpolated on log sigma. Matched accuracy: the sensitivity
    where train accuracy first reaches each level, linearly interpolated between evaluations."""
    (sigma,) = report.crossovers({1: 0.1, 10: 0.7}, {1: 0.2, 10: 0.5})
    assert sigma == pytest.approx(10 ** (1 / 3))  # d goes -0.1 -> +0.2: a third of the way in log sigma
    # level exactly at a measured sigma (counted once), then a crossing between 10 and 100 (two thirds of the way)
    curves = {"vit": [0.3, 0.3, 0.3, 0.3], "mlp": [0.2, 0.3, 0.5, 0.2]}
    data = {"runs": {f"{m}/seed0": {"history": [], "final": {
        "per_image": {"patch:1": [0.0, 0.0]},
        "sens_at": {f"patch:{s:g}": {"sens": v} for s, v in zip([0.1, 1, 10, 100], vals)}}}
        for m, vals in curves.items()}}
    assert report.vision_paired(data)["models"]["mlp"]["crossover"]["patch"] == pytest.approx([1.0, 10 ** (1 + 2 / 3)])
    seeds = [{"final": {"sens_at": {"patch:1": {"sens": v}, "patch:10": {"sens": v}, "global:1": {"sens": 1}}}}
             for v in [0.2, 0.4]]  # a curve is the mean over seeds at each sigma of its mask
    assert report.mean_curve(seeds, "patch") == pytest.approx({1.0: 0.3, 10.0: 0.3})
    h = [{"epoch": 0, "train_acc": 0.1, "sens@x": 0.0}, {"epoch": 5, "train_acc": 0.7, "sens@x": 0.3},
         {"epoch": 10, "train_acc": 0.9, "sens@x": 0.1}]
    got = report.at_train_accuracy(h, [0.05, 0.8, 0.95], ["sens@x"])
    assert got["0.05"] == {"epoch": 0.0, "sens@x": 0.0} and got["0.95"] is None
    assert got["0.8"]["epoch"] == pytest.approx(7.5) and got["0.8"]["sens@x"] == pytest.approx(0.2)
    got = report.at_train_accuracy(h, [0.75, 0.4], ["sens@x"])  # a quarter, and half of the first interval
    assert got["0.75"]["epoch"] == pytest.approx(6.25) and got["0.75"]["sens@x"] == pytest.approx(0.25)
    assert got["0.4"]["epoch"] == pytest.approx(2.5) and got["0.4"]["sens@x"] == pytest.approx(0.15)
    assert report.at_train_accuracy(h, [0.9], ["sens@x"])["0.9"] == {"epoch": 10, "sens@x": 0.1}  # reached, not passed


def test_summary_of_a_merged_folder_prints_own_numbers_paired_differences_and_matched_accuracy(capsys):
    """What report.py prints for a vision folder (and --claims for its rows): each model's own numbers (one seed: the
    s.e. over its images), its paired difference against the ViT (per image [0.5, 0] - [0, 0]: 0.25 +- 0.25) with
    the sigmas where the seed-mean curves are level (1 and 10^(5/3)), then the matched-accuracy readings."""
    curves = {"vit": [0.3, 0.3, 0.3, 0.3], "mlp": [0.2, 0.3, 0.5, 0.2]}
    data = {"script": "vision", "runs": {f"{m}/seed0": {"model": m, "seed": 0, "history": [], "final": {
        "train_acc": 0.99, "test_acc": 0.8, "epoch": 10 if m == "vit" else 20,
        "per_image": {"patch:1": [0.5, 0.0] if m == "mlp" else [0.0, 0.0]},
        "sens_at": {f"patch:{s:g}": {"sens": v, "stderr": 0.01} for s, v in zip([0.1, 1, 10, 100], vals)},
        "match_acc": {"0.9": {"epoch": 4.5, "sens@patch:1": 0.25}}}} for m, vals in curves.items()}}
    data["paired"] = report.vision_paired(data)
    report.summary(data)
    assert capsys.readouterr().out.splitlines() == [
        "vit (1 seed) | train acc 0.990 | test acc 0.800 | epoch 10 | patch:0.1 0.3000 +- 0.0100 | patch:1 0.3000 +- "
        "0.0100 | patch:10 0.3000 +- 0.0100 | patch:100 0.3000 +- 0.0100",
        "mlp (1 seed) | train acc 0.990 | test acc 0.800 | epoch 20 | patch:0.1 0.2000 +- 0.0100 | patch:1 0.3000 +- "
        "0.0100 | patch:10 0.5000 +- 0.0100 | patch:100 0.2000 +- 0.0100",
        "mlp - vit | patch:1 +0.2500 +- 0.2500 (1 seed, s.e. over inputs) | level at sigma {'patch': ['1', '46.4']}",
        "vit at train acc 0.9 (1 of 1 seed) | epoch 4.5 | patch:1 0.2500",
        "mlp at train acc 0.9 (1 of 1 seed) | epoch 4.5 | patch:1 0.2500"]


def test_a_stopped_or_one_model_folder_prints_what_finished(tmp_path, capsys):
    """report.py on a folder whose run was stopped (no "paired" saved yet: a GPU lend's budget ended it in its third
    model) prints the finished models' own numbers and paired differences, and names the unfinished model; a
    one-model run prints its own numbers (both printed nothing before)."""
    def run(m, finished):
        return {"model": m, "seed": 1, "history": [], "final": {} if not finished else {
            "train_acc": 0.99, "test_acc": 0.8, "epoch": 3, "per_image": {"patch:1": [0.5, 0.0] if m == "mlp" else
                                                                          [0.0, 0.0]},
            "sens_at": {"patch:1": {"sens": 0.25 if m == "mlp" else 0.0, "stderr": 0.01}}}}
    runs.write_json(str(tmp_path / "metrics.json"), {"script": "vision", "args": {}, "runs": {
        f"{m}/seed1": run(m, m != "cnn") for m in ["vit", "mlp", "cnn"]}})
    report.main(report.parse_args([str(tmp_path)]))
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "vit (1 seed) | train acc 0.990 | test acc 0.800 | epoch 3 | patch:1 0.0000 +- 0.0100",
        "mlp (1 seed) | train acc 0.990 | test acc 0.800 | epoch 3 | patch:1 0.2500 +- 0.0100",
        "mlp - vit | patch:1 +0.2500 +- 0.2500 (1 seed, s.e. over inputs)"]
    assert out[3] == f"note: cnn/seed1 has no final numbers yet (still running, or stopped: --resume {tmp_path})"
    assert out[4:] == [f"{tmp_path}: nothing to draw yet"]  # no figure from these made-up numbers, and it says so
    report.summary({"script": "vision", "runs": {"mlp/seed1": run("mlp", True)}, "paired": {}})
    assert capsys.readouterr().out.splitlines() == [
        "mlp (1 seed) | train acc 0.990 | test acc 0.800 | epoch 3 | patch:1 0.2500 +- 0.0100"]


def test_scattered_mask_is_p_squared_pixels_shared_by_the_batch():
    """The authors' mask: per draw p^2 (row, column) pairs with replacement; every copy of the batch has noise on
    exactly those pixels (all channels), so as many as there are distinct pairs, at most p^2. Images of 24 x 32, so
    that a mask laid out W x H shows."""
    g = torch.Generator().manual_seed(0)
    images = torch.zeros(5, 3, 24, 32)
    copies, masks = vision.scattered_copies(images, 4, 1.0, 6, g)
    assert copies.shape == (30, 3, 24, 32) and masks.shape == (6, 24, 32)
    g = torch.Generator().manual_seed(0)
    rows, cols = torch.randint(24, (6, 16), generator=g), torch.randint(32, (6, 16), generator=g)
    for d in range(6):
        distinct = len(set(zip(rows[d].tolist(), cols[d].tolist())))
        assert masks[d].sum() == distinct <= 16
        assert masks[d][rows[d], cols[d]].all()  # the drawn pixels themselves
        for b in range(5):
            changed = (copies[d * 5 + b] != 0).any(0)
            assert torch.equal(changed, masks[d])
    s = vision.scattered_sensitivity(PatchThreshold(0), torch.zeros(10, 1, 28, 28) + 0.01, 7, 1.0, 16, seed=0)
    assert s.evaluations == 160 and 0 < s.mean < 1
    twice = vision.measure_sensitivity(PatchThreshold(0), torch.zeros(10, 1, 28, 28) + 0.01, patch=7, sigmas=[1.0],
                                       masks=["scattered"], seed=0, reps=2)  # as many draws as the patch mask's copies
    assert twice["scattered", 1.0].evaluations == 10 * 16 * 2
    copies, masks = vision.scattered_copies(torch.zeros(50, 1, 32, 32), 4, 2.0, 4, torch.Generator().manual_seed(1))
    noise = copies.view(4, 50, 32, 32)[masks[:, None].expand(4, 50, 32, 32)]
    assert noise.std().item() == pytest.approx(2.0, rel=0.1)  # N(0, sigma^2) on the masked pixels


class AnyChange(nn.Module):
    """Class 1 iff any pixel differs from its clean value 0.01: every noisy copy flips, so every rate is exactly 1."""

    def forward(self, img):
        v = (img != 0.01).flatten(1).any(1).float()
        return torch.stack([torch.zeros_like(v), v], 1)


def test_scattered_sensitivity_counts_every_image_and_every_draw():
    """A model that every perturbation flips: rate exactly 1 for each of 250 images (three batches of 100, the last
    partial) over 45 draws (more than one forward pass of draws each); a batch over 2,048 images still draws one mask
    at a time."""
    s = vision.scattered_sensitivity(AnyChange(), torch.full((250, 1, 28, 28), 0.01), 7, 0.5, 45, seed=0)
    assert s.evaluations == 250 * 45 and s.mean == 1.0 and s.per_input.eq(1).all()
    s = vision.scattered_sensitivity(AnyChange(), torch.full((2100, 1, 28, 28), 0.01), 7, 0.5, 2, seed=0, batch=2100)
    assert s.evaluations == 2100 * 2 and s.mean == 1.0


def test_scattered_sensitivity_gives_the_same_flips_whatever_the_forward_batch():
    """The scattered mask's copies run through the model in batches of `rows` images (100 on a CPU, 2,048 on a GPU):
    the masks and noise are drawn as before, so any rows gives the same per-image flips, which are neither all 0 nor
    all 1 (the comparison is not vacuous). The masks' own batch, 100 images sharing each mask, is the authors'."""
    images = torch.rand(130, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 0.1
    runs = [vision.scattered_sensitivity(PatchThreshold(5), images, 7, 1.0, 45, seed=1, rows=r) for r in [2048, 100, 7]]
    assert all(torch.equal(runs[0].per_input, r.per_input) for r in runs[1:])
    assert 0 < runs[0].mean < 1
    model = PatchThreshold(5)  # on a CPU, without rows: forwards of at most 100 images
    sizes = forward_sizes(model)
    assert torch.equal(vision.scattered_sensitivity(model, images, 7, 1.0, 45, seed=1).per_input, runs[0].per_input)
    assert max(sizes) == 100
    # the default batch is 100 images per mask: another batch shares other masks
    authors, other = (vision.scattered_sensitivity(PatchThreshold(5), images, 7, 1.0, 45, seed=1, batch=b)
                      for b in (100, 65))
    assert torch.equal(authors.per_input, runs[0].per_input) and not torch.equal(other.per_input, runs[0].per_input)


def test_every_mask_draws_its_noise_from_the_seed():
    """measure_sensitivity with the same seed gives the same per-image flips under every mask (the paired
    comparisons rely on it), another seed other flips; by default one draw per patch (N * T evaluations)."""
    images = torch.rand(40, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 0.1
    model = PatchThreshold(5)
    a, b, c = (vision.measure_sensitivity(model, images, patch=7, sigmas=[1.0], masks=["patch", "scattered", "global"],
                                          seed=s) for s in [3, 3, 4])
    for key in a:
        assert torch.equal(a[key].per_input, b[key].per_input), key
        assert not torch.equal(a[key].per_input, c[key].per_input), key
    assert a["patch", 1.0].evaluations == 40 * 16
    sampled = vision.measure_sensitivity(model, images, patch=7, sigmas=[1.0], masks=["patch"], seed=3, positions=3)
    assert sampled["patch", 1.0].evaluations == 40 * 3  # --sens-positions: 3 sampled patches per image


def separable_task():
    """200 images whose label says which half is brighter (top: 1, bottom: 0), as vision.train takes them."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (200,), generator=g)
    x = torch.randint(0, 100, (200, 1, 28, 28), generator=g, dtype=torch.uint8)
    x[y == 1, :, :14] += 120
    x[y == 0, :, 14:] += 120
    return {"train_x": x, "train_y": y, "test_x": x[:20], "test_y": y[:20]}


def test_training_loop_learns_a_separable_task(tmp_path):
    """vision.train's loop takes SGD steps that reduce the loss: an MLP learns "is the top half brighter than the
    bottom half" from 200 images to train accuracy 1 in 5 epochs (a deleted backward() or step() stays at chance)."""
    data = separable_task()
    args = vision.parse_args(["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--epochs", "5",
                              "--batch-size", "20", "--lr", "0.05", "--n-sens", "5", "--eval-every", "5"])
    results = Results(str(tmp_path), "vision", vars(args), "cpu")
    vision.train(name="mlp", seed=0, args=args, data=data, results=results, device=torch.device("cpu"))
    first, last = results.data["runs"]["mlp/seed0"]["history"]
    assert first["train_acc"] < 0.7 and last["train_acc"] == 1.0 and last["train_loss"] < first["train_loss"] / 4


def test_each_epoch_trains_on_a_new_order_from_the_runs_own_generator(tmp_path):
    """Epoch e's batches are --batch-size images at a time in the order of the e-th torch.randperm of a generator
    seeded with the run's seed (not torch's global generator, which the model's initialisation moved), the last batch
    of an epoch the smaller one; every step in train mode, also after the evaluation at step 0 left the model in
    eval mode."""
    data = separable_task()
    args = vision.parse_args(["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--epochs", "2",
                              "--batch-size", "64", "--n-sens", "2", "--eval-every", "2"])
    seen, modes = [], []

    def loss_fn(model, images, labels):  # the objective, which sees every batch
        seen.append(images.clone())
        modes.append(model.training)
        return vision.cross_entropy(model, images, labels)

    results = Results(str(tmp_path), "vision", vars(args), "cpu")
    vision.train(name="mlp", seed=3, args=args, data=data, results=results, device=torch.device("cpu"),
                 loss_fn=loss_fn)
    gen = torch.Generator().manual_seed(3)
    orders = [torch.randperm(200, generator=gen) for _ in range(2)]
    expected = [vision.normalize(data["train_x"][order[i:i + 64]]) for order in orders for i in range(0, 200, 64)]
    assert [len(b) for b in seen] == [64, 64, 64, 8] * 2 and modes == [True] * 8
    assert all(torch.equal(a, b) for a, b in zip(seen, expected))


def test_the_time_guessed_before_any_step_counts_the_forward_passes(tmp_path, monkeypatch):
    """Before a step is timed, the run's time is guessed from the seconds per image of one timed forward pass: a
    training step as three passes of its batch (a backward costs about two forwards), an evaluation as one pass over
    the training and the test images and one per perturbed copy (--n-sens images x patches x --sigma values). The
    progress lines count the run in steps (3 an epoch here, 3 epochs, an evaluation every 2 epochs and at the end),
    and time the iterations that evaluate apart from the others (the run's seconds split, which report.py --times
    reads). Over an hour on a CPU they print a command of CPU size; under --until-acc the estimate is an upper
    bound."""
    made, ticks, timed = [], [], []
    real, tick = Results.progress, runs.Progress.tick
    monkeypatch.setattr(vision, "time_forward", lambda model, batch: timed.append(len(batch)) or 1e-3)
    monkeypatch.setattr(Results, "progress", lambda self, *a, **kw: made.append((a, kw)) or real(self, *a, **kw))
    monkeypatch.setattr(runs.Progress, "tick", lambda self, step, evaluating, *a: ticks.append((step, evaluating)) or
                        tick(self, step, evaluating, *a))
    argv = ["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "8", "--n-train", "30", "--batch-size", "10",
            "--epochs", "3", "--eval-every", "2", "--n-test", "10", "--n-sens", "2", "--sens-patch", "7", "--sigma",
            "0.1", "1", "3", "--out-dir", str(tmp_path)]
    data = vision.main(vision.parse_args(argv))
    (a, kw), = made
    assert a[1:] == (0, 9, 6) and kw["per_epoch"] == 3  # from step 0 to 9, an evaluation every 6 steps
    assert kw["hint"] == vision.CPU_SIZE and kw["early"] is False
    step, evaluation = kw["guess"]
    assert step == pytest.approx(3 * 10 * 1e-3)
    assert evaluation == pytest.approx(1e-3 * (30 + 10 + 2 * 16 * 3))  # 16 patches of 7 x 7 pixels, 3 sigmas
    assert ticks == [(s, s in (0, 6, 9)) for s in range(10)]
    seconds = data["runs"]["mlp/seed0"]["seconds"]
    assert seconds["training"] > 0 and seconds["evaluations"] > 0
    vision.main(vision.parse_args(argv + ["--until-acc", "0.99", "--run-name", "early", "--n-train", "100"]))
    assert made[-1][1]["early"] is True
    assert timed == [30, 64]  # the pass is timed on 64 images at most, never the whole training set


@pytest.mark.slow
def test_the_schedule_sets_every_training_step(tmp_path, monkeypatch):
    """--schedule cosine in a real run: step i of 3 per epoch over 2 epochs runs at lr 0.1 * (1 + cos(pi e / 2)) / 2,
    e = i / 3 (the schedule reaches the optimizer through the training loop)."""
    Spy.lrs = []
    monkeypatch.setattr(torch.optim, "SGD", Spy)
    argv = ["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "8", "--n-train", "30", "--batch-size", "10",
            "--epochs", "2", "--schedule", "cosine", "--lr", "mlp=0.1", "--n-test", "10", "--n-sens", "2",
            "--out-dir", str(tmp_path)]
    vision.main(vision.parse_args(argv))
    assert Spy.lrs == pytest.approx([0.05 * (1 + math.cos(math.pi * i / 6)) for i in range(6)])


def test_training_stops_at_its_end_point(tmp_path):
    """--until-acc stops at the first evaluation whose train accuracy reaches the level; --patience when that many
    evaluations in a row bring no training loss 1% below the best; the final numbers say which end point it was, and
    the progress lines end there (the final measurements, not the 50 epochs' steps)."""
    h = [{"train_acc": a, "train_loss": loss} for a, loss in [(0.5, 1.0), (0.7, 0.8), (0.8, 0.795), (0.8, 0.794),
                                                             (0.85, 0.8)]]
    assert report.end_point(h, until_acc=0.85) == "train accuracy reached 0.85"
    assert report.end_point(h, until_acc=0.9) is None and report.end_point(h[:4], patience=2) is not None
    assert report.end_point(h, patience=3) == "training loss stopped falling"
    assert report.end_point(h, patience=4) is None
    falling = [{"train_acc": 0.5, "train_loss": 0.95 ** i} for i in range(6)]  # 5% lower each time: still falling
    assert report.end_point(falling, patience=2) is None
    data = separable_task()
    args = vision.parse_args(["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--epochs", "50",
                              "--batch-size", "20", "--lr", "0.05", "--n-sens", "5", "--eval-every", "1",
                              "--until-acc", "0.95"])
    results = Results(str(tmp_path), "vision", vars(args), "cpu")
    made, real = [], results.progress
    results.progress = lambda *a, **k: made.append(real(*a, **k)) or made[-1]  # the run's Progress
    vision.train(name="mlp", seed=0, args=args, data=data, results=results, device=torch.device("cpu"))
    run = results.data["runs"]["mlp/seed0"]
    assert made[0].total == made[0].last[1] == run["final"]["step"] < 50 * 10  # 10 steps an epoch
    accs = [r["train_acc"] for r in run["history"]]
    assert accs[-1] >= 0.95 and max(accs[:-1]) < 0.95 and len(accs) < 51  # stopped at the first one above
    assert run["final"]["stopped"] == "train accuracy reached 0.95" and run["final"]["epoch"] == len(accs) - 1


def test_the_final_model_is_measured_at_every_sweep_sigma_with_the_runs_flags(tmp_path):
    """--sweep measures the final model at every sigma of SWEEP besides --sigma, under every --mask; what a run
    reports equals measure_sensitivity of its final model with the run's --reps, --sens-seed, --sens-positions and
    patch grid."""
    data = separable_task()
    args = vision.parse_args(["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--epochs", "1",
                              "--batch-size", "50", "--n-sens", "6", "--sigma", "30", "--sweep", "--reps", "2",
                              "--sens-seed", "7", "--mask", "patch", "global", "--sens-positions", "20"])
    results = Results(str(tmp_path), "vision", vars(args), "cpu")
    model = vision.train(name="mlp", seed=0, args=args, data=data, results=results, device=torch.device("cpu"))
    final = results.data["runs"]["mlp/seed0"]["final"]
    assert set(final["sens_at"]) == {f"{m}:{s:g}" for m in ["patch", "global"] for s in vision.SWEEP}
    again = vision.measure_sensitivity(model, vision.normalize(data["train_x"][:6]), patch=4, sigmas=[30, 100],
                                       masks=["patch"], seed=7, reps=2, positions=20)
    for sigma in [30, 100]:  # 30: measured at the last evaluation and reused; 100: measured after training
        assert final["per_image"][f"patch:{sigma:g}"] == [round(v, 6) for v in again["patch", sigma].per_input.tolist()]
        assert any(again["patch", sigma].per_input > 0)  # not vacuous: the noise flips some predictions
    assert again["patch", 30].evaluations == 6 * 20 * 2  # 20 of the 49 patches per image, twice each


def test_flat_patches_flag_adds_the_two_measurements_to_the_final_numbers(tmp_path):
    """--flat-patches S measures the final model on flat and object patches at the first sigma, with the run's noise
    seed and --reps: keys flat:<sigma> and object:<sigma> in sens_at and per_image, equal to measure_sensitivity's."""
    data = separable_task()
    data["train_x"][:, :, :8] = 0  # a flat band of background on every image
    args = vision.parse_args(["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--epochs", "1",
                              "--batch-size", "50", "--n-sens", "6", "--sigma", "30", "1", "--flat-patches", "0.01",
                              "--sens-seed", "7", "--reps", "2"])
    results = Results(str(tmp_path), "vision", vars(args), "cpu")
    model = vision.train(name="mlp", seed=0, args=args, data=data, results=results, device=torch.device("cpu"))
    final = results.data["runs"]["mlp/seed0"]["final"]
    assert list(final["sens_at"]) == ["patch:1", "patch:30", "flat:30", "object:30"]
    again = vision.measure_sensitivity(model, vision.normalize(data["train_x"][:6]), patch=4, sigmas=[30],
                                       masks=["flat"], seed=7, reps=2, flat=0.01)
    assert final["per_image"]["flat:30"] == [round(v, 6) for v in again["flat", 30].per_input.tolist()]
    assert final["per_image"]["object:30"] == [round(v, 6) for v in again["object", 30].per_input.tolist()]
    assert any(again["flat", 30].per_input > 0) and any(again["object", 30].per_input > 0)  # not all zero


LAZY = ["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--epochs", "8", "--eval-every", "1",
        "--n-train", "60", "--n-test", "20", "--n-sens", "4", "--batch-size", "20", "--sigma", "1", "3", "--lr",
        "0.05", "--match-acc", "0.45", "0.7", "--sweep"]  # train accuracy 0.12, 0.25, 0.47, ... 0.72 (epoch 6), 0.78


def without_sens(row):
    return {k: v for k, v in row.items() if not k.startswith("sens") and k != "time"}


def test_sens_during_needed_gives_the_numbers_of_measuring_every_evaluation(tmp_path):
    """--sens-during needed measures the sensitivity during training at the last evaluation and at the two around
    each --match-acc crossing only: training is unchanged (every accuracy and loss), the rows it measures and every
    final number (the sweep, the per-image flips, the matched-accuracy readings) equal those of a run measuring every
    evaluation, and it skips the others (here epochs 3, 4 and 7 of 0-8; 0.1 is reached at the first, epoch 0)."""
    runs = {}
    for mode in ["every", "needed"]:
        argv = LAZY + ["--match-acc", "0.1", "0.45", "0.7", "--sens-during", mode, "--out-dir", str(tmp_path),
                       "--run-name", mode]
        runs[mode] = vision.main(vision.parse_args(argv))["runs"]["mlp/seed0"]
    every, needed = runs["every"], runs["needed"]
    assert [without_sens(h) for h in needed["history"]] == [without_sens(h) for h in every["history"]]
    measured = [h["epoch"] for h in needed["history"] if "sens" in h]
    assert measured == [0, 1, 2, 5, 6, 8]  # at 0.1 (epoch 0), around 0.45 (1-2) and 0.7 (5-6), and the last
    for h in needed["history"]:
        if "sens" in h:
            assert {k: v for k, v in h.items() if k != "time"} == \
                {k: v for k, v in every["history"][h["epoch"]].items() if k != "time"}
        else:
            assert not any(k.startswith("sens") for k in h)
    assert needed["final"]["match_acc"]["0.7"] is not None and needed["final"] == every["final"]


class Killed(BaseException):
    """kill -9: neither Ctrl-C nor an error, so nothing more is written."""


def test_sens_during_needed_resumes_with_the_weights_it_kept(tmp_path, monkeypatch):
    """kill -9 right after the checkpoint at the top of epoch 6, whose evaluation crosses 0.7 (epoch 5's sensitivity
    was not measured): the checkpoint keeps epoch 5's weights, so the resumed run measures them at the crossing and
    ends with the numbers of an uninterrupted run."""
    argv = LAZY + ["--sens-during", "needed", "--out-dir", str(tmp_path), "--save-every", "1"]
    whole = vision.main(vision.parse_args(argv + ["--run-name", "whole"]))
    real, calls = Results.write_checkpoint, []

    def write_then_die(self):
        real(self)
        calls.append(1)
        if len(calls) == 7:  # epochs 0-6
            raise Killed

    monkeypatch.setattr(Results, "write_checkpoint", write_then_die)
    with pytest.raises(Killed):
        vision.main(vision.parse_args(argv + ["--run-name", "cut"]))
    monkeypatch.undo()
    cut = json.loads((tmp_path / "vision" / "cut" / "metrics.json").read_text())["runs"]["mlp/seed0"]["history"]
    assert [h["epoch"] for h in cut] == [0, 1, 2, 3, 4, 5] and "sens" not in cut[-1]  # epoch 5: weights kept only
    resumed = vision.main(vision.parse_args(["--resume", str(tmp_path / "vision" / "cut")]))
    drop = lambda r: ([{k: v for k, v in h.items() if k != "time"} for h in r["history"]], r["final"])  # noqa: E731
    assert drop(resumed["runs"]["mlp/seed0"]) == drop(whole["runs"]["mlp/seed0"])


def shifted(img, dx, dy):
    """img moved dx pixels right and dy down, zeros where it came in from (negative: left, up)."""
    out = torch.zeros_like(img)
    H, W = img.shape[-2:]
    out[..., max(dy, 0):H + min(dy, 0), max(dx, 0):W + min(dx, 0)] = \
        img[..., max(-dy, 0):H + min(-dy, 0), max(-dx, 0):W + min(-dx, 0)]
    return out


@pytest.mark.parametrize("shift,moves", [("1", [(1, 0), (-1, 0), (0, 1), (0, -1)]),
                                         ("half", [(2, 2), (-2, 2), (2, -2), (-2, -2)])])
def test_shifted_patch_tokens_are_the_image_and_its_four_shifts(shift, moves):
    """SPT stacks the image with four shifted copies on the channels before cutting patches: one pixel right, left,
    down and up ('1', the authors' code), or half a patch along each diagonal ('half', Lee et al.)."""
    spt = vits.ShiftedPatchTokenization(2, 4, 8, shift=shift)
    spt.norm, spt.proj = nn.Identity(), nn.Identity()  # the stacked patches themselves
    img = torch.randn(3, 2, 8, 8)
    stacked = torch.cat([img] + [shifted(img, dx, dy) for dx, dy in moves], dim=1)
    assert torch.equal(spt(img), patchify(stacked, 4))


def test_spt_shift_flag_reaches_the_vit():
    """--spt-shift half gives vision.py's ViT the half-patch diagonal shifts; the default, the authors' one pixel."""
    for flags, first_shift in [([], (1, -1, 0, 0)), (["--spt-shift", "half"], (2, -2, 2, -2))]:  # F.pad amounts
        args = vision.parse_args(["--dataset", "fake28", "--patch-size", "4", *flags])
        assert vision.build_model("vit", args, 1, 28, 10).tokens.shifts[0] == first_shift


def test_vit_attention_drops_its_attention_weights_in_training():
    """ViT-small's attention applies --dropout to its attention weights while training, besides its output (as the
    authors' vit_small.py does); evaluating, to neither."""
    att = vits.Attention(16, 2, 8, dropout=0.5)
    att.out[1].p = 0.0  # the output's dropout off: what is left to draw is the attention weights'
    x = torch.randn(2, 5, 16)
    assert not torch.equal(att(x), att(x))  # a new draw each call
    att.eval()
    assert torch.equal(att(x), att(x))


def test_sincos_positions_are_their_formula():
    """sincos_2d(h, w, dim): the patch in row i and column j gets [sin(j w_k), cos(j w_k), sin(i w_k), cos(i w_k)]
    over k < dim/4, with w_k = 1 / 10000^(k / (dim/4 - 1))."""
    h, w, dim = 3, 4, 16
    pos = vits.sincos_2d(h, w, dim)
    omega = [1 / 10000 ** (k / 3) for k in range(4)]
    for i in range(h):
        for j in range(w):
            want = [math.sin(j * o) for o in omega] + [math.cos(j * o) for o in omega] + \
                [math.sin(i * o) for o in omega] + [math.cos(i * o) for o in omega]
            assert pos[i * w + j].tolist() == pytest.approx(want, abs=1e-6)


def class_and_patches(vit, img):
    """What the ViT's transformer is given: the class token before the SPT tokens, plus the learned positions."""
    return torch.cat([vit.cls.expand(len(img), 1, -1), vit.tokens(img)], dim=1) + vit.pos


def test_a_vit_computes_only_the_class_token_in_its_last_block():
    """The head reads the class token alone, so a ViT's last block computes only its row: its query over every
    token's keys and values (LSA: not its own), its MLP, the final norm. Evaluating, those are the full computation's
    logits up to float rounding, and its predictions. Training, it draws every token's dropout masks and keeps the
    class token's rows: the same random draws as computing every token, the same logits and gradients up to float
    rounding, so the same training as the runs before it up to rounding."""
    torch.manual_seed(0)
    args = vision.parse_args(["--dataset", "fake28"] + SMALL)
    vit = vision.build_model("vit", args, 1, 28, 10)
    img = torch.randn(256, 1, 28, 28)
    t = vit.transformer
    with torch.no_grad():
        for p in vit.parameters():  # away from LayerNorm's 1 and 0 and the zero biases
            p.add_(0.1 * torch.randn_like(p))
        tokens = class_and_patches(vit, img)
        vit.eval()
        full, first = t(tokens), t(tokens, rows=1)
        assert first.shape == (256, 1, 32)  # the other 49 rows are not computed
        assert torch.allclose(first[:, 0], full[:, 0], atol=1e-5)
        x = tokens  # by hand: the first block whole, then the class token's query in the last
        x = x + t.layers[0][0](x)
        x = x + t.layers[0][1](x)
        attn, ff = t.layers[1]
        q, k, v = attn.qkv(attn.norm(x)).view(256, 50, 3, 2, 8).permute(2, 0, 3, 1, 4)
        scores = (q[:, :, :1] * attn.log_temperature.exp()) @ k.transpose(-2, -1)  # (256, 2, 1, 50)
        scores[..., 0] = float("-inf")  # LSA: the class token does not attend to itself
        y = x[:, :1] + attn.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(256, 1, 16))
        assert torch.allclose(first, t.norm(y + ff(y)), atol=1e-5)
        logits = vit(img)
        assert torch.equal(logits, vit.head(first[:, 0]))
        assert torch.allclose(logits, vit.head(full[:, 0]), atol=1e-5)
        assert torch.equal(logits.argmax(1), vit.head(full[:, 0]).argmax(1))
    vit.train()
    seen = []
    hook = t.layers[-1][1].register_forward_hook(lambda m, inputs, out: seen.append(out.shape))
    labels = torch.randint(10, (256,))
    runs = []
    for forward in [vit, lambda img: vit.head(t(vit.drop(class_and_patches(vit, img)))[:, 0])]:  # then every token
        vit.zero_grad()
        torch.manual_seed(1)
        logits = forward(img)
        F.cross_entropy(logits, labels).backward()
        runs.append((logits.detach(), [p.grad.clone() for p in vit.parameters()], torch.rand(8)))
    hook.remove()
    assert seen == [(256, 1, 32), (256, 50, 32)]  # training computes the class token alone in the last MLP
    (alone, grads, after), (every, grads_every, after_every) = runs
    assert torch.equal(after, after_every)  # as many dropout draws: the generator ends in the same state
    assert torch.allclose(alone, every, atol=1e-5) and not torch.allclose(alone, vit.eval()(img), atol=1e-3)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, grads_every))  # the same masks: same gradients
    assert sum((g != 0).any().item() for g in grads) == len(grads)  # every parameter learns, the qkv's q too
    plain = vits.Transformer(32, 2, 2, 8, 64, dropout=0.1)  # softmax attention at 1/sqrt(d_head), no LSA mask
    x = torch.randn(16, 50, 32)
    torch.manual_seed(2)
    alone = plain(x, rows=1)[:, 0]
    torch.manual_seed(2)
    assert torch.allclose(alone, plain(x)[:, 0], atol=1e-5)


def test_the_vits_compute_their_formulas_from_their_parts():
    """Transformer: x + attention(x), then x + MLP(x), in every block, then a LayerNorm. ViT: the class token
    before the SPT tokens, plus the learned positions, the head reading the class token. ViT-simple: embedded patches
    plus the sin-cos positions, the head reading the mean token, and no dropout anywhere. LSA's learned temperature
    starts at dim_head^-1/2."""
    torch.manual_seed(0)
    args = vision.parse_args(["--dataset", "fake28"] + SMALL)
    img = torch.randn(3, 1, 28, 28)
    vit, simple = (vision.build_model(name, args, 1, 28, 10).eval() for name in ["vit", "vit-simple"])
    assert vit.transformer.layers[0][0].log_temperature.exp().item() == pytest.approx(8 ** -0.5)
    with torch.no_grad():
        for m in [vit, simple]:
            for p in m.parameters():  # away from LayerNorm's 1 and 0, so that a sign or a sum shows
                p.add_(0.1 * torch.randn_like(p))

        def blocks(t, x):
            for attn, ff in t.layers:
                x = x + attn(x)
                x = x + ff(x)
            return t.norm(x)

        x = torch.randn(3, 50, 32)
        assert torch.equal(vit.transformer(x), blocks(vit.transformer, x))
        tokens = class_and_patches(vit, img)
        assert torch.equal(vit.embed(img), tokens)
        assert torch.equal(vit(img), vit.head(vit.transformer(tokens, rows=1)[:, 0]))  # evaluating: the class alone
        tokens = simple.embed(patchify(img, 4)) + vits.sincos_2d(7, 7, 32)
        assert torch.equal(simple(img), simple.head(simple.transformer(tokens).mean(1)))
    assert all(m.p == 0 for m in simple.modules() if isinstance(m, nn.Dropout))
    assert all(not isinstance(m, nn.Dropout) or m.p == args.dropout > 0 for m in vit.modules())


def test_the_vit_computes_the_class_token_alone_except_training_on_a_gpu():
    """On a GPU the ViT computes the class token alone when evaluating, and every token when training (its fused
    dropout draws would change otherwise); a device without data stands in for the GPU."""
    args = vision.parse_args(["--dataset", "fake28"] + SMALL)
    vit, rows = vision.build_model("vit", args, 1, 28, 10).to("meta"), []
    transformer = vit.transformer.forward
    vit.transformer.forward = lambda x, r=None: rows.append(r) or transformer(x, r)
    for training in [False, True]:
        assert vit.train(training)(torch.randn(3, 1, 28, 28, device="meta")).shape == (3, 10)
    assert rows == [1, None]


def test_the_vits_have_the_parameters_of_their_papers():
    """Parameter counts by hand: the qkv projection has no bias (as vit-pytorch and the authors' code), LSA adds one
    temperature per block, SPT's LayerNorm and projection read 5 * C * p^2 values per patch, ViT-simple's sin-cos
    positions are a buffer (not learned)."""
    args = vision.parse_args(["--dataset", "fake28"] + SMALL + ["--depth", "3"])  # dim 32, 2 heads of 8, MLP 64
    d, inner, mlp, T, patch = 32, 16, 64, 49, 16  # 7 x 7 patches of 4 x 4 pixels

    def blocks(lsa):
        attn = 2 * d + d * 3 * inner + inner * d + d + lsa  # LayerNorm, qkv (no bias), output projection, temperature
        ff = 2 * d + d * mlp + mlp + mlp * d + d
        return 3 * (attn + ff) + 2 * d  # 3 blocks (a depth unlike the 2 heads), and the final LayerNorm

    spt = 5 * patch
    vit = 2 * spt + spt * d + d + d + (T + 1) * d + blocks(1) + d * 10 + 10  # SPT, class token, positions, head
    simple = 2 * patch + patch * d + d + 2 * d + blocks(0) + d * 10 + 10  # embedding's two LayerNorms and linear map
    for name, want in [("vit", vit), ("vit-simple", simple)]:
        model = vision.build_model(name, args, 1, 28, 10)
        assert sum(p.numel() for p in model.parameters()) == want, name
        assert [m.heads for m in model.modules() if isinstance(m, vits.Attention)] == [2] * 3, name  # not 8 of 2


def test_the_vit_mlp_is_layernorm_linear_gelu_linear():
    """FeedForward by hand, in eval mode: fc2(GELU(fc1(LayerNorm(x))))."""
    ff = vits.FeedForward(8, 16, 0.5).eval()
    fc1, fc2 = [m for m in ff.net if isinstance(m, nn.Linear)]
    x = torch.randn(3, 5, 8)
    assert torch.allclose(ff(x), fc2(F.gelu(fc1(F.layer_norm(x, (8,))))), atol=1e-6)


def test_convmixer_takes_the_patch_size_and_during_training_the_sampled_positions(monkeypatch):
    """--patch-size is ConvMixer's patch embedding; measure_during passes --sens-positions to the estimator."""
    for p in [2, 4]:
        model = vision.build_model("convmixer", vision.parse_args(["--dataset", "fake", "--patch-size", str(p)]), 3,
                                   32, 10)
        assert model.embed[0].kernel_size == model.embed[0].stride == (p, p)
    seen = []
    monkeypatch.setattr(vision, "measure_sensitivity", lambda *a, **kw: seen.append(kw["positions"]))
    vision.measure_during(None, None, vision.parse_args(["--dataset", "fake", "--sens-positions", "3"]))
    assert seen == [3]


def test_compile_trains_through_the_compiled_model_and_measures_the_eager_one(tmp_path, monkeypatch):
    """--compile: the training steps run through torch.compile's module, the evaluations and the sensitivity through
    the model itself (a compiled one would compile again for every new batch shape). torch.compile is replaced by a
    wrapper that counts its calls, so the test needs no compiler."""

    class Compiled(nn.Module):
        calls = 0

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            Compiled.calls += 1
            return self.model(x)

    monkeypatch.setattr(torch, "compile", Compiled)
    seen = []
    for name in ["evaluate", "measure_sensitivity"]:
        real = getattr(vision, name)
        monkeypatch.setattr(vision, name, lambda model, *a, real=real, **kw: seen.append(type(model))
                            or real(model, *a, **kw))
    vision.main(vision.parse_args(["--dataset", "fake28", "--model", "mlp", "--n-train", "40", "--n-test", "10",
                                   "--n-sens", "4", "--steps", "3", "--batch-size", "20", "--compile",
                                   "--out-dir", str(tmp_path)] + SMALL))
    assert Compiled.calls == 3  # one per training step
    assert seen and Compiled not in seen


def test_augment_trains_every_batch_on_its_augmented_images(tmp_path, monkeypatch):
    """--augment on a 32x32 set: each training batch goes through augment_batch (uint8 images and the run's own
    generator), and the model trains on what it returns, not on the batch itself."""
    augmented, trained, augment, forward = [], [], vision.augment_batch, vision.MLP.forward
    monkeypatch.setattr(vision, "augment_batch", lambda x, g: augmented.append(augment(x, g)) or augmented[-1])
    monkeypatch.setattr(vision.MLP, "forward",
                        lambda self, x: (trained.append(x) if self.training else None) or forward(self, x))
    argv = ["--dataset", "fake", "--augment", "--model", "mlp", "--epochs", "1", "--n-train", "40", "--n-test", "10",
            "--n-sens", "4", "--batch-size", "20", "--out-dir", str(tmp_path), "--no-figures"] + SMALL
    vision.main(vision.parse_args(argv))
    assert len(augmented) == len(trained) == 2
    for a, t in zip(augmented, trained):
        assert a.dtype == torch.uint8 and a.shape == (20, 3, 32, 32) and torch.equal(t, vision.normalize(a))


def test_the_sampled_positions_tool_gives_what_a_run_sampling_those_positions_stores(tmp_path, monkeypatch, capsys,
                                                                                     kept_threads):
    """tools/sampled_positions.py on one-model runs (a ViT and an MLP, two seeds): each checkpoint is checked at the
    first sigma, every patch; the paired differences "every patch" are the stored ones, and "sampled" (8 patches by
    default) those that runs trained the same way with --sens-positions 8 store (sensitivity has its own generator:
    the same models), each moved by |every patch - sampled| / s.e.; the times are the clock's (a stand-in), the
    sweep's as len(sigmas) times the check's. A move without error is 0 or infinitely many, and the summary counts
    the moves beyond 2. It refuses a checkpoint that is not the final model, a folder of two models, folders
    without a ViT or with the ViT alone, a folder without metrics.json or checkpoint.pt, a damaged metrics.json or
    another script's, and --positions 0."""
    import sampled_positions

    def train(model, seed, *extra):
        name = f"{model}-{seed}{''.join(extra)}".replace("--sens-positions", "-k")
        vision.main(vision.parse_args(["--dataset", "fake28", "--patch-size", "7", "--model", model, "--epochs", "1",
                                       "--n-train", "40", "--n-test", "10", "--n-sens", "6", "--sigma", "0.3", "3",
                                       "--mask", "patch", "global", "--seeds", str(seed), "--save-every", "1",
                                       "--no-figures", "--out-dir", str(tmp_path), "--run-name", name, *extra] + SMALL))
        return str(tmp_path / "vision" / name)

    def paired(folders):  # (model, key) -> (mean, stderr) of the paired differences of the stored per-image numbers
        stored = {}
        for f in folders:
            run, = json.loads(open(os.path.join(f, "metrics.json")).read())["runs"].values()
            stored[run["model"], run["seed"]] = {k: v for k, v in run["final"]["per_image"].items()
                                                 if k.startswith("patch:")}
        return {(m, k): (d["mean"], d["stderr"]) for m, ds in paired_differences(stored, "vit")["models"].items()
                for k, d in ds["diff"].items()}

    def tool(*argv):
        monkeypatch.setattr(sys, "argv", ["sampled_positions.py", *argv])
        sampled_positions.main()
        return capsys.readouterr().out

    every = [train(m, s) for m in ("vit", "mlp") for s in (0, 1)]
    sampled = [train(m, s, "--sens-positions", "8") for m in ("vit", "mlp") for s in (0, 1)]
    capsys.readouterr()
    # a clock that reads the check as a s and the sampled sweep as b: their sums over the four folders, 8a / 60 =
    # 10.04 and 4b / 60 = 6.04 min, print as 10.0 and 6.0, one second more as 10.1 and 6.1, and in 61ths as 9.9, 5.9
    a, b = 75.3, 90.6
    ticks = itertools.accumulate(itertools.cycle([0.0, a, 7.0, b]))
    monkeypatch.setattr(sampled_positions, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    calls, measure = [], vision.measure_sensitivity
    monkeypatch.setattr(vision, "measure_sensitivity", lambda *x, sigmas, positions=None, **kw: calls.append(
        (sigmas, positions)) or measure(*x, sigmas=sigmas, positions=positions, **kw))
    printed = printing(monkeypatch, sampled_positions)  # each folder's line is flushed as it is printed
    torch.set_num_threads(2)
    out = tool(*every)
    assert torch.get_num_threads() == 1  # the tool measures in one thread, as the runs did
    assert calls == [([0.3], None), ([0.3, 3.0], 8)] * 4  # the check at the first sigma, then the sweep, sampled
    assert [kw.get("flush") for _, kw in printed[:4]] == [True] * 4
    lines = out.strip().splitlines()
    assert lines[:4] == [f"{f}: {m}/seed{s} checked; 2 sigmas: every patch about 151 s, 8 sampled 91 s"
                         for f, (m, s) in zip(every, [("vit", 0), ("vit", 1), ("mlp", 0), ("mlp", 1)])]
    full, part = paired(every), paired(sampled)
    assert sorted(full) == [("mlp", "patch:0.3"), ("mlp", "patch:3")]
    moves = []
    for (model, key), (mean, se) in full.items():
        y, ye = part[model, key]
        moves.append(abs(mean - y) / se)
        assert (f"{model} - vit {key}: every patch {mean:+.4f} +- {se:.4f} | 8 sampled {y:+.4f} +- {ye:.4f} | "
                f"moved {moves[-1]:.2f} s.e.") in lines
    assert lines[-1] == (f"2 paired differences: {sum(z > 2 for z in moves)} moved beyond 2 s.e., the most "
                         f"{max(moves):.2f}; the patch sweeps took 10.0 min with every patch, 6.0 sampled")
    assert any(x != y for x, y in zip(full.values(), part.values()))  # sampling moved something
    assert tool(*every, "--positions", "8") == out
    with pytest.raises(SystemExit, match="^0$"):
        tool("--help")
    helped = capsys.readouterr().out
    assert "\n    python tools/sampled_positions.py out/vision/conv-*-seed? --positions 8\n" in helped
    assert "patches sampled per image and sigma" in helped and "one-model vision.py run folders" in helped

    # made-up differences: 2.5 s.e., none without error, some without error (infinitely many), 2.5 again
    made = iter([{"models": {"mlp": {"diff": {k: {"mean": m, "stderr": e} for k, (m, e) in zip("abcd", pairs)}}}}
                 for pairs in ([(0.1, 0.01), (0.0, 0.0), (0.5, 0.0), (0.2, 0.1)],
                               [(0.125, 0.0), (0.0, 0.0), (0.6, 0.0), (0.45, 0.0)])])
    monkeypatch.setattr(sampled_positions, "paired_differences", lambda stored, reference: next(made))
    lines = tool(*every).strip().splitlines()
    assert [line.split("| moved ")[1] for line in lines[4:8]] == ["2.50 s.e.", "0.00 s.e.", "inf s.e.", "2.50 s.e."]
    assert lines[-1].startswith("4 paired differences: 3 moved beyond 2 s.e., the most inf; ")

    ckpt = os.path.join(every[2], "checkpoint.pt")
    state = torch.load(ckpt, weights_only=False)
    for v in state["state"]["model"].values():
        v.mul_(0.5)
    torch.save(state, ckpt)
    with pytest.raises(SystemExit, match="its checkpoint does not give the stored sensitivity .*: not the final mod"):
        tool(every[0], every[2])  # (an MLP alone would be refused first: no ViT to pair it with)
    measured = len(calls)
    with pytest.raises(SystemExit, match="no ViT among the folders: nothing to pair against"):
        tool(every[3])
    with pytest.raises(SystemExit, match=r"^no model but vit among the folders: nothing to pair with it \(give the "):
        tool(every[0], every[1])
    assert len(calls) == measured  # both refused before any folder is measured
    two = str(tmp_path / "vision" / "two")
    vision.main(vision.parse_args(["--dataset", "fake28", "--patch-size", "7", "--model", "vit", "mlp", "--epochs",
                                   "1", "--n-train", "20", "--n-test", "10", "--n-sens", "2", "--save-every", "1",
                                   "--no-figures", "--out-dir", str(tmp_path), "--run-name", "two"] + SMALL))
    with pytest.raises(SystemExit, match="2 models in one folder; the checkpoint holds the last one only"):
        tool(two)
    os.remove(os.path.join(two, "checkpoint.pt"))  # a run saved without it, and no run at all: one line each
    for folder, need in [(two, "checkpoint.pt"), (str(tmp_path / "nope"), "metrics.json")]:
        with pytest.raises(SystemExit, match=f"^{folder}: no {need}: not a vision.py run folder saved with its "
                                             "checkpoint \\(--save-every\\)$"):
            tool(folder)
    bad = tmp_path / "bad"  # a damaged metrics.json, and another script's: one line each
    bad.mkdir()
    (bad / "checkpoint.pt").touch()
    for text, says in [("{bad", "is not a valid metrics.json"), ('{"script": "language", "runs": {}}',
                                                                 "was written by language.py, not vision.py")]:
        (bad / "metrics.json").write_text(text)
        with pytest.raises(SystemExit, match=f"^{bad}: {bad}/metrics.json {says}"):
            tool(str(bad))
    with pytest.raises(SystemExit, match="^2$"):
        tool(*every, "--positions", "0")
    assert "argument --positions: must be an integer >= 1, got 0" in capsys.readouterr().err
