"""imagenet.py: the pretrained models measured with the same noise on the same images, paired per image against the
ViT, and the summary and claims report.py prints from its folder. Small stand-ins replace torchvision's models (the
smoke run of reproduce.sh runs the real architectures with random weights)."""

import json
import math

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

import imagenet
import report


class Constant(nn.Module):
    """Always class 3: sensitivity 0 at every sigma."""

    def forward(self, x):
        out = torch.zeros(len(x), 1000)
        out[:, 3] = 1
        return out


def fake_imagenet(folder, n=6):
    """n random 60 x 40 pictures in an ImageFolder of two classes."""
    rng = np.random.default_rng(0)
    for i in range(n):
        (folder / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(folder / f"class{i % 2}" / f"{i}.png")
    return folder


def test_models_are_paired_per_image_against_the_vit_and_summarised(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    linear = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 1000)).eval()  # flips under noise
    stand_in = {"vit_l_16": Constant(), "convnext_tiny": linear}
    monkeypatch.setattr(imagenet, "load_model", lambda name, random_weights, device: stand_in[name])
    args = imagenet.parse_args(["--imagenet-dir", str(fake_imagenet(tmp_path / "imgs")), "--n-sens", "5",
                                "--sens-positions", "8", "--sigma", "1", "100", "--out-dir", str(tmp_path / "out"),
                                "--run-name", "pretrained"])
    data = imagenet.main(args)
    vit, cnn = data["runs"]["vit_l_16/seed0"]["final"], data["runs"]["convnext_tiny/seed0"]["final"]
    assert all(v["sens"] == 0 for v in vit["sens_at"].values())
    assert cnn["sens_at"]["patch:100"]["sens"] > 0  # the stand-in does flip: the difference below is not 0 - 0
    p = data["paired"]
    assert p["reference"] == "vit_l_16"  # the paper's claim: the ViT below the ConvNet
    for key, d in p["models"]["convnext_tiny"]["diff"].items():
        per_image = torch.tensor(cnn["per_image"][key], dtype=torch.float64)  # minus the constant model's zeros
        mean, se = d["per_seed"]["seed0"]
        assert mean == cnn["sens_at"][key]["sens"] == per_image.mean().item()
        assert math.isclose(se, per_image.std().item() / math.sqrt(5))
    out = capsys.readouterr().out
    assert f"convnext_tiny - vit_l_16 | patch:1 {report.paired_text(p['models']['convnext_tiny']['diff']['patch:1'])}" \
           in out
    report.claims(str(tmp_path / "out"))
    claims = capsys.readouterr().out
    assert "[imagenet] imagenet/pretrained (1 seed, 1 folder)\n" in claims
    assert "vit_l_16/seed0 | patch:1 0.0000 +- 0.0000 | patch:100 0.0000 +- 0.0000" in claims


def test_resume_measures_only_the_models_a_stopped_run_had_not_finished(tmp_path, monkeypatch):
    """--resume FOLDER alone (no --imagenet-dir: the folder's flags) keeps the models measured before the stop and
    measures the others; the pairs are then made as in an uninterrupted run."""
    loaded = []

    def load(name, random_weights, device):
        loaded.append(name)
        return Constant()

    monkeypatch.setattr(imagenet, "load_model", load)
    argv = ["--imagenet-dir", str(fake_imagenet(tmp_path / "imgs")), "--n-sens", "3", "--sens-positions", "2",
            "--out-dir", str(tmp_path / "out"), "--run-name", "pretrained"]
    whole = imagenet.main(imagenet.parse_args(argv))
    path = tmp_path / "out" / "imagenet" / "pretrained" / "metrics.json"
    data = json.loads(path.read_text())
    del data["runs"]["vit_l_16/seed0"], data["paired"]  # stopped while measuring the second model
    path.write_text(json.dumps(data))
    loaded.clear()
    again = imagenet.main(imagenet.parse_args(["--resume", str(path.parent)]))
    assert loaded == ["vit_l_16"]
    assert again["runs"]["convnext_tiny/seed0"]["final"] == whole["runs"]["convnext_tiny/seed0"]["final"]
    assert again["paired"] == whole["paired"]


def test_subsets_of_images_merge_as_seeds_paired_within_each(tmp_path, monkeypatch):
    """Two --data-seed runs merged with --vary data-seed: each model has two "seeds" (subsets), and the difference
    against the ViT is the mean over the subsets of the per-subset paired means."""
    torch.manual_seed(0)
    linear = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 1000)).eval()
    stand_in = {"vit_l_16": Constant(), "convnext_tiny": linear}
    monkeypatch.setattr(imagenet, "load_model", lambda name, random_weights, device: stand_in[name])
    imgs, folders = fake_imagenet(tmp_path / "imgs"), []
    for s in [0, 1]:
        imagenet.main(imagenet.parse_args(["--imagenet-dir", str(imgs), "--n-sens", "4", "--sigma", "100",
                                           "--data-seed", str(s), "--out-dir", str(tmp_path), "--run-name", f"d{s}"]))
        folders.append(str(tmp_path / "imagenet" / f"d{s}"))
    merged = report.merge(folders, vary=["data-seed"])
    d = merged["paired"]["models"]["convnext_tiny"]["diff"]["patch:100"]
    per_subset = [merged["runs"][f"convnext_tiny/seed{s}"]["final"]["sens_at"]["patch:100"]["sens"] for s in [0, 1]]
    assert d["seeds"] == 2 and math.isclose(d["mean"], sum(per_subset) / 2, abs_tol=1e-6)  # (6 digits per image)
