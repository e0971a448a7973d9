"""GPU-only checks, skipped where there is no CUDA device: the estimator on CUDA agrees with the CPU, --amp trains in
bf16 and still measures in float32, --compile with the default (inductor) backend runs, bench.py times the levers of
the paper-size ViT and measures the estimator's memory in MB, a run stopped on the GPU resumes there, and the
CIFAR-10-C corruptions on the GPU equal the release as on the CPU; summarise gives the CPU's numbers from counts on
the GPU."""

import math

import pytest
import torch

import bench
import corruptions
import robustness
import vision
from common import gaussian, patchify, sensitivity, summarise, unpatchify
from test_corruptions import DETERMINISTIC, REPLAYED, check_against_the_release, smooth_images, write_frost_textures
from test_scale import RUNS, whole_and_resumed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SMALL = ["--dataset", "fake28", "--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16", "--mlp-dim", "16",
         "--mlp-hidden", "16", "--epochs", "1", "--n-train", "200", "--n-test", "50", "--n-sens", "50"]


def test_estimator_on_cuda_agrees_with_the_cpu():
    """The same model and images: the sensitivity on CUDA is the CPU's within their standard errors (the noise
    streams differ between devices). The model is ViT-simple at a width where its untrained predictions vary (about
    0.10 at sigma 2): the untrained SPT ViT gives every image one class, sensitivity 0 on both devices, which proves
    nothing (this test failed so on its first GPU run, an H200)."""
    torch.manual_seed(0)
    wide = vision.parse_args(SMALL + ["--dim", "64", "--mlp-dim", "64", "--heads", "4", "--dim-head", "16"])
    model = vision.build_model("vit-simple", wide, 1, 28, 10).eval()
    images = torch.randn(300, 1, 28, 28)
    out = {}
    for device in ["cpu", "cuda"]:
        m, x = model.to(device), patchify(images.to(device), 7)
        f = lambda xb, idx, m=m: m(unpatchify(xb, 7, (1, 28, 28)))  # noqa: E731
        out[device] = sensitivity(f, x, gaussian(2.0), reps=4, seed=0)
    assert out["cpu"].mean > 0.05  # a model whose predictions move, or the comparison below is empty
    assert abs(out["cpu"].mean - out["cuda"].mean) < 4 * math.hypot(out["cpu"].stderr, out["cuda"].stderr)


def test_amp_trains_in_bf16_and_measures_in_float32(tmp_path, monkeypatch):
    """--amp runs the training forward under bf16 autocast, and the evaluation and the sensitivity outside it."""
    autocast = []
    real = torch.autocast

    def spy(device_type, dtype=None, enabled=True, **kw):
        autocast.append(enabled)
        return real(device_type, dtype=dtype, enabled=enabled, **kw)

    monkeypatch.setattr(torch, "autocast", spy)
    seen = []
    real_sens = vision.measure_sensitivity
    monkeypatch.setattr(vision, "measure_sensitivity", lambda *a, **k: seen.append(torch.is_autocast_enabled())
                        or real_sens(*a, **k))
    data = vision.main(vision.parse_args(SMALL + ["--model", "mlp", "--amp", "--device", "cuda",
                                                  "--out-dir", str(tmp_path)]))
    assert any(autocast) and seen and not any(seen)
    assert 0 <= data["runs"]["mlp/seed0"]["final"]["sens"] <= 1


def test_compile_with_the_default_backend(tmp_path):
    """--compile with inductor (code generation on the GPU) trains and measures."""
    data = vision.main(vision.parse_args(SMALL + ["--model", "mlp", "--compile", "--device", "cuda",
                                                  "--out-dir", str(tmp_path)]))
    assert 0 <= data["runs"]["mlp/seed0"]["final"]["train_acc"] <= 1


def test_bench_times_the_paper_vit_levers():
    """bench.py's paper_vit group on CUDA: the eager step and every lever (--compile, --amp, both, TF32) timed, and
    TF32 switched back off afterwards (torch's default)."""
    out = bench.bench_paper_vit(100, 1, torch.device("cuda"))
    assert sorted(out) == sorted(["paper_vit_step_ms"] + [f"paper_vit_{k}_speedup" for k in
                                                          ["compile", "amp", "amp_compile", "tf32"]])
    assert all(math.isfinite(v) and v > 0 for v in out.values())
    assert not torch.backends.cuda.matmul.allow_tf32


def test_bench_memory_on_cuda_is_one_chunk_in_megabytes():
    """bench.py's est_1e6_mem_mb on CUDA: the allocator's peak growth in MB, about one chunk of 8,192 copies of 16 x 8
    floats (4 MB), not all 10^6 copies at once (512 MB) nor a count in other units."""
    mb = bench.bench_memory(torch.device("cuda"))["est_1e6_mem_mb"]
    assert 2 <= mb < 128, mb


@pytest.mark.parametrize("script", list(RUNS))
def test_a_run_stopped_on_the_gpu_resumes_there(script, tmp_path, monkeypatch, capsys):
    """Every training script on the GPU, stopped by Ctrl-C, then --resume: the checkpoint is loaded onto the GPU with
    its random states, which torch takes from the CPU alone (the first resume on a GPU, of vision3k on an H200, failed
    so: "RNG state must be a torch.ByteTensor"). The resumed run ends where an uninterrupted one does, up to the GPU's
    nondeterministic sums (on a CPU, test_scale.py checks that they are equal)."""
    whole, resumed, _ = whole_and_resumed(script, tmp_path, monkeypatch, capsys, device=["--device", "cuda"])
    assert resumed["runs"].keys() == whole["runs"].keys()
    for run, r in whole["runs"].items():
        assert resumed["runs"][run]["final"]["train_acc"] == pytest.approx(r["final"]["train_acc"], abs=0.05)


@pytest.mark.parametrize("name", list(DETERMINISTIC) + list(REPLAYED))
def test_corruptions_on_the_gpu_equal_the_release(name):
    """robustness.py corrupts the test images on the run's device: on CUDA (its convolutions, TF32 where torch allows
    it) every corruption that tests/test_corruptions.py checks against make_cifar_c.py's output is within the same
    tolerance of it as on the CPU."""
    check_against_the_release(name, "cuda")


def test_every_corruption_runs_on_the_gpu(tmp_path):
    """The rest (noise drawn by the GPU's generator, frost's textures): uint8 images of the same shape, on the GPU."""
    frost_dir, x = write_frost_textures(tmp_path), smooth_images(6, 3, 32).cuda()
    for name in corruptions.SEVERITY:
        for s in range(1, 6):
            y = corruptions.corrupt(x, name, s, torch.Generator("cuda").manual_seed(s), frost_dir)
            assert y.shape == x.shape and y.dtype == torch.uint8 and y.device == x.device, (name, s)


def test_corruption_accuracy_of_a_normalized_model_on_the_gpu():
    """evaluate_corruptions takes any model of [0, 1] images, such as Normalize put in front of a model on the GPU after
    the model was moved there (robustness.py does so: its runs failed on the GPU at their final measurements, the
    wrapper's mean and std left on the CPU)."""
    model = vision.build_model("mlp", vision.parse_args(SMALL), 1, 28, 10).cuda()
    wrapped = torch.nn.Sequential(robustness.Normalize([0.5], [0.5]), model)
    images, labels = smooth_images(20, 1, 28), torch.randint(10, (20,))
    out = robustness.evaluate_corruptions(wrapped, images, labels, corruptions=["contrast"], severities=(1,))
    assert 0 <= out["clean_acc"] <= 1 and 0 <= out["corruption_acc"]["contrast"]["1"] <= 1


def test_summarise_gives_the_cpu_numbers_from_counts_on_the_gpu():
    """summarise reduces the counts on their device and copies only the rates: bit for bit the numbers of the same
    counts on the CPU, a profile on the CPU, and NaN where a position was never valid."""
    g = torch.Generator().manual_seed(0)
    trials = torch.randint(1, 5, (500, 49), generator=g)
    trials[:, -3:] = 0  # three positions no input has
    flips = torch.minimum(torch.randint(0, 5, (500, 49), generator=g), trials)
    cpu, gpu = summarise(flips, trials, 7), summarise(flips.cuda(), trials.cuda(), 7)
    assert (gpu.mean, gpu.stderr, gpu.evaluations) == (cpu.mean, cpu.stderr, 7) and 0 < cpu.mean < 1
    for a, b in [(gpu.per_input, cpu.per_input), (gpu.per_position, cpu.per_position)]:
        assert a.device.type == "cpu"
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert gpu.per_position[-3:].isnan().all() and not gpu.per_position[:-3].isnan().any()
