"""Every script's front door, run as a user runs it (through runs.cli): bad input is one line on stderr and exit
code 2, a diverged run exit code 3 with its metrics.json kept and marked, Ctrl-C exit code 130 with the metrics so far,
corrupt data files named with their problem, and one vocabulary of flags. And what the docs tell a user: every command
the README, RESULTS.md and the docstrings show parses today, the README's file list, test count and links hold."""

import argparse
import hashlib
import importlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import threading
import time

import pytest
import torch

from conftest import stop_at_backward
import bench
import grokking
import imagenet
import language
import parity
import report
import robustness
import synthetic
import vision
from runs import RUN_FLAGS, ArgumentParser, add_run_flags, cli, corrupt_file, torchvision_dataset, write_json

SCRIPTS = {"synthetic": synthetic, "vision": vision, "language": language, "robustness": robustness,
           "grokking": grokking, "parity": parity, "bench": bench, "imagenet": imagenet, "report": report}
VIT = ["--depth", "1", "--heads", "2", "--dim-head", "8", "--dim", "16", "--mlp-dim", "16", "--mlp-hidden", "16"]
PAIRS = [("the cat sat on the mat", "a cat sat on a mat", 1), ("stocks fell today", "it was sunny", 0),
         ("he said it works", "it works he said", 1), ("nothing matches here", "something else", 0)]


def write_mrpc(folder, pairs=PAIRS * 4):
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in [("train.tsv", pairs), ("dev.tsv", pairs[:8]), ("msr_paraphrase_train.txt", pairs),
                       ("msr_paraphrase_test.txt", pairs[:8])]:
        lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [f"{y}\t{i}\t{i + 1}\t{a}\t{b}"
                                                                   for i, (a, b, y) in enumerate(rows)]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def run(script, argv, capsys):
    """(exit code, stderr) of `python <script>.py argv`; asserts that stderr holds no traceback."""
    module = SCRIPTS[script]
    with pytest.raises(SystemExit) as e:
        cli(module.main, module.parse_args, argv)
        raise SystemExit(0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return e.value.code, err


# -----------------------------------------------------------------------------
# bad input: one line naming the flag or the file, exit code 2

BAD = [
    ("vision", ["--model", "vgg"], "unknown model 'vgg'"),
    ("vision", ["--lr", "cnn=0.05", "vgg=0.1"], "unknown model 'vgg' in vgg=0.1"),  # a rate for a model, by its name
    ("vision", ["--sigma", "nan"], "--sigma must be a finite number >= 0"),
    ("vision", ["--sigma", "inf"], "--sigma must be a finite number >= 0"),
    ("vision", ["--sigma", "-0.1"], "--sigma"),
    ("vision", ["--seeds", "-1"], "--seeds must be a seed in [0, 2^63)"),
    ("vision", ["--sens-seed", str(2**64)], "--sens-seed must be a seed in [0, 2^63)"),  # not silently seed 0
    ("vision", ["--run-name", "../x"], "--run-name must be a plain folder name"),
    ("vision", ["--run-name", "/tmp/x"], "--run-name must be a plain folder name"),
    ("vision", ["--run-name", ".."], "--run-name must be a plain folder name"),
    ("vision", ["--dataset", "fake28", "--augment", "--epochs", "1", "--n-train", "20", "--n-sens", "4"],  # fails fast
     "--augment (crops padded by 4, flips) is for the 32x32 datasets"),
    ("grokking", ["--threads", "100000"], "--threads 100000 is more than 4x the"),
    ("robustness", ["--paper-fig9", "--model", "mlp"], "--paper-fig9 trains the six models of Fig. 9: drop --model"),
    ("robustness", ["--from-vision", "x", "--variants", "reg"], "--from-vision evaluates the models vision.py saved"),
    ("robustness", ["--from-vision", "x", "--paper-fig9"], "as they were trained and measured: drop --paper-fig9"),
    ("robustness", ["--from-vision", "x", "--epochs", "5"], "as they were trained and measured: drop --epochs"),
    ("robustness", ["--from-vision", "x", "--sweep", "--lr=0.1"], "measured: drop --lr and --sweep"),
    ("robustness", ["--mask", "scattered", "patch", "--dataset", "fake28", "--model", "mlp", "--steps", "1",
                    "--n-train", "20", "--n-test", "10", "--n-sens", "4", "--n-sharp", "4", "--sharp-reps", "1",
                    "--corruptions", "contrast"],  # fails fast
     "--mask scattered patch: robustness.py's sensitivity is the patch mask's (Def. 4.1): put patch first"),
    ("robustness", ["--from-vision", "/no/such/run"], "/no/such/run: no results file at /no/such/run"),
    ("robustness", ["--corruptions", "frost", "--frost-dir", "/no/frost"], "; or leave frost out of --corruptions"),
    ("parity", ["--all-settings", "--setting", "3"], "--all-settings runs all six settings: drop --setting"),
    ("synthetic", ["--n-train", "1000000000"], "would take over 4 GB to evaluate"),
    ("synthetic", ["--n-train", "1e9"], "--n-train must be an integer >= 1, got '1e9'"),
    ("vision", ["--n-train", "0"], "--n-train must be an integer >= 1"),
    ("vision", ["--n-train", "-5"], "--n-train must be an integer >= 1"),
    ("vision", ["--n-test", "0"], "--n-test must be an integer >= 1"),
    ("vision", ["--dataset", "fake28", "--n-train", "5000", "--epochs", "1"], "--n-train 5000 asks for more than"),
    ("vision", ["--dataset", "fake28", "--n-test", "500", "--epochs", "1"], "--n-test 500 asks for more than the 200"),
    ("vision", ["--dataset", "fake28", "--n-train", "50", "--n-sens", "60", "--epochs", "1"], "--n-sens 60"),
    ("vision", ["--dataset", "fake28", "--n-train", "50", "--n-sens", "51", "--epochs", "1"], "--n-sens 51"),
    ("vision", ["--device", "cuda:7" if torch.cuda.is_available() else "cuda", "--dataset", "fake28"], "--device"),
    ("vision", ["--device", "tpu"], "--device"),
    ("synthetic", ["--device", "mps"], "--device 'mps' is not a device these scripts run on: use auto, cpu, cuda"),
    ("grokking", ["--device", "meta"], "--device 'meta' is not a device these scripts run on"),  # no values to train
    ("report", ["/no/such/run"], "/no/such/run: no such run folder"),
    # a merge's flags beside one folder, --times or --claims would be taken in silence, nothing merged
    ("report", ["/no/run", "--vary", "model"], "--vary is for merging two or more folders, not for one folder, which"),
    ("report", ["--times", "/a", "/b", "--out-dir", "x", "--run-name", "y"], "--out-dir and --run-name are for "
     "merging two or more folders, not for --times"),
    ("report", ["--claims", "out", "--run-name", "y"], "--run-name is for merging two or more folders, not for "
     "--claims"),
    ("report", ["--claims", "out", "--times"], "--claims and --times are two reports: give one"),
    ("report", ["f", "--claims", "out", "--times"], "--claims and --times are two reports: give one"),
    ("report", [], "give run folders, or --claims OUT"),
    ("report", ["f", "--claims", "out"], "give run folders, or --claims OUT"),
    ("imagenet", ["--imagenet-dir", "/no/such/dir"], "--imagenet-dir /no/such/dir: no such folder"),
    ("imagenet", ["--imagenet-dir", imagenet.__file__], f"--imagenet-dir {imagenet.__file__}: no such folder"),
    ("imagenet", ["--n-sens", "4"], "--imagenet-dir is required: a folder of images, one subfolder per class"),
    ("vision", ["--momentum", "1"], "--momentum must be a number in [0, 1), got 1"),  # SGD would never forget a step
    ("robustness", ["--momentum", "nan"], "--momentum must be a number in [0, 1), got nan"),
    ("vision", ["--lr", "inf"], "--lr must be a finite learning rate > 0 (or <model>=<learning rate>), got inf"),
    ("vision", ["--patch-size", "5", "--dataset", "fake"], "--patch-size 5 does not divide"),
    # every flag with choices refuses a value outside them, before anything else (not a KeyError or a silent default)
    ("vision", ["--spt-shift", "2"], "--spt-shift: invalid choice: '2' (choose from '1', 'half')"),  # not one pixel
    ("vision", ["--dataset", "cifar100"], "--dataset: invalid choice: 'cifar100'"),
    ("vision", ["--mask", "patch", "random"], "--mask: invalid choice: 'random' (choose from 'patch', 'scattered',"),
    ("imagenet", ["--model", "resnet50"], "--model: invalid choice: 'resnet50'"),
    ("imagenet", ["--mask", "scattered"], "--mask: invalid choice: 'scattered' (choose from 'patch', 'global')"),
    ("synthetic", ["--case", "both"], "--case: invalid choice: 'both'"),
    ("language", ["--task", "sst2"], "--task: invalid choice: 'sst2'"),
    ("language", ["--split", "test"], "--split: invalid choice: 'test' (choose from 'paper', 'glue')"),
    ("language", ["--align", "centre"], "--align: invalid choice: 'centre' (choose from 'right', 'left')"),
    ("robustness", ["--variants", "adversarial"], "--variants: invalid choice: 'adversarial'"),
    ("vision", ["--activation", "sigmoid"], "unrecognized arguments: --activation"),
    ("vision", ["--split-seed", "1"], "unrecognized arguments: --split-seed"),
    ("vision", ["--patch", "4"], "unrecognized arguments: --patch"),
    ("robustness", ["--pretrained", "vit_l_16"], "unrecognized arguments: --pretrained"),
    ("robustness", ["--imagenet-dir", "x"], "unrecognized arguments: --imagenet-dir"),
    ("robustness", ["--random-weights"], "unrecognized arguments: --random-weights"),
    ("robustness", ["--cifar10c-dir", "/missing"], "--cifar10c-dir /missing: no such folder"),
    ("robustness", ["--corruptions", "rain"], "unknown corruption 'rain'"),
    ("robustness", ["--severities", "6"], "--severities must be an integer from 1 to 5, got 6"),
    ("robustness", ["--severities", "0"], "--severities must be an integer from 1 to 5, got 0"),
    ("robustness", ["--dataset", "fake28", "--n-corrupt", "300", "--epochs", "1"], "--n-corrupt 300"),
    ("robustness", ["--dataset", "fake28", "--n-train", "50", "--n-sens", "5", "--n-sharp", "51", "--epochs", "1"],
     "--n-sharp 51 asks for more than the 50 training images (--n-train)"),
    ("language", ["--n-train", "-3600"], "--n-train must be an integer >= 1"),
    ("language", ["--sigma", "nan"], "--sigma"),
    ("language", ["--layers", "2"], "unrecognized arguments: --layers"),
    ("language", ["--positions", "2"], "unrecognized arguments: --positions"),
    ("synthetic", ["--seeds", "-1"], "--seeds"),
    ("synthetic", ["--d-head", "4"], "unrecognized arguments: --d-head"),
    ("synthetic", ["--n-sens", "10", "--n-train", "5"], "--n-sens 10 asks for more than"),
    ("grokking", ["--d-model", "64"], "unrecognized arguments: --d-model"),
    ("grokking", ["--lr", "-1"], "--lr"),
    ("grokking", ["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    ("language", ["--dropout", "1"], "--dropout must be a number in [0, 1), got 1"),
    ("parity", ["--seed", "1"], "unrecognized arguments: --seed"),
    ("parity", ["--n-sens", "30000"], "--n-sens 30000 asks for more than the 20000"),
    ("vision", ["--schedule", "linear"], "invalid choice: 'linear'"),
    ("vision", ["--optimizer", "adamw"], "invalid choice: 'adamw'"),  # not Adam in silence
    ("synthetic", ["--irrelevant-set", "0"], "--irrelevant-set must be an integer >= 1"),
    ("synthetic", ["--dim-head", "0"], "--dim-head must be an integer >= 1"),
    ("parity", ["--mlp-dim", "0"], "--mlp-dim must be an integer >= 1"),
    ("language", ["--model", "bert"], "invalid choice: 'bert'"),
    ("language", ["--attn", "linear"], "invalid choice: 'linear'"),
    ("language", ["--model", "lstm", "--attn", "relu"], "--attn relu is the transformers' attention: --model lstm"),
    ("language", ["--task", "fake", "--download"], "--download fetches a GLUE task's files: --task fake makes up"),
    ("language", ["--dim", "100", "--data-dir", "/no/glue"], "--dim 100 must be a multiple of --heads 8"),
    ("language", ["--sens-positions", "0"], "--sens-positions must be an integer >= 1"),
    ("language", ["--sens-during", "never"], "invalid choice: 'never'"),
    ("vision", ["--sens-during", "never"], "invalid choice: 'never'"),
    ("grokking", ["--p", "5", "--frac-train", "0.01"], "--frac-train 0.01 of 25 pairs leaves no training pair"),
    ("grokking", ["--p", "1"], "--p must be an integer >= 2, got 1"),
    ("grokking", ["--p", "0"], "--p must be an integer >= 2, got 0"),
    ("bench", ["--rounds", "0"], "--rounds must be an integer >= 1"),
    # an empty value ('' from an unset shell variable): --resume '' had started a fresh run, and a folder '' is the
    # current one
    ("vision", ["--resume", ""], "--resume is empty ('')"),  # (each fails fast without the check: CIFAR-10's absence)
    ("vision", ["--data-dir", ""], "--data-dir is empty ('')"),
    ("robustness", ["--from-vision", ""], "--from-vision is empty ('')"),
    ("report", ["a", "b", "--out-dir", ""], "--out-dir is empty ('')"),
    # a list flag's repeated value would run (or measure) the same thing twice and keep one, reporting fewer seeds
    ("synthetic", ["--seeds", "0", "1", "0"], "--seeds lists 0 twice"),
    ("vision", ["--model", "vit", "cnn", "vit"], "--model lists vit twice"),
    ("vision", ["--sigma", "0.1", "1e-1"], "--sigma lists 0.1 twice"),
    ("robustness", ["--corruptions", "fog", "fog"], "--corruptions lists fog twice"),
    ("vision", ["--match-acc", "0.5", "0.9", "0.9"], "--match-acc lists 0.9 twice"),  # the flag as typed
    ("bench", ["--only", "estimator,gpu"], "--only: no benchmark group gpu"),
    ("bench", ["--only", "estimator,"], "--only: no benchmark group '' (choose from estimator,"),  # a stray comma
]


@pytest.mark.parametrize("script,argv,message", BAD, ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD])
def test_bad_input_is_one_line_and_exit_code_2(script, argv, message, capsys, tmp_path):
    code, err = run(script, argv + ["--out-dir", str(tmp_path)] * (script not in ("bench", "report")), capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_list_flags_whose_values_may_repeat_take_them():
    """Hidden widths may repeat, and per-model rates too (the last that names a model wins): not refused as runs."""
    args = vision.parse_args(["--mlp-hidden", "64", "64", "--lr", "0.1", "cnn=0.05", "0.1"])
    assert args.mlp_hidden == [64, 64] and vision.learning_rate("cnn", args) == 0.1


def test_the_lstm_alone_takes_a_width_the_heads_do_not_divide():
    """--dim must be a multiple of --heads for the transformers' heads (the BAD list); the LSTM alone has none."""
    assert language.parse_args(["--model", "lstm", "--dim", "100"]).dim == 100


def test_resuming_a_folder_whose_metrics_json_is_corrupt_is_one_line(tmp_path, capsys):
    """--resume FOLDER whose metrics.json is not JSON: one line naming the folder and what is wrong, exit code 2."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("{not json")
    code, err = run("vision", ["--resume", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"--resume {tmp_path / 'run'}: " in err and "is not a valid metrics.json" in err, err


# what ../shared/paper/SETTINGS.md gives each setting: [paper], [author code]; a default changed by mistake (a planted
# one-line bug in a flag) changes what `python <script>.py` reproduces without any other test noticing
DEFAULTS = {
    "vision": dict(optimizer="sgd", batch_size=100, patch_size=4, sens_patch=4,  # [paper]; patch 4 [author code]
                   depth=8, heads=32, dim=64, mlp_dim=512, dropout=0.1, spt_shift="1", mlp_hidden=[512, 128],
                   sigma=[0.1], sens_seed=0, schedule="constant", momentum=0.0, seeds=[0],  # the authors' ViT-small
                   dim_head=64, epochs=50, eval_every=5,  # [author code]
                   model=["vit"], dataset="cifar10", weight_decay=0.0, mask=["patch"], n_sens=500, data_seed=0,
                   reps=1,  # [decided]: one noise draw per (image, patch)
                   data_dir="data"),  # [decided]: where the files are read from or downloaded to
    "language": dict(depth=4, heads=8, dim=256, max_len=128, sigma=[15 ** 0.5],  # [author code]
                     lr=1e-4, weight_decay=1e-4, dropout=0.1, batch_size=32, split="paper",  # [paper]
                     model=["roberta", "lstm"], attn=["softmax"], task="mrpc",  # the main comparison
                     n_sens=500, sens_positions=None, reps=1,  # [decided]: every position of 500 pairs, once
                     epochs=10, eval_every=625, vocab_size=10000, seeds=[0], sens_seed=0,  # [decided]
                     data_dir="data/glue"),  # [decided]: MRPC/ and QQP/ beside vision.py's data
    "grokking": dict(p=113, frac_train=0.3, dim=128, heads=4, mlp_dim=512, lr=1e-3, weight_decay=1.0, epochs=20000,
                     sigma=0.1, eval_every=100,  # [author code]
                     reps=2, data_seed=598, seeds=[0]),  # [decided]: two noise draws per (pair, position)
    "robustness": dict(reg=0.5, reg_std=1.0, sharp_std=0.05, sharp_reps=5, severities=[1, 2, 3, 4, 5],  # [author code]
                       augment_std=0.1, n_sharp=2000),
    "synthetic": dict(n=20, sparse_set=2, frequent_set=10, irrelevant_set=20, batch_size=100, init_std=0.1,
                      seeds=[0, 1, 2], reps=2,  # the suggested sizes; batch 100 [paper]; two replacements
                      n_train=4000, n_test=2000, n_sens=1000, data_seed=1234, dim_head=16, lr=0.5, steps=2000,
                      eval_every=50),  # [decided]
    "parity": dict(n=20, k=3, steps=8000, weight_decay=0.1, n_test=2000,  # [decided]; the parity row's test set
                   eval_every=200, n_sens=1000, setting=1, depth=2, heads=4, data_seed=1234),  # [decided]
    "imagenet": dict(model=["convnext_tiny", "vit_l_16"], sigma=[0.1], mask=["patch"],  # the paper's two models
                     n_sens=500, sens_positions=None, reps=1, sens_seed=0, data_seed=0),  # [decided], as vision.py's
}
REQUIRED = {"imagenet": ["--imagenet-dir", os.path.dirname(__file__)]}  # flags with no default (an existing folder)


def test_defaults_are_the_papers_and_the_authors_settings():
    """With no flags each script runs the settings SETTINGS.md gives (the paper's, else the authors' code's, else
    ours), and vision.py's per-model learning rates are the paper's (App. D). Every flag whose help cites the paper or
    the authors' code is pinned here (robustness.py's shared ones with vision.py's, which it must keep)."""
    for name, module in SCRIPTS.items():
        expected = {**(DEFAULTS["vision"] if name == "robustness" else {}), **DEFAULTS.get(name, {})}
        args = vars(module.parse_args(REQUIRED.get(name, []))) if expected else {}
        for flag, value in expected.items():
            assert args[flag] == (pytest.approx(value) if isinstance(value, (float, list)) else value), (name, flag)
        for action in parser_of(module)._actions:
            if action.help and ("[paper]" in action.help or "[author code]" in action.help):
                assert action.dest in expected, (name, action.dest)
    assert vision.LR == {"vit": 0.1, "vit-simple": 0.2, "convmixer": 0.06, "resnet18": 0.001, "densenet121": 0.005,
                         "mlp": 0.1, "mlp-sigmoid": 0.5, "cnn": 0.005} and vision.LR_MNIST01 == 0.01


def test_every_script_has_the_run_flags_with_the_defaults_the_readme_gives():
    """The run group (How runs work in the README): one thread (0 means one), out/ for results, a checkpoint only when
    stopped, a progress line every 20 s; the device is chosen (synthetic.py's tiny model is fastest on the CPU).
    runs.RUN_FLAGS lists the group's flags."""
    for name, module in SCRIPTS.items():
        if name in ("bench", "report"):
            continue
        p = parser_of(module)
        run_flags = {k: p.get_default(k) for k in ["device", "threads", "out_dir", "run_name", "save_every", "resume",
                                          "progress_every"]}
        assert run_flags == dict(device="cpu" if name == "synthetic" else "auto", threads=0, out_dir="out",
                                 run_name=None, save_every=0, resume=None, progress_every=20), name
    group = ArgumentParser()
    add_run_flags(group, unit="steps", default_name="x")
    assert set(vars(group.parse_args([]))) == RUN_FLAGS  # free in a merge, not taken by --from-vision


@pytest.mark.slow
def test_language_sizes_and_files(tmp_path, capsys):
    """Language sizes are checked against the pairs there are; a truncated row and a label of 2 name file and line."""
    data = write_mrpc(tmp_path / "glue" / "MRPC")
    base = ["--data-dir", str(tmp_path / "glue"), "--out-dir", str(tmp_path), "--epochs", "1", "--split", "glue"]
    for argv, message in [(["--n-train", "100"], "--n-train 100 asks for more than the 16 MRPC training pairs"),
                          (["--n-test", "9"], "--n-test 9 asks for more than the 8 MRPC test pairs"),
                          (["--n-sens", "17"], "--n-sens 17"),
                          (["--sens-test", "--n-sens", "9"], "--n-sens 9 asks for more than the 8 test pairs")]:
        code, err = run("language", base + argv, capsys)
        assert code == 2 and message in err, err
    text = (data / "train.tsv").read_text()
    (data / "train.tsv").write_text(text[: text.rindex("\t")])  # cut inside the last row
    code, err = run("language", base, capsys)
    assert code == 2 and "train.tsv line 17 has 4 fields" in err, err
    (data / "train.tsv").write_text(text.replace("\n1\t", "\n2\t", 1))
    code, err = run("language", base, capsys)
    assert code == 2 and "line 2: label '2' is not 0 or 1" in err, err
    code, err = run("language", ["--data-dir", str(tmp_path / "nowhere"), "--out-dir", str(tmp_path)], capsys)
    assert code == 2 and "msr_paraphrase_train.txt not found" in err and "--download" in err
    assert "(--split paper: msr_paraphrase_train.txt, msr_paraphrase_test.txt; --split glue: train.tsv, dev.tsv)" \
        in err, err
    code, err = run("language", ["--data-dir", str(tmp_path / "nowhere"), "--out-dir", str(tmp_path), "--task", "qqp"],
                    capsys)
    assert code == 2 and "QQP/train.tsv not found. Put the QQP files (--split glue: train.tsv, dev.tsv) in" in err, err
    code, err = run("language", base + ["--task", "qqp", "--split", "paper"], capsys)
    assert code == 2 and "--split paper: QQP has glue" in err, err


@pytest.mark.slow
def test_corrupt_dataset_file_is_named_apart_from_a_missing_one(tmp_path, monkeypatch):
    """A present but damaged Fashion-MNIST file gets its own message naming it; a missing one says where to put it."""
    import urllib.error
    import urllib.request

    def offline(*a, **k):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="put FashionMNIST/raw"):
        vision.load_dataset("fashionmnist", str(tmp_path), torch.device("cpu"))
    raw = tmp_path / "FashionMNIST" / "raw"  # made by the failed download above
    (raw / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b truncated")
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.gz is present but unreadable: its MD5"):
        vision.load_dataset("fashionmnist", str(tmp_path), torch.device("cpu"))
    (raw / "train-images-idx3-ubyte.gz").unlink()
    (raw / "train-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 3, 0, 0, 0, 9, 0, 0, 0, 28, 0, 0, 0, 28, 7]))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte is present but unreadable: not a complete IDX "
                       r"file\. Replace"):  # torchvision's reader says nothing more here
        vision.load_dataset("fashionmnist", str(tmp_path), torch.device("cpu"))
    (raw / "train-images-idx3-ubyte").write_bytes(b"")
    with pytest.raises(ValueError, match=r"unreadable: not a complete IDX file \(.+\)\. Replace"):  # here it does
        vision.load_dataset("fashionmnist", str(tmp_path), torch.device("cpu"))


def test_a_damaged_cifar10_or_svhn_file_is_named(tmp_path):
    """CIFAR-10's archive or batch files and SVHN's .mat files are checked against their published MD5 sums, as
    Fashion-MNIST's are: a damaged one is named, and a folder without them holds none."""
    from torchvision.datasets import CIFAR10, SVHN
    assert corrupt_file(CIFAR10, str(tmp_path)) is None and corrupt_file(SVHN, str(tmp_path)) is None
    batches = tmp_path / "cifar-10-batches-py"
    batches.mkdir()

    class Intact(CIFAR10):  # one batch file whose published MD5 sum is that of our bytes: it passes
        train_list, test_list = [["data_batch_1", hashlib.md5(b"intact").hexdigest()]], []
    (batches / "data_batch_1").write_bytes(b"intact")
    assert corrupt_file(Intact, str(tmp_path)) is None
    (batches / "data_batch_1").unlink()  # not CIFAR-10's own data_batch_1
    (batches / "data_batch_3").write_bytes(b"cut short")
    assert corrupt_file(CIFAR10, str(tmp_path)) == (str(batches / "data_batch_3"), "its MD5 checksum is not the "
                                                    "published one (a truncated or altered file)")
    (tmp_path / "test_32x32.mat").write_bytes(b"cut short")
    assert corrupt_file(SVHN, str(tmp_path))[0] == str(tmp_path / "test_32x32.mat")


def test_a_dataset_that_cannot_load_is_named_with_the_first_line_of_its_error(tmp_path):
    """torchvision's error (a download that failed, here) is given by its type and first line, with where to put the
    files. A --data-dir that the failed call made is removed again, unless a file was written into it; one that was
    there before stays."""
    class Offline:
        resources = []  # (as MNIST's: no damaged file among them)

        def __init__(self, root, download):
            os.makedirs(os.path.join(root, "Offline", "raw"), exist_ok=True)  # as torchvision's download does
            if root.endswith("partial"):
                open(os.path.join(root, "Offline", "raw", "images.gz.part"), "w").close()
            raise RuntimeError("Error downloading images.gz\n<a long traceback>")

    with pytest.raises(FileNotFoundError) as e:
        torchvision_dataset(Offline, str(tmp_path), "images.gz")
    assert str(e.value) == (f"cannot load Offline from {tmp_path} (RuntimeError: Error downloading images.gz). Without "
                            "a network, put images.gz under that folder (or pass --data-dir), and torchvision will use "
                            "them")
    assert (tmp_path / "Offline" / "raw").is_dir()  # a folder that was there is left as the download left it
    for name, kept in [("typo", False), ("partial", True)]:
        with pytest.raises(FileNotFoundError, match="put images.gz under that folder"):
            torchvision_dataset(Offline, str(tmp_path / name), "images.gz")
        assert (tmp_path / name).exists() == kept, name


def test_seeds_started_together_extract_a_dataset_one_at_a_time(tmp_path):
    """reproduce.sh starts a row's seeds at once on a fresh --data-dir: while the first extracts the archives, the
    others must wait rather than read a half-written file (one seed of a vision row failed so)."""
    class Extracting:  # writes its file in two pieces, as an extraction does, then reads it back
        resources = []  # (as MNIST's: corrupt_file looks for damaged files among these)

        def __init__(self, root, download):
            os.makedirs(root, exist_ok=True)
            path = os.path.join(root, "images")
            if not os.path.exists(path):
                with open(path, "w") as fh:
                    fh.write("half")
                    fh.flush()
                    time.sleep(0.3)
                    fh.write(" and the rest")
            with open(path) as fh:
                self.text = fh.read()

    texts, errors = [], []

    def load():
        try:
            texts.append(torchvision_dataset(Extracting, str(tmp_path / "data"), "images").text)
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)  # the second starts while the first is writing
    for t in threads:
        t.join()
    assert not errors and texts == ["half and the rest"] * 2, (errors, texts)


# -----------------------------------------------------------------------------
# divergence: exit code 3, one line naming the run, metrics.json kept with "diverged"

DIVERGE = {
    "synthetic": ["--lr", "1e6", "--steps", "40", "--eval-every", "20", "--seeds", "0", "--case", "sparse-lower",
                  "--n-train", "200", "--n-test", "50", "--n-sens", "20"],
    "vision": ["--lr", "1e6", "--dataset", "fake28", "--model", "vit", "--epochs", "1", "--n-train", "100",
               "--n-test", "20", "--n-sens", "5"] + VIT,
    "robustness": ["--lr", "1e6", "--dataset", "fake28", "--model", "vit", "--epochs", "1", "--n-train", "100",
                   "--n-test", "20", "--n-sens", "5", "--corruptions", "fog", "--n-corrupt", "10", "--n-sharp", "10"]
    + VIT,
    "grokking": ["--lr", "1e6", "--p", "11", "--epochs", "6", "--eval-every", "3", "--dim", "16", "--heads", "2",
                 "--mlp-dim", "16"],
    "parity": ["--lr", "1e6", "--n", "8", "--k", "2", "--steps", "6", "--eval-every", "3", "--n-train", "200",
               "--n-test", "50", "--n-sens", "20", "--dim", "16"],
    "language": ["--lr", "1e6", "--model", "lstm", "--dim", "16", "--depth", "1", "--epochs", "2", "--eval-every",
                 "2", "--n-sens", "4"],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", list(DIVERGE))
def test_a_diverged_run_exits_3_and_keeps_its_metrics(script, tmp_path, capsys):
    """--lr 1e6 destroys the model: no sensitivity is reported for it; exit 3; metrics.json marks the run."""
    argv = DIVERGE[script] + ["--out-dir", str(tmp_path), "--run-name", "d"]
    if script == "language":  # the LSTM's loss stays finite (bounded gates) but passes 100x its initial value
        argv += ["--data-dir", str(write_mrpc(tmp_path / "glue" / "MRPC").parent)]
    code, err = run(script, argv, capsys)
    assert code == 3
    lines = err.strip().splitlines()
    assert any("diverged at" in line and "no sensitivity" in line for line in lines), err
    data = json.loads((tmp_path / script / "d" / "metrics.json").read_text())
    (run_name, r), = [(k, v) for k, v in data["runs"].items() if "diverged" in v]
    assert r["diverged"]["step"] >= 1 and (r["diverged"]["loss"] is None or r["diverged"]["loss"] > 1)
    assert "sens" not in r["final"]
    assert all(h.get("sens") is not None for h in r["history"])  # rows before the divergence were finite


# -----------------------------------------------------------------------------
# Ctrl-C: exit code 130, the metrics so far, "interrupted": true


@pytest.mark.slow
def test_ctrl_c_keeps_the_metrics_and_exits_130(tmp_path, capsys, monkeypatch):
    stop_at_backward(monkeypatch, 3)  # the third epoch: one SGD step per epoch (100 images, batches of 100)
    argv = ["--dataset", "fake28", "--model", "mlp", "--epochs", "10", "--eval-every", "1", "--n-train", "100",
            "--n-test", "20", "--n-sens", "5", "--mlp-hidden", "16", "--out-dir", str(tmp_path), "--run-name", "c"]
    code, err = run("vision", argv, capsys)
    assert code == 130 and len(err.strip().splitlines()) == 1 and "interrupted" in err
    path = tmp_path / "vision" / "c" / "metrics.json"
    data = json.loads(path.read_text())
    assert data["interrupted"] is True
    assert [h["epoch"] for h in data["runs"]["mlp/seed0"]["history"]] == [0, 1, 2]
    # the message names the folder and the command that continues the run; that command finishes it
    command = err.split("Continue with: ", 1)[1].split()
    assert command[:3] == ["python", "vision.py", "--resume"] and command[3] == str(tmp_path / "vision" / "c")
    monkeypatch.undo()
    code, err = run("vision", command[2:], capsys)
    assert code == 0, err
    data = json.loads(path.read_text())
    assert [h["epoch"] for h in data["runs"]["mlp/seed0"]["history"]] == list(range(11)) and "interrupted" not in data


@pytest.mark.slow
def test_metrics_json_is_strict_and_world_readable(tmp_path):
    """One seed's stderr is NaN: written as null, never as a bare NaN; the file has the figures' permissions."""
    argv = ["--dataset", "fake28", "--model", "mlp", "--epochs", "1", "--n-train", "50", "--n-test", "20",
            "--n-sens", "1", "--mlp-hidden", "8", "--out-dir", str(tmp_path), "--run-name", "s"]
    vision.main(vision.parse_args(argv))
    folder = tmp_path / "vision" / "s"
    text = (folder / "metrics.json").read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert data["runs"]["mlp/seed0"]["final"]["sens_stderr"] is None  # one image: no standard error
    mode = stat.S_IMODE(os.stat(folder / "metrics.json").st_mode)
    assert mode == stat.S_IMODE(os.stat(folder / "sensitivity.png").st_mode)


# -----------------------------------------------------------------------------
# robustness.py's parser is vision.py's plus its own flags; bench.py never replaces its output


def help_flags(module, capsys):
    """The --flags a script's --help shows."""
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    return {w.rstrip(",") for line in capsys.readouterr().out.splitlines() for w in line.split() if w.startswith("--")}


def test_robustness_help_lists_every_flag_it_accepts(capsys):
    """--help shows vision.py's shared flags and robustness.py's own, and none of imagenet.py's; every flag shown is
    accepted."""
    shown = help_flags(robustness, capsys)
    shared = {s for a in vision.add_flags(ArgumentParser(add_help=False))._actions for s in a.option_strings}
    assert shared < shown and {"--variants", "--cifar10c-dir", "--sharp-std", "--n-test", "--help"} <= shown
    assert not shown & {"--pretrained", "--imagenet-dir", "--random-weights"}
    own = shown - shared - {"--help"}
    for flag in own:  # each of its own flags parses (with a value where it takes one)
        argv = {"--from-vision": None, "--cifar10c-dir": None, "--resume": None}.get(flag, [flag])
        if argv is None:
            continue
        try:
            robustness.parse_args(argv)
        except SystemExit as e:
            assert "unrecognized" not in str(e) and e.code == 2 or e.code == 0, flag


def test_from_vision_refuses_every_flag_of_the_training(capsys):
    """robustness.py --from-vision trains nothing: each flag of vision.py's optimisation group but --seeds (which
    picks the saved models) is in TRAINING_FLAGS, and each name there is a flag robustness.py shows."""
    groups = vision.add_flags(ArgumentParser(add_help=False))._action_groups
    optimisation = {s for g in groups if g.title == "optimisation" for a in g._group_actions for s in a.option_strings}
    assert optimisation - {"--seeds"} <= set(robustness.TRAINING_FLAGS) <= help_flags(robustness, capsys)


def parser_of(module):
    """The ArgumentParser that module.parse_args (or a tool's main) builds, caught before it parses."""
    p = None

    def grab(parser, *a, **k):
        nonlocal p
        p = parser
        raise SystemExit(0)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", grab)  # runs.ArgumentParser's calls it too
        with pytest.raises(SystemExit):
            module.parse_args([]) if hasattr(module, "parse_args") else module.main()
    return p


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# each `python X.py ...` of a bash block, as bash expands it (loops, variables, braces), run with an empty PATH: no
# other program runs (pip, apt-get, ...). $s is the seed of blocks that show one seed's command of a loop
RECORD = r"""s=0
python() { local IFS=$'\x1f'; printf '%s\x1e' "$*" >> "$RECORD"; }
source() { :; }
"""


def front_doors(monkeypatch):
    """The scripts' modules and the tools' (every tools/*.py, imported from there)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tools"))
    tools = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py"))
    return [*SCRIPTS.values(), *map(importlib.import_module, tools)]


def docstring_commands(modules):
    """The commands the modules' docstrings show (`python X.py ...` lines and their continuations), as the bash block
    of a markdown text."""
    lines = []
    for module in modules:
        going = False
        for line in module.__doc__.splitlines():
            going = going or re.match(r"\s+python \S+\.py", line)
            if going:
                lines.append(line)
                going = line.rstrip().endswith("\\")
    return "```bash\n" + "\n".join(lines) + "\n```"


def shown_commands(text, tmp_path):
    """[argv] of every python command the bash blocks of a markdown text show, and its `python X.py ...` spans."""
    record = tmp_path / "record"
    record.write_text("")
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        subprocess.run([shutil.which("bash"), "-c", RECORD + block + "\nwait"], cwd=tmp_path, capture_output=True,
                       env={"PATH": str(tmp_path / "nothing"), "RECORD": str(record)}, stdin=subprocess.DEVNULL,
                       timeout=60)
    inline = [shlex.split(span) for span in re.findall(r"`python ([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
              if not re.search(r"\.\.\.|[<\[{$|]|\b[A-Z]\b", span)]  # `python X.py ...` spans, bar placeholders
    return [call.split("\x1f") for call in record.read_text().split("\x1e")[:-1]] + inline


@pytest.mark.parametrize("doc", ["README.md", "RESULTS.md", "docstrings"])
def test_every_command_the_docs_show_parses(doc, tmp_path, monkeypatch, capsys):
    """Each `python <script>.py ...` in a bash block of the README and RESULTS.md (as bash expands it) or in a code
    span of their text (bar those with a placeholder: N, <script>, ...), and in the docstrings of the scripts and
    tools, is taken by today's parser (no flag renamed or dropped since, every value of its type) and passes the
    script's own checks, where only a file or folder that the command names and this test lacks (or CUDA, on a
    machine without it) may stop it."""
    modules = front_doors(monkeypatch)
    text = docstring_commands(modules) if doc == "docstrings" else open(os.path.join(ROOT, doc)).read()
    commands = [c for c in shown_commands(text, tmp_path) if c[0] != "-m"]  # not python -m pytest
    assert len(commands) >= {"README.md": 8, "RESULTS.md": 100, "docstrings": 40}[doc]
    monkeypatch.chdir(tmp_path)  # so that out/... and DATA name nothing here
    for script, *argv in commands:
        module = importlib.import_module(os.path.basename(script)[:-3])
        code, err = None, ""
        try:
            parser_of(module).parse_args(argv)  # the flags and their types
            if hasattr(module, "parse_args"):
                module.parse_args(argv)  # and the script's checks after them
        except SystemExit as e:
            code, err = e.code, capsys.readouterr().err
        paths = [a for a in argv if not a.startswith("-") and ("/" in a or a.isupper() or a == "out")]  # OUT, DATA
        missing = [a for a in paths if not os.path.exists(a)]
        no_cuda = "no CUDA device" in err and not torch.cuda.is_available()
        assert not code or no_cuda or any(a in err for a in missing), f"{doc}: python {script} {' '.join(argv)}\n{err}"


def test_every_flag_the_docs_name_exists(monkeypatch):
    """Every --flag the README and RESULTS.md name, in a command or in the text, is a flag of a script or tool (or
    of reproduce.sh, or pytest's): a flag renamed since leaves no stale name behind."""
    known = {"--data", "--dry-run", "--durations", "--dist"}  # reproduce.sh's own (the rest are the scripts'); pytest's
    for module in front_doors(monkeypatch):
        parser = parser_of(module)
        parsers = [parser] + [sub for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                              for sub in a.choices.values()]  # and cifar_c_fidelity.py's subcommands
        known |= {flag for p in parsers for a in p._actions for flag in a.option_strings}
    text = "".join(open(os.path.join(ROOT, doc)).read() for doc in ["README.md", "RESULTS.md"])
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    assert len(named) > 80 and named <= known, sorted(named - known)


def test_the_readme_lists_every_file():
    """The README's Files block names each script, module and shell script the repository holds at its top, each
    tool, and nothing that is not there (a file of your own beside them is not asked for)."""
    git = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if git.returncode or not git.stdout:
        pytest.skip("not a git checkout (a copy without .git): no list of the repository's files")
    files = git.stdout.split()
    block = re.search(r"## Files\n\n```\n(.*?)```", open(os.path.join(ROOT, "README.md")).read(), re.S).group(1)
    listed = {line.split()[0] for line in block.splitlines() if line and not line[0].isspace()}
    tools = set(re.findall(r"\b([a-z_]+\.(?:py|sh))\b", block.split("\ntools/")[1].split("\ntests/")[0]))
    assert {f for f in files if "/" not in f and f.endswith((".py", ".sh"))} <= listed
    assert {f[len("tools/"):] for f in files if f.startswith("tools/")} == tools
    assert all(os.path.exists(os.path.join(ROOT, name)) for name in listed)


def test_the_readme_gives_the_number_of_tests(request):
    """The README's test command says how many tests the suite has and how many of them need a GPU (test_gpu.py's);
    counted in a run of the whole suite only (no -m, -k or chosen files)."""
    items, option = request.session.items, request.config.option
    files = {os.path.basename(str(i.path)) for i in items}
    every = {f for f in os.listdir(os.path.join(ROOT, "tests")) if f.startswith("test_") and f.endswith(".py")}
    if option.markexpr or option.keyword or files != every:
        pytest.skip("counts a run of the whole suite only")
    said = re.search(r"what CI runs: (\d+) tests \((\d+) need a GPU\)", open(os.path.join(ROOT, "README.md")).read())
    counted = (len(items), sum(os.path.basename(str(i.path)) == "test_gpu.py" for i in items))
    assert tuple(map(int, said.groups())) == counted, f"the README's Tests block should say {counted[0]} tests " \
        f"({counted[1]} need a GPU)"


def test_the_docs_links_lead_somewhere():
    """Every link of the README and RESULTS.md to a file (a figure, RESULTS.md) names one that exists, and every
    #anchor a heading of the file it names, as GitHub makes it (lower case, punctuation dropped, spaces as hyphens)."""
    def anchors(name):
        text = re.sub(r"```.*?```", "", open(os.path.join(ROOT, name)).read(), flags=re.S)  # not a block's comments
        headings = re.findall(r"^#+ (.*)$", text, re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}

    for doc in ["README.md", "RESULTS.md"]:
        links = [(p, a) for p, a in re.findall(r"\]\(([^)#]*)(?:#([^)]*))?\)", open(os.path.join(ROOT, doc)).read())
                 if not p.startswith("http")]
        assert len(links) >= 6
        for path, anchor in links:
            assert os.path.exists(os.path.join(ROOT, path or doc)), (doc, path)
            assert not anchor or anchor in anchors(path or doc), (doc, anchor)


def test_every_flag_names_its_type_and_a_number_flag_checks_its_values():
    """Every flag that takes a value names its type (type=str for text), so that a number flag cannot silently
    become text: `--reps 0` and `--patience 0` are refused in every script, not read as '0'. A flag whose default is
    a number has a type that accepts that default."""
    for name, module in SCRIPTS.items():
        for action in parser_of(module)._actions:
            if not action.option_strings or action.nargs == 0:  # --help and the switches take no value
                continue
            assert action.type is not None, (name, action.option_strings)
            defaults = action.default if isinstance(action.default, list) else [action.default]
            if defaults and all(type(d) in (int, float) for d in defaults):
                assert [action.type(str(d)) for d in defaults] == defaults, (name, action.option_strings)


def test_help_shows_every_default(capsys):
    """Every flag has a help text, and every flag with a value has its default in --help, in every script and in
    report.py: the text after a flag (up to the next flag) says 'default'. Switches (default off) and flags without a
    default are exempt from the second."""
    for name, module in SCRIPTS.items():
        p = parser_of(module)
        assert p.description == module.__doc__, name  # --help opens with the script's docstring: its commands
        text = p.format_help()
        for action in p._actions:
            assert action.help, (name, action.option_strings or action.dest)  # the folders of report.py too
            if not action.option_strings or action.default is None or action.default is False or action.nargs == 0:
                continue
            flag = action.option_strings[-1]
            after = re.split(rf"\n  {re.escape(flag)}\b", text, maxsplit=1)[1]
            entry = re.split(r"\n  --", after, maxsplit=1)[0]
            assert "default" in entry, (name, flag, entry)
    capsys.readouterr()


def test_a_flag_shows_its_value_under_the_name_its_help_uses():
    """--help names a flag's value as its help text does: `--claims OUT` prints the rows from what reproduce.sh wrote
    under OUT (README: `python report.py --claims OUT`), not `--claims CLAIMS`."""
    for module, flag, value in [(report, "--claims", "OUT"), (report, "--vary", "FLAG [FLAG ...]"),
                                (grokking, "--stop-after-grok", "EPOCHS")]:
        p = parser_of(module)
        action = next(a for a in p._actions if flag in a.option_strings)
        assert f"{flag} {value}" in p.format_help() and value.split()[0] in action.help, (flag, action.help)


def test_one_vocabulary_across_scripts(capsys):
    """The same knob has the same flag everywhere it exists, and the old names are gone."""
    seen = {name: help_flags(module, capsys) for name, module in SCRIPTS.items() if name != "report"}
    old = {"--layers", "--width", "--d-model", "--d-mlp", "--d-head", "--split-seed", "--n-valid", "--positions",
           "--sens-every", "--seed", "--patch", "--activation", "--sens-valid"}
    for name, names in seen.items():
        assert not names & old, (name, names & old)
    for name in ["synthetic", "vision", "language", "robustness", "grokking", "parity"]:
        assert {"--seeds", "--eval-every", "--threads", "--device", "--out-dir", "--run-name", "--save-every",
                "--resume"} <= seen[name], name
        assert "--plot" not in seen[name], name  # report.py redraws
    for name in ["vision", "language", "parity"]:
        assert {"--depth", "--heads", "--dim", "--dim-head", "--mlp-dim"} <= seen[name], name
    assert {"--dim", "--heads", "--mlp-dim"} <= seen["grokking"]
    assert {"--n-train", "--n-test", "--n-sens", "--sens-positions"} <= seen["vision"] & seen["language"]
    assert "--data-seed" in seen["vision"] & seen["synthetic"] & seen["grokking"] & seen["parity"]


def test_bench_checks_its_output_before_running(tmp_path, capsys):
    (tmp_path / "taken.json").write_text("{}")
    code, err = run("bench", ["--out", str(tmp_path / "taken.json")], capsys)
    assert code == 2 and "never replaces" in err
    code, err = run("bench", ["--out", str(tmp_path / "taken.json" / "b.json")], capsys)  # a file as the folder
    assert code == 2 and "cannot write" in err
    if os.path.isdir("/proc/self"):  # a folder where no file can be made, even by root
        code, err = run("bench", ["--out", "/proc/b.json"], capsys)
        assert code == 2 and "--out /proc/b.json: cannot write in /proc" in err
    code, err = run("bench", ["--only", "estimator,gpu,cpu"], capsys)
    assert code == 2 and "--only: no benchmark group gpu, cpu (choose from estimator, training," in err


def test_a_damaged_or_misshapen_release_is_refused_before_training(tmp_path, capsys):
    """--cifar10c-dir: every file the corruptions need is opened and checked up front: a corrupt .npy, images of the
    wrong shape or dtype, or a 28x28 dataset against the 32x32 release are one line and exit 2, before any training."""
    import numpy as np

    release = tmp_path / "C"
    release.mkdir()
    np.save(release / "labels.npy", np.zeros(10, dtype=np.int64))
    np.save(release / "contrast.npy", np.zeros((10, 32, 32, 3), dtype=np.uint8))
    (release / "snow.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(release / "fog.npy", np.zeros((10, 32, 32), dtype=np.uint8))
    base = ["--dataset", "fake", "--cifar10c-dir", str(release), "--out-dir", str(tmp_path)]
    for corruptions, dataset, message in [(["contrast", "snow"], "fake", "snow.npy is present but not a readable"),
                                          (["fog"], "fake", "fog.npy holds uint8 of shape (10, 32, 32)"),
                                          (["contrast"], "fake28", "the dataset's 1x28x28 images")]:
        code, err = run("robustness", base + ["--corruptions", *corruptions, "--dataset", dataset], capsys)
        assert code == 2 and message in err, err
    assert not (tmp_path / "robustness").exists()  # refused before a run folder was made


def test_resume_takes_a_run_folder_with_its_metrics(tmp_path, capsys):
    """--resume names the run's folder: a folder without metrics.json, or the metrics.json file itself (whose
    "folder" would then be a file), is one line and exit 2."""
    write_json(str(tmp_path / "metrics.json"), {"script": "synthetic", "args": {}, "runs": {}})
    for path in [tmp_path / "nothing", tmp_path / "metrics.json"]:
        code, err = run("synthetic", ["--resume", str(path)], capsys)
        assert code == 2 and f"--resume {path}: no metrics.json there to continue" in err, err


@pytest.mark.slow
def test_a_checkpoint_that_is_not_the_runs_is_refused(tmp_path, capsys, monkeypatch):
    """--resume with a checkpoint.pt of another run (copied from another folder), or of the same run name written
    with other flags (its shapes do not fit), is one line and exit 2, never a silent restart or a traceback."""
    import shutil

    small = ["--steps", "4", "--eval-every", "2", "--seeds", "0", "--n-train", "100", "--n-test", "20", "--n-sens",
             "10", "--out-dir", str(tmp_path)]
    stop_at_backward(monkeypatch, 3)
    assert run("synthetic", small + ["--case", "frequent-lower", "--run-name", "a"], capsys)[0] == 130
    monkeypatch.undo()
    synthetic.main(synthetic.parse_args(small + ["--case", "sparse-lower", "--run-name", "b"]))
    shutil.copy(tmp_path / "synthetic" / "a" / "checkpoint.pt", tmp_path / "synthetic" / "b")
    code, err = run("synthetic", ["--resume", str(tmp_path / "synthetic" / "b")], capsys)
    assert code == 2 and "holds run frequent-lower/seed0, which" in err and "another run's checkpoint" in err, err
    path = tmp_path / "synthetic" / "a" / "metrics.json"
    data = json.loads(path.read_text())
    data["args"]["dim_head"] = 8  # as if this folder had been written with other flags
    path.write_text(json.dumps(data))
    code, err = run("synthetic", ["--resume", str(tmp_path / "synthetic" / "a")], capsys)
    assert code == 2 and "checkpoint.pt does not fit this run's model" in err, err


def test_a_checkpoint_that_cannot_be_written_names_its_file(tmp_path, monkeypatch):
    """A full disk or a file-size cap while saving the checkpoint: an OSError naming the file, no .tmp left."""
    from runs import Results

    res = Results(str(tmp_path), "synthetic", {}, "cpu")
    model = torch.nn.Linear(2, 2)
    res.checkpoint("x/seed0", 0, True, 0, model, torch.optim.SGD(model.parameters(), lr=0.1))

    def full_disk(obj, path):
        open(path, "wb").write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=r"could not write the checkpoint .*checkpoint.pt .*No space left"):
        res.write_checkpoint()
    assert sorted(os.listdir(tmp_path)) == ["metrics.json"]


def test_report_names_the_file_and_what_is_missing(tmp_path, capsys):
    """report.py on a hand-edited metrics.json (a run without history, runs as a list, no script): one line naming
    the file and what is missing, exit 2."""
    for name, data, message in [("a", {"script": "vision", "runs": {"vit/seed0": {"final": {}}}},
                                 "run 'vit/seed0' needs a 'history' list"),
                                ("b", {"script": "vision", "runs": ["vit/seed0"]}, "no 'runs' mapping"),
                                ("c", {"runs": {}}, "names no script of this repository")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(data))
        code, err = run("report", [str(tmp_path / name)], capsys)
        assert code == 2 and message in err and str(tmp_path / name) in err, err
