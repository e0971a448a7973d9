"""robustness.py: corruption accuracy of any [0, 1]-image model against a known answer, the regulariser's noise,
sharpness, and end-to-end runs (generated corruptions, a fake 19-file release, the six models of Fig. 9)."""

import json
import math
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import corruptions as C
from common import patchify
import robustness as R
from runs import write_json
from test_common import phi
from test_corruptions import write_frost_textures
import vision


def test_regulariser_noise_is_one_patch_of_the_stated_std():
    """N(0, std^2) on every value of exactly one patch of the grid per image, nothing elsewhere."""
    x = torch.zeros(400, 3, 32, 32)
    y = R.random_patch_noise(x, 8, 0.7, torch.Generator().manual_seed(0))
    tokens = patchify(y, 8)  # (400, 16, 192)
    touched = (tokens != 0).any(-1)
    assert (touched.sum(1) == 1).all() and (tokens[touched] != 0).all()
    assert tokens[touched].std().item() == pytest.approx(0.7, rel=0.02) and abs(tokens[touched].mean()) < 0.01
    assert len(set(touched.float().argmax(1).tolist())) == 16  # every patch gets picked


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


@pytest.mark.slow
def test_end_to_end_and_from_vision(tmp_path, monkeypatch):
    small = ["--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16", "--mlp-dim", "32", "--n-train", "60",
             "--n-sens", "5", "--epochs", "1", "--out-dir", str(tmp_path), "--dataset", "fake28"]
    argv = small + ["--model", "vit", "--variants", "vanilla", "augment", "reg", "--corruptions", "gaussian_noise",
                    "fog", "speckle_noise", "--severities", "1", "5", "--n-corrupt", "20", "--n-sharp", "10",
                    "--sharp-reps", "1", "--run-name", "t"]
    R.main(R.parse_args(argv))
    data = json.loads((tmp_path / "robustness" / "t" / "metrics.json").read_text())
    assert set(data["runs"]) == {"vit-vanilla/seed0", "vit-augment/seed0", "vit-reg/seed0"}
    final = data["runs"]["vit-reg/seed0"]["final"]
    assert set(final["corruption_acc"]) == {"gaussian_noise", "fog", "speckle_noise"}
    assert set(final["corruption_acc"]["fog"]) == {"1", "5"}
    for key in ["sens", "sens_stderr", "train_acc", "test_acc", "clean_acc", "mean_corruption_acc", "mean_extra_acc",
                "shop", "shpred"]:
        assert isinstance(final[key], float), key
    standard = [a for c in ["gaussian_noise", "fog"] for a in final["corruption_acc"][c].values()]
    assert final["mean_corruption_acc"] == np.mean(standard)  # the 15 standard ones only, not speckle_noise
    assert final["mean_extra_acc"] == np.mean(list(final["corruption_acc"]["speckle_noise"].values()))
    assert (tmp_path / "robustness" / "t" / "corruptions.png").exists()
    # a vision.py run saved with --save-model, evaluated without training
    trained = vision.main(vision.parse_args(small + ["--model", "mlp", "--run-name", "v", "--save-model"]))
    argv = ["--from-vision", str(tmp_path / "vision" / "v"), "--corruptions", "contrast", "--severities", "2",
            "--n-corrupt", "10", "--n-sharp", "10", "--sharp-reps", "1", "--out-dir", str(tmp_path)]
    data = R.main(R.parse_args(argv))
    assert (tmp_path / "robustness" / "from-vision" / "metrics.json").exists()  # its default name
    assert set(data["runs"]) == {"mlp-vanilla/seed0"} and "shop" in data["runs"]["mlp-vanilla/seed0"]["final"]
    # the saved weights, not a fresh model: the same losses as the vision run's end
    saved, loaded = trained["runs"]["mlp/seed0"]["final"], data["runs"]["mlp-vanilla/seed0"]["final"]
    assert (loaded["train_loss"], loaded["test_loss"]) == (saved["train_loss"], saved["test_loss"])
    # resumed when finished (reproduce.sh reruns every command): nothing is evaluated again
    monkeypatch.setattr(R, "evaluate_model", lambda *a: pytest.fail("a finished run evaluated again"))
    again = R.main(R.parse_args(["--resume", str(tmp_path / "robustness" / "from-vision")]))
    assert again["runs"]["mlp-vanilla/seed0"]["final"]["shop"] == loaded["shop"]


def test_from_vision_takes_the_runs_flags_and_lets_the_command_line_win(tmp_path, monkeypatch):
    """--from-vision reads the vision run's model and data flags as if typed before the command line's: an on/off flag
    that was on stays on, a flag given here replaces the saved one, and the saved run's own flags (--run-name,
    --out-dir, --no-figures) are not taken. The same from a shell (argv None: sys.argv without the script's name)."""
    saved = vision.parse_args(["--dataset", "fake28", "--model", "vit", "--depth", "3", "--no-patch-norm",
                               "--save-model", "--run-name", "v", "--out-dir", "elsewhere", "--no-figures"])
    write_json(str(tmp_path / "v" / "metrics.json"), {"script": "vision", "args": vars(saved), "runs": {}})
    args = R.parse_args(["--from-vision", str(tmp_path / "v"), "--depth", "2"])
    assert args.no_patch_norm and args.dataset == "fake28" and args.model == ["vit"]  # taken from the run
    assert args.depth == 2  # the command line's
    assert args.run_name is None and args.out_dir == "out" and not args.no_figures  # the run's own stay this run's
    monkeypatch.setattr(sys, "argv", ["robustness.py", "--from-vision", str(tmp_path / "v"), "--depth", "2"])
    assert vars(R.parse_args()) == vars(args)


def test_a_runs_seconds_cover_its_corruptions_and_sharpness(tmp_path, monkeypatch, capsys):
    """The final measurements come after vision.train has ended the run's training: their time is still the run's
    (reproduce.sh's CPU minutes read it), not lost; the run's final numbers are printed in one line."""
    real = R.evaluate_model
    monkeypatch.setattr(R, "evaluate_model", lambda *a: time.sleep(0.5) or real(*a))
    argv = ["--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16", "--mlp-dim", "32", "--n-train", "40",
            "--n-sens", "4", "--epochs", "1", "--out-dir", str(tmp_path), "--dataset", "fake28", "--model", "vit",
            "--variants", "vanilla", "--corruptions", "contrast", "--severities", "1", "--n-corrupt", "10",
            "--n-sharp", "10", "--sharp-reps", "1", "--run-name", "t"]
    data = R.main(R.parse_args(argv))
    assert data["runs"]["vit-vanilla/seed0"]["seconds"]["final"] >= 0.5
    out = capsys.readouterr().out
    assert "\nvit-vanilla/seed0 | train acc " in out and " | mean corruption acc " in out and " | ShPred " in out


@pytest.mark.slow
def test_training_honours_vision_flags(tmp_path, monkeypatch):
    """robustness.py trains through vision.train, so vision's flags (here --optimizer adam) take effect."""
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


class Constant(torch.nn.Module):
    """A user's model of [0, 1] images that always answers class k (and checks its inputs are in [0, 1])."""

    def __init__(self, k):
        super().__init__()
        self.k = k
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        assert x.min() >= 0 and x.max() <= 1
        return torch.nn.functional.one_hot(torch.full((len(x),), self.k), 10).float() + self.w


def test_evaluate_corruptions_on_a_users_model_gives_the_known_accuracy():
    """A model that always says 3 is right exactly on the images labelled 3, clean or corrupted: every accuracy
    equals that share; the standard mean is over the standard corruptions asked for, the extra mean over the rest."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (50, 3, 32, 32), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (50,), generator=g)
    out = R.evaluate_corruptions(Constant(3), images, labels, corruptions=["contrast", "gaussian_noise", "saturate"],
                                 severities=[1, 4])
    share = (labels == 3).sum().item() / len(labels)
    assert out["clean_acc"] == share
    assert all(a == share for per in out["corruption_acc"].values() for a in per.values())
    assert set(out["corruption_acc"]) == {"contrast", "gaussian_noise", "saturate"}
    assert out["mean_corruption_acc"] == share and out["mean_extra_acc"] == share and out["standard_measured"] == 2
    only_extra = R.evaluate_corruptions(Constant(3), images, labels, corruptions=["saturate"], severities=[2])
    assert only_extra["mean_corruption_acc"] is None and only_extra["standard_measured"] == 0


class BrighterHalf(torch.nn.Module):
    """Class 0 when the image's left half is the brighter, else 1: contrast keeps which half that is."""

    def forward(self, x):
        return torch.stack([x[..., :16].mean((1, 2, 3)), x[..., 16:].mean((1, 2, 3))], 1)


def test_evaluate_corruptions_pairs_each_image_with_its_label_beyond_the_first_2000():
    """More images than one chunk of 2,000 are corrupted chunk by chunk, each once and in order: a model right on every
    clean image is right on every corrupted one (labels alternate, so a shift by one image would get them all wrong)."""
    labels = torch.arange(2100) % 2
    images = torch.full((2100, 3, 32, 32), 50, dtype=torch.uint8)
    images[labels == 0, :, :, :16] = 200  # label 0: the left half the brighter
    images[labels == 1, :, :, 16:] = 200
    out = R.evaluate_corruptions(BrighterHalf(), images, labels, corruptions=["contrast"], severities=[5])
    assert out["clean_acc"] == 1.0 and out["corruption_acc"]["contrast"]["5"] == 1.0


class Pixel(torch.nn.Module):
    """Class 1 iff the first pixel is exactly 1.0 (a uint8 255 read as x / 255), else 0."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        v = (x[:, 0, 0, 0] == 1.0).float()
        return torch.stack([1 - v, v], 1) + self.w


def test_accuracy_reads_every_image_as_x_over_255():
    """A model right on every image when pixels are x / 255 has accuracy exactly 1, over all images, in any batch,
    also when it is handed over in training mode (with a dropout that would otherwise zero its inputs)."""
    images = torch.zeros(1003, 1, 4, 4, dtype=torch.uint8)
    labels = torch.arange(1003) % 2
    images[:, 0, 0, 0] = (labels * 255).to(torch.uint8)
    assert R.accuracy(Pixel(), images, labels) == 1.0
    assert R.accuracy(Pixel(), images, 1 - labels) == 0.0
    dropping = torch.nn.Sequential(torch.nn.Dropout(0.999), Pixel()).train()  # left in training mode: evaluated in
    assert R.accuracy(dropping, images, labels) == 1.0 and not dropping.training  # eval mode, without its dropout


def test_our_models_are_evaluated_on_0_1_images_through_normalize():
    """Normalize((0.5,), (0.5,)) in front of a model trained on vision.normalize's [-1, 1] pixels gives it the same
    inputs: the same predictions on uint8 images."""
    args = vision.parse_args(["--dataset", "fake", "--mlp-hidden", "16"])
    torch.manual_seed(0)
    model = vision.build_model("mlp", args, 3, 32, 10).eval()  # (not a ViT: its patch LayerNorm ignores the scale)
    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    wrapped = torch.nn.Sequential(R.Normalize([0.5] * 3, [0.5] * 3), model)
    assert torch.allclose(wrapped(x.float() / 255), model(vision.normalize(x)), atol=1e-5)
    from_numpy = R.Normalize(np.full(3, 0.5), np.full(3, 0.5))  # float64 statistics: the model still gets float32
    assert from_numpy(x.float() / 255).dtype == torch.float32 and torch.equal(from_numpy(x / 255), wrapped[0](x / 255))


@pytest.mark.slow
def test_a_fake_release_and_the_paper_fig9_models_end_to_end(tmp_path, monkeypatch):
    """--paper-fig9 trains the six models of Fig. 9 and reads all 19 corruptions from a fake release; metrics hold
    the accuracy per corruption and severity, both means, and the sensitivity-robustness correlation. (ResNet-18 and
    DenseNet-121 are replaced by small MLPs here to keep the test fast; test_vision checks their shapes.)"""
    real = vision.build_model
    monkeypatch.setattr(vision, "build_model", lambda name, *a: real("mlp" if name in ("resnet18", "densenet121")
                                                                      else name, *a))
    release = tmp_path / "CIFAR-10-C"
    release.mkdir()
    np.save(release / "labels.npy", np.arange(10, dtype=np.uint8) % 10)
    for name in C.STANDARD + C.EXTRA:
        np.save(release / f"{name}.npy", np.random.default_rng(0).integers(0, 256, (10, 32, 32, 3), dtype=np.uint8))
    argv = ["--paper-fig9", "--dataset", "fake", "--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16",
            "--mlp-dim", "16", "--mlp-hidden", "16", "--n-train", "20", "--n-test", "10", "--n-sens", "2",
            "--sens-positions", "2", "--epochs", "1", "--cifar10c-dir", str(release), "--severities", "1", "5",
            "--n-sharp", "4", "--sharp-reps", "1", "--seeds", "0", "--out-dir", str(tmp_path)]
    data = R.main(R.parse_args(argv))  # named fig9 by default
    assert set(data["runs"]) == {f"{m}-{v}/seed0" for m, v in R.FIG9}
    final = data["runs"]["vit-reg/seed0"]["final"]
    assert set(final["corruption_acc"]) == set(C.STANDARD + C.EXTRA) and set(final["corruption_acc"]["snow"]) == {"1",
                                                                                                                "5"}
    assert isinstance(final["mean_corruption_acc"], float) and isinstance(final["mean_extra_acc"], float)
    assert data["summary"]["correlation_sens_vs_corruption_acc"]["points"] == 6
    for png in ["corruptions.png", "sensitivity_vs_robustness.png"]:
        assert (tmp_path / "robustness" / "fig9" / png).stat().st_size > 5000


def test_regulariser_loss_is_its_formula_and_changes_the_gradient():
    """reg = (1 - p) CE(f(x), y) + p MSE(f(x + noise on one patch), f(x)) with the very noise random_patch_noise
    draws; p = 0 is plain cross-entropy; with p > 0 the gradient is not (1 - p) times the cross-entropy's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    args = R.parse_args(["--dataset", "fake28", "--reg", "0.3", "--reg-std", "2.0", "--sens-patch", "7"])
    loss = R.make_loss("reg", args, torch.Generator().manual_seed(5))(model, x, y)
    noisy = R.random_patch_noise(x, 7, 2.0, torch.Generator().manual_seed(5))
    out = model(x)
    expected = 0.7 * F.cross_entropy(out, y) + 0.3 * F.mse_loss(model(noisy), out)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    ce = F.cross_entropy(out, y)
    grad = lambda value: torch.autograd.grad(value, model[1].weight)[0]  # noqa: E731
    assert not torch.allclose(grad(R.make_loss("reg", args, torch.Generator().manual_seed(5))(model, x, y)),
                              grad(0.7 * ce), atol=1e-6)
    args.reg = 0.0
    assert R.make_loss("reg", args, torch.Generator())(model, x, y).item() == pytest.approx(ce.item(), rel=1e-6)
    changed = (patchify(noisy, 7) != patchify(x, 7))  # (8, 16 patches, 49 values)
    assert changed.any(-1).sum(-1).tolist() == [1] * 8 and changed.sum().item() == 8 * 49  # one whole patch each


def test_augmentation_adds_noise_of_the_stated_std():
    """augment trains on x + N(0, std^2) on every pixel, the label kept, drawn from the generator it is given."""
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, x):
            seen.append(x)
            return torch.zeros(len(x), 10, requires_grad=True)

    x, y = torch.zeros(50, 1, 28, 28), torch.zeros(50, dtype=torch.long)
    args = R.parse_args(["--dataset", "fake28", "--augment-std", "0.3"])
    R.make_loss("augment", args, torch.Generator().manual_seed(0))(Recorder(), x, y)
    assert seen[0].std().item() == pytest.approx(0.3, rel=0.02) and abs(seen[0].mean().item()) < 0.01
    R.make_loss("augment", args, torch.Generator().manual_seed(0))(Recorder(), x, y)
    assert torch.equal(seen[0], seen[1])  # drawn from the generator it is given: reproducible, resumable
    R.make_loss("vanilla", args, torch.Generator())(Recorder(), x, y)
    assert torch.equal(seen[2], x)


def test_sharpness_of_a_linear_model_has_its_closed_form():
    """f(x) = W x + b with N(0, s^2) on every weight changes each of the C logits by N(0, s^2 (|x|^2 + 1)):
    ShOp (an L1 sum over the logits) = C s sqrt(|x|^2 + 1) sqrt(2 / pi). With 2 classes at logit gap d, the gap
    moves by N(0, 2 s^2 (|x|^2 + 1)): ShPred = Phi(-|d| / (s sqrt(2 (|x|^2 + 1))))."""
    D, s = 8, 0.05
    x = torch.full((20, D), 0.5)  # |x|^2 = 2
    model = torch.nn.Linear(D, 10)
    got = R.sharpness(model, x, s, 400, torch.Generator().manual_seed(0))
    assert got["shop"] == pytest.approx(10 * s * math.sqrt(3) * math.sqrt(2 / math.pi), rel=0.05)
    two = torch.nn.Linear(D, 2)
    with torch.no_grad():
        two.weight.zero_()
        two.bias.copy_(torch.tensor([0.0, 0.1]))  # gap d = 0.1 for every input
    got = R.sharpness(two, x, s, 400, torch.Generator().manual_seed(0))
    p = phi(-0.1 / (s * math.sqrt(2 * 3)))
    assert abs(got["shpred"] - p) < 4 * math.sqrt(p * (1 - p) / 400) and got["shpred_stderr"] > 0
    # the standard errors over the draws: the sample std (n - 1) over sqrt(draws), from the very same draws one by one
    g = torch.Generator().manual_seed(3)
    draws = [R.sharpness(model, x, s, 1, g) for _ in range(5)]
    five = R.sharpness(model, x, s, 5, torch.Generator().manual_seed(3))
    for key in ["shop", "shpred"]:
        values = np.array([d[key] for d in draws])
        assert five[key] == pytest.approx(values.mean(), rel=1e-6)
        assert five[f"{key}_stderr"] == pytest.approx(values.std(ddof=1) / math.sqrt(5), rel=1e-6)
    # the images in chunks of batch_size (23 in chunks of 5, the last of 3): the numbers of one chunk
    x = torch.randn(23, D, generator=torch.Generator().manual_seed(4))
    whole = R.sharpness(model, x, s, 3, torch.Generator().manual_seed(5))
    assert R.sharpness(model, x, s, 3, torch.Generator().manual_seed(5), batch_size=5) == pytest.approx(whole, rel=1e-5)


def test_severity_k_uses_the_kth_constant(monkeypatch):
    """corrupt(x, name, k) hands the corruption SEVERITY[name][k - 1]."""
    seen = []
    monkeypatch.setitem(C.CORRUPTIONS, "contrast", lambda x, c, g: seen.append(c) or x)
    x = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    for k in range(1, 6):
        C.corrupt(x, "contrast", k, None)
    assert seen == C.SEVERITY["contrast"] == [0.75, 0.5, 0.4, 0.3, 0.15]


def test_the_readme_example_evaluates_a_torchvision_model(tmp_path):
    """The README's example, offline: torchvision's ResNet-18 behind a Normalize module, on uint8 CIFAR-sized images,
    against a (fake) release: every key the example reads is there."""
    import torchvision

    release = tmp_path / "CIFAR-10-C"
    release.mkdir()
    np.save(release / "labels.npy", np.arange(25, dtype=np.uint8) % 5)  # 5 severities x 5 images
    for name in ["snow", "fog"]:
        np.save(release / f"{name}.npy", np.random.default_rng(0).integers(0, 256, (25, 32, 32, 3), dtype=np.uint8))
    net = torchvision.models.resnet18(num_classes=10)
    model = torch.nn.Sequential(R.Normalize([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]), net).eval()
    images, labels = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8), torch.arange(5)
    acc = R.evaluate_corruptions(model, images, labels, cifar10c_dir=str(release), corruptions=["snow", "fog"])
    assert 0 <= acc["clean_acc"] <= 1 and 0 <= acc["mean_corruption_acc"] <= 1
    assert set(acc["corruption_acc"]["snow"]) == {"1", "2", "3", "4", "5"} and acc["mean_extra_acc"] is None


class NoParameters(torch.nn.Module):
    """Always class 0; no parameters."""

    def forward(self, x):
        return torch.stack([torch.ones(len(x)), torch.zeros(len(x))], 1)


def test_evaluate_corruptions_by_default_makes_every_corruption_it_can_and_says_which_it_skipped():
    """Without frost_dir, the default generates the 18 corruptions other than frost and says frost was skipped and
    why; the standard mean is then over 14."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 32, 32), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (4,), generator=g)
    out = R.evaluate_corruptions(Constant(3), images, labels, severities=[1])
    assert set(out["corruption_acc"]) == set(R.STANDARD + R.EXTRA) - {"frost"} and out["standard_measured"] == 14
    assert list(out["skipped"]) == ["frost"] and "frost_dir=" in out["skipped"]["frost"]


def test_evaluate_corruptions_reads_float_images_and_refuses_what_it_cannot_use(monkeypatch):
    """[0, 1] float images (a torchvision ToTensor batch) give the same accuracies as their uint8 bytes, and floats a
    hair below a byte are read as that byte; one image alone is corrupted too; a model with no parameters runs; bad
    names, severities, sizes, labels, normalisations and NaN outputs are refused with a message naming what is
    wrong, and bad arguments before the model runs."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 3, 32, 32), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 2, (40,), generator=g)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
    kw = dict(corruptions=["contrast", "gaussian_noise"], severities=[1, 5])
    a = R.evaluate_corruptions(net, images, labels, **kw)
    b = R.evaluate_corruptions(net, images.float() / 255, labels, **kw)
    assert a == b and a["clean_acc"] is not None
    clean = []  # floats a hair off their byte (another pipeline's rounding) are read as that byte, not the one below
    monkeypatch.setattr(R, "accuracy", lambda m, x, y: clean.append(x) or 0.0)
    R.evaluate_corruptions(net, (images.float() / 255 - 1e-4).clamp(0, 1), labels, **kw)
    assert torch.equal(clean[0], images)
    monkeypatch.undo()
    one = R.evaluate_corruptions(net, images, labels, n=1, **kw)  # a last chunk of one image is still corrupted
    assert one["corruption_acc"]["contrast"]["5"] in (0.0, 1.0)
    c = R.evaluate_corruptions(NoParameters(), images, labels, **kw)
    assert c["clean_acc"] == pytest.approx((labels == 0).sum().item() / 40)
    bad = [(dict(corruptions="gaussian_noise"), TypeError, "corruptions must be a list of names"),
           (dict(corruptions=["rain"]), ValueError, "unknown corruption 'rain'"),
           (dict(corruptions=["contrast", "rain"]), ValueError, "unknown corruption 'rain'"),
           (dict(severities=[0]), ValueError, "severity must be one of 1, 2, 3, 4, 5, got 0"),
           (dict(severities=[1, 6]), ValueError, "got 6"),
           (dict(severities=[-1]), ValueError, "got -1"), (dict(severities=[6]), ValueError, "got 6"),
           (dict(n=-1), ValueError, "n must be None (all) or a number of images >= 1, got -1"),
           (dict(n=0), ValueError, "n must be None (all) or a number of images >= 1, got 0"),
           (dict(labels=labels[:30]), ValueError, "40 images, 30 labels"),
           (dict(images=images.float()), ValueError, "float images must lie in [0, 1]"),
           (dict(corruptions=["frost"]), FileNotFoundError, "in frost_dir= (--frost-dir); no folder was given; or "
            "leave 'frost' out of corruptions= (the default leaves it out without frost_dir=)")]
    calls = []  # each is refused before any work: the model never runs
    counted = net.register_forward_hook(lambda *_: calls.append(1))
    for extra, error, message in bad:
        args = {"images": images, "labels": labels, **kw, **extra}
        with pytest.raises(error) as e:
            R.evaluate_corruptions(net, args.pop("images"), args.pop("labels"), **args)
        assert message in str(e.value), (extra, str(e.value))
        assert not calls, extra
    counted.remove()
    with pytest.raises(ValueError, match="needs the clean images to corrupt, or cifar10c_dir"):
        R.evaluate_corruptions(net, **kw)
    nan = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
    torch.nn.init.constant_(nan[1].bias, float("nan"))
    with pytest.raises(ValueError, match="non-finite outputs"):
        R.evaluate_corruptions(nan, images, labels, **kw)
    for mean, std in [([0.5], [0.0]), ([0.5], [-1.0]), ([0.5, 0.5], [0.5])]:
        with pytest.raises(ValueError, match="a finite std > 0 per channel"):
            R.Normalize(mean, std)
    with pytest.raises(ValueError, match="Normalize has 3 channels, the images 1"):
        R.Normalize([0.5] * 3, [0.5] * 3)(torch.rand(2, 1, 8, 8))


def test_corrupt_and_read_release_refuse_severities_that_are_not_1_to_5(tmp_path):
    """Severity 0 or -1 would index the table from its end (severity 5 or 4) and 6 past it: each is refused; so
    are n = 0 and float images for corrupt()."""
    x = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    for s in [0, -1, 6, 2.0]:
        with pytest.raises(ValueError, match="severity must be one of 1, 2, 3, 4, 5"):
            C.corrupt(x, "contrast", s, torch.Generator())
        with pytest.raises(ValueError, match="severity must be one of"):
            C.read_release(str(tmp_path), "contrast", s)
    with pytest.raises(ValueError, match="n must be None"):
        C.read_release(str(tmp_path), "contrast", 1, n=0)
    with pytest.raises(ValueError, match="must be a uint8"):
        C.corrupt(x.float() / 255, "contrast", 1, torch.Generator())


def test_evaluate_model_passes_the_flags_to_each_measurement(monkeypatch):
    """The final sensitivity is the first --sigma's patch mask on the first --n-sens training images with --reps,
    --sens-positions and --sens-seed; the corruptions get --n-corrupt, --corruptions, --severities, the release or
    frost folders and the run's seed, and see the model through Normalize(0.5, 0.5) on [0, 1] images; the sharpness
    is measured on the first --n-sharp training images with --sharp-std and --sharp-reps, drawing from a generator
    seeded with the run's seed."""
    args = R.parse_args(["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--n-train", "40",
                         "--n-test", "20", "--n-sens", "4", "--sigma", "2", "3", "--reps", "2", "--sens-positions", "3",
                         "--sens-seed", "5", "--n-corrupt", "10", "--corruptions", "contrast", "--severities", "2",
                         "--sens-patch", "7", "--sharp-std", "0.3", "--sharp-reps", "2", "--n-sharp", "6"])
    args.frost_dir = "textures"  # only handed on: evaluate_corruptions is a spy here
    data = vision.prepare_data(args, torch.device("cpu"))
    torch.manual_seed(0)
    model = vision.build_model("mlp", args, 1, 28, 10).eval()
    seen = {}
    real_sharpness = R.sharpness

    def corrupt(m, x, y, **kw):
        seen["corrupt"] = m, kw
        return {}

    def sharpness(m, x, std, reps, gen):
        seen["gen"], seen["sharp"] = gen.initial_seed(), (x, std, reps)
        return real_sharpness(m, x, std, reps, gen)

    real_sens = vision.measure_sensitivity

    def measure(m, images, **kw):
        seen["sens"], seen["sens_images"] = kw, images
        return real_sens(m, images, **kw)

    monkeypatch.setattr(vision, "measure_sensitivity", measure)
    monkeypatch.setattr(R, "evaluate_corruptions", corrupt)
    monkeypatch.setattr(R, "sharpness", sharpness)
    R.evaluate_model(model, args, data, seed=7)
    assert seen["sens"] == dict(patch=7, sigmas=[2.0], masks=["patch"], seed=5, reps=2, positions=3)
    assert torch.equal(seen["sens_images"], vision.normalize(data["train_x"][:4]))  # the first --n-sens of 40
    on_01, kw = seen["corrupt"]
    assert kw == dict(corruptions=["contrast"], severities=[2], cifar10c_dir=None, n=10, frost_dir="textures", seed=7)
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    assert torch.allclose(on_01(x.float() / 255), model(vision.normalize(x)), atol=1e-5)
    assert seen["gen"] == 7
    x, std, reps = seen["sharp"]  # on the first --n-sharp training images, with --sharp-std and --sharp-reps
    assert torch.equal(x, vision.normalize(data["train_x"][:6])) and std == 0.3 and reps == 2


def small_run(out_dir, *more):
    """robustness.py's flags for a one-epoch MLP on 40 fake 28x28 images, severity 1, into out_dir, then `more`."""
    return ["--dataset", "fake28", "--model", "mlp", "--mlp-hidden", "16", "--n-train", "40", "--n-test", "20",
            "--n-sens", "4", "--epochs", "1", "--severities", "1", "--n-sharp", "10", "--sharp-reps", "1", "--out-dir",
            str(out_dir), *more]


def test_main_seeds_the_variants_noise_saves_the_summary_and_checks_n_corrupt(tmp_path, monkeypatch):
    """On one process the noise of augment and reg comes from a generator seeded with the run's seed, and the
    variant's loss is the one trained; the summary is in metrics.json on disk; --n-corrupt beyond the test set is an
    error naming the flag."""
    small = small_run(tmp_path, "--corruptions", "contrast")
    made, used = [], []
    real = R.make_loss

    def make_loss(variant, args, gen):
        made.append((variant, gen.initial_seed()))
        loss = real(variant, args, gen)
        return lambda *a: used.append(variant) or loss(*a)

    monkeypatch.setattr(R, "make_loss", make_loss)
    argv = small + ["--variants", "augment", "--seeds", "3", "--n-corrupt", "10", "--run-name", "m"]
    data = R.main(R.parse_args(argv))
    assert made == [("augment", 3)] and used and set(used) == {"augment"}
    on_disk = json.loads((tmp_path / "robustness" / "m" / "metrics.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(data["summary"])) and on_disk["summary"]
    with pytest.raises(ValueError, match="--n-corrupt 30 asks for more than the 20 test images"):
        R.main(R.parse_args(small + ["--n-corrupt", "30", "--run-name", "n"]))


def test_another_ranks_noise_and_the_note_on_a_mean_without_frost(tmp_path, monkeypatch, capsys):
    """Under torchrun rank r draws the noise of augment and reg from seed + 1,000,003 r (each rank's slice of the
    batch its own noise); with 14 of the 15 standard corruptions (frost left out without its textures) a note says
    what the mean is over. --paper-fig9 records the models and variants it trains in the run's flags."""
    made = []
    real = R.make_loss
    monkeypatch.setattr(R, "make_loss", lambda variant, args, gen: made.append(gen.initial_seed()) or
                        real(variant, args, gen))
    monkeypatch.setattr(R, "ranks", lambda: (1, 2))  # robustness.py reads its rank for this seed alone
    R.main(R.parse_args(small_run(tmp_path, "--variants", "reg", "--seeds", "2", "--n-corrupt", "2")))
    assert made == [2 + 1_000_003]
    assert ("note: mean_corruption_acc is over 14 of the 15 standard corruptions (frost needs --frost-dir)"
            in capsys.readouterr().out)
    args = R.parse_args(["--paper-fig9"])
    assert args.model == ["resnet18", "densenet121", "vit", "vit-simple"]
    assert args.variants == ["vanilla", "augment", "reg"]


def test_the_note_on_the_mean_names_what_is_missing_and_is_not_printed_with_all_15(tmp_path, monkeypatch, capsys):
    """With --frost-dir all 15 standard corruptions are measured, and no note is printed; with a chosen few that
    include frost the note gives their number without blaming frost's textures. (Stopped before training.)"""
    frost = write_frost_textures(tmp_path)

    def stop(*a):  # the first training job: the note has been printed by then
        raise InterruptedError

    monkeypatch.setattr(R, "make_loss", stop)
    for more, note in [([], ""), (["--corruptions", "frost", "fog", "snow"], "note: mean_corruption_acc is over 3 "
                                  "of the 15 standard corruptions\n")]:
        with pytest.raises(InterruptedError):
            R.main(R.parse_args(small_run(tmp_path, "--frost-dir", frost, *more)))
        out = capsys.readouterr().out
        assert "".join(line + "\n" for line in out.splitlines() if line.startswith("note:")) == note, out


def test_a_run_stopped_while_it_is_measured_is_measured_on_resume(tmp_path, monkeypatch):
    """Ctrl-C while a trained model's corruptions are measured: its final record holds training's numbers alone, and
    --resume measures it (corruption accuracy and sharpness) instead of counting it finished."""
    def stop(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "evaluate_corruptions", stop)
    with pytest.raises(KeyboardInterrupt):
        R.main(R.parse_args(small_run(tmp_path, "--corruptions", "contrast", "--run-name", "c")))
    monkeypatch.undo()
    folder = tmp_path / "robustness" / "c"
    partial = json.loads((folder / "metrics.json").read_text())["runs"]["mlp-vanilla/seed0"]["final"]
    assert "train_acc" in partial and "corruption_acc" not in partial
    final = R.main(R.parse_args(["--resume", str(folder)]))["runs"]["mlp-vanilla/seed0"]["final"]
    assert "contrast" in final["corruption_acc"] and "shop" in final
