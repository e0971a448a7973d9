"""vision.py: model shapes, the patch-grid sensitivity on a model with a known answer, the data pipeline, the offline
error, and short end-to-end runs on fake data."""

import json
import urllib.error
import urllib.request

import pytest
import torch
import torch.nn as nn

import vision
from common import patchify

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
    sens = vision.measure_sensitivity(OnePatch(5), images, 8, [1.0], ["patch"], seed=0, reps=3)
    s = sens["patch:1"]
    assert s.per_position[5] > 0.2
    assert torch.equal(torch.cat([s.per_position[:5], s.per_position[6:]]), torch.zeros(15))
    assert s.mean == pytest.approx(s.per_position[5].item() / 16, rel=1e-5)


def test_global_noise_reaches_every_patch():
    """App. A.2: one global perturbation moves every patch, so the one-patch model flips more often per copy."""
    images = torch.randn(200, 3, 32, 32) * 0.05
    sens = vision.measure_sensitivity(OnePatch(5), images, 8, [4.0], ["patch", "global"], seed=0, reps=3)
    assert sens["global:4"].evaluations == 600 and sens["global:4"].mean > 4 * sens["patch:4"].mean


def test_normalize_and_augment():
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    n = vision.normalize(x)
    assert n.min() >= -1 and n.max() <= 1 and n.dtype == torch.float32
    assert torch.equal(vision.normalize(torch.tensor([0, 255], dtype=torch.uint8)), torch.tensor([-1.0, 1.0]))
    a = vision.augment_batch(x, torch.Generator().manual_seed(0))
    assert a.shape == x.shape and a.dtype == torch.uint8
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


def test_bad_arguments_are_rejected():
    for argv in [["--model", "vgg"], ["--sigma", "-0.1"], ["--dataset", "fake", "--sens-patch", "5"],
                 ["--epochs", "0"], ["--pretrained", "vit_l_16"], ["--lr", "-1"], ["--lr", "vgg=0.1"],
                 ["--lr", "cnn=fast"]]:
        with pytest.raises(SystemExit):
            vision.parse_args(argv)


def test_learning_rates_per_model():
    args = vision.parse_args(["--model", "vit", "cnn", "mlp", "--lr", "0.3", "cnn=0.05"])
    assert args.lr == {"vit": 0.3, "cnn": 0.05, "mlp": 0.3}
    assert vision.parse_args(["--model", "cnn"]).lr == {} and vision.default_lr("cnn", "fashionmnist") == 0.005


def test_end_to_end_on_fake_data(tmp_path):
    """One epoch of two models, two sigmas and the global variant: metrics.json with the documented keys, figures."""
    argv = ["--dataset", "fake28", "--model", "vit", "mlp", "--epochs", "1", "--eval-every", "1", "--n-train", "100",
            "--n-test", "50", "--n-sens", "10", "--sigma", "0.1", "1", "--mask", "patch", "global",
            "--seeds", "0", "1", "--out-dir", str(tmp_path), "--run-name", "t", "--save-model"] + SMALL
    vision.main(vision.parse_args(argv))
    folder = tmp_path / "vision" / "t"
    data = json.loads((folder / "metrics.json").read_text())
    assert set(data["runs"]) == {"vit/seed0", "vit/seed1", "mlp/seed0", "mlp/seed1"}
    final = data["runs"]["vit/seed0"]["final"]
    for key in ["sens", "sens_stderr", "train_acc", "test_acc"]:
        assert isinstance(final[key], float)
    assert set(final["sens_at"]) == {"patch:0.1", "patch:1", "global:0.1", "global:1"}
    assert final["sens"] == final["sens_at"]["patch:0.1"]["sens"]
    assert torch.tensor(final["sens_map"]).shape == (7, 7)
    assert [h["epoch"] for h in data["runs"]["mlp/seed1"]["history"]] == [0, 1]
    for png in ["sensitivity.png", "sigma_sweep.png", "sensitivity_maps.png"]:
        assert (folder / png).stat().st_size > 5000
    assert (folder / "vit-seed0.pt").exists()
    vision.main(vision.parse_args(["--plot", str(folder)]))


def test_pretrained_mode_offline_with_random_weights(tmp_path):
    """--pretrained on an ImageFolder, with torchvision's ConvNeXt-Tiny built without weights (no download)."""
    from PIL import Image
    for cls in ["a", "b"]:
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        Image.new("RGB", (64, 48), (30, 90, 200)).save(tmp_path / "imgs" / cls / "x.png")
    argv = ["--pretrained", "convnext_tiny", "--imagenet-dir", str(tmp_path / "imgs"), "--random-weights",
            "--n-sens", "2", "--sens-positions", "1", "--out-dir", str(tmp_path)]
    data = vision.main(vision.parse_args(argv))
    final = data["runs"]["convnext_tiny/pretrained"]["final"]
    assert 0 <= final["sens"] <= 1 and "sens_stderr" in final


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
