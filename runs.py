"""The run plumbing every experiment script shares; nothing here is needed to understand an experiment.

- the flags every run has (`add_run_flags`: --device --threads --out-dir --run-name --save-every --resume), the
  argparse types that check a value where its flag is defined, and `parse`, which makes --resume go through the
  script's own parser (the saved arguments become its defaults, so a flag added since gets its default);
- `cli`: expected failures as one line on stderr and an exit code instead of a traceback;
- `setup`: threads, device and torchrun; `ranks` and `all_sum` for the few places that shard work by hand;
- `Results`: the run folder's metrics.json (written atomically after every change), checkpoint.pt and the resume of
  an interrupted run, and the divergence rule.

torch is imported by the functions that use it: report.py (merges, figures, the claims table) needs the flags, cli and
the run folders alone, and starts without torch in 0.3 s instead of 3.8.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import pickle
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

import numpy as np

# -----------------------------------------------------------------------------
# flags


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help as written (the script's docstring keeps its lines), and every flag's default after its help text,
    unless the text already gives it or there is none (a switch, or a value filled in later)."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if not action.option_strings or default is None or default is False or default == argparse.SUPPRESS \
                or "default" in text.lower():
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%') or 'none'})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2) instead of the whole usage text before it, no abbreviated flags
    (else a prefix of a flag, say --see, would silently mean the whole one, --seeds), no flag given an empty value,
    and the defaults in --help."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, formatter_class=HelpFormatter, **kwargs)

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        # '' (an unset shell variable, say): `--resume ""` would start a fresh run, `--out-dir ""` write here
        for key, value in vars(parsed).items():
            if value == "":
                self.error(f"--{key.replace('_', '-')} is empty ('')")
        return parsed

    def error(self, message):
        message = re.sub(r"^argument (--[\w-]+)(/\S+)?: must", r"\1 must", message)  # '--lr must be ...'
        message = re.sub(r"^argument (--[\w-]+)(/\S+)?: ", r"\1: ", message)
        self.exit(2, f"{self.prog}: {message} (--help lists the flags)\n")


def checked(convert, ok, what):
    """An argparse type: convert(text), refused with 'must be <what>, got <text>' unless ok(value)."""
    def check(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    check.__name__ = what  # argparse names the type in some messages
    return check


positive_int = checked(int, lambda v: v >= 1, "an integer >= 1")
nonnegative_int = checked(int, lambda v: v >= 0, "an integer >= 0")
seed = checked(int, lambda v: 0 <= v < 2**63, "a seed in [0, 2^63)")  # torch.manual_seed wraps larger ones silently
positive_float = checked(float, lambda v: 0 < v < math.inf, "a finite number > 0")
nonnegative_float = checked(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")
fraction = checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def one_of(names, what):
    """An argparse type for a name from a list: 'unknown model 'vgg'; choose from ...'."""
    def check(text):
        if text not in names:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; choose from {', '.join(names)}")
        return text

    return check


# the keys of add_run_flags' flags: where and how a run goes, never what it measures (a merge may differ in them, and
# robustness.py --from-vision does not take them)
RUN_FLAGS = {"device", "threads", "out_dir", "run_name", "save_every", "resume", "progress_every", "no_figures"}


def add_run_flags(p, *, unit, default_name, device="auto", figures=True):
    """The `run` group every script has; `unit` is the loop unit of --save-every (epochs or steps); `figures`: the
    script draws figures at the end of a run (--no-figures leaves them out)."""
    g = p.add_argument_group("run")
    g.add_argument("--device", type=str, default=device, help="auto | cpu | cuda | cuda:<index>")
    g.add_argument("--threads", type=nonnegative_int, default=0, help="CPU threads of this process (0: one, see "
                   "set_threads)")
    g.add_argument("--out-dir", type=str, default="out", help="results go to <out-dir>/<script>/<run-name>/")
    g.add_argument("--run-name", type=run_name, default=None, help=f"default: {default_name}")
    g.add_argument("--save-every", type=nonnegative_int, default=0, help=f"write the training state to "
                   f"<run>/checkpoint.pt every this many {unit} (0: only when the run is stopped)")
    g.add_argument("--resume", type=str, default=None, help="continue the stopped run in this run folder from its "
                   "checkpoint.pt, with the flags it was started with (only --threads, --device and --progress-every "
                   "may be given; --device of the kind it ran on, since random generators do not move between kinds)")
    g.add_argument("--progress-every", type=nonnegative_float, default=20, help="seconds between the progress lines "
                   "printed during training, whatever the evaluation schedule (0: none)")
    if figures:
        g.add_argument("--no-figures", action="store_true", help="write metrics.json alone, no figures (python "
                       "report.py <run folder> draws them later, from it)")
    return g


def per_name(names, what):
    """An argparse type for '0.05' (for every name) or 'cnn=0.05' (for one of `names`), a finite number > 0, kept as
    written: the script reads the last that applies (say vision.learning_rate)."""
    def check(text):
        name, _, value = text.rpartition("=")
        if name and name not in names:
            raise argparse.ArgumentTypeError(f"unknown model {name!r} in {text}")
        try:
            ok = 0 < float(value) < math.inf
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(f"must be a finite {what} > 0 (or <model>=<{what}>), got {text}")
        return text

    return check


def run_name(text):
    """A run name is one folder inside --out-dir/<script>/: no path separators, not '.' or '..'."""
    if not text or "/" in text or os.sep in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"must be a plain folder name, got {text!r}")
    return text


RESUME_FLAGS = {"--resume", "--threads", "--device", "--progress-every"}
REPEATABLE = {"mlp_hidden", "lr"}  # list flags whose values may repeat: widths, and per-model rates (last wins)


def parse(p, script, argv=None):
    """p.parse_args(argv); with --resume FOLDER, parsed again with that run's saved arguments as the defaults, so a
    flag the script gained since the run started takes its default. Other flags than --threads and --device are
    refused beside --resume (and --progress-every): the run continues with the flags it was started with. A list
    flag may not name a value twice (but those in REPEATABLE)."""
    args = p.parse_args(argv)
    for key, values in vars(args).items():  # --seeds 0 0 would train seed 0 twice and report "1 seed"
        if isinstance(values, list) and key not in REPEATABLE and len(set(values)) < len(values):
            p.error(f"--{key.replace('_', '-')} lists {next(v for v in values if values.count(v) > 1)} twice")
    if not args.resume:
        return args
    argv = sys.argv[1:] if argv is None else argv
    extra = [a.split("=")[0] for a in argv if a.startswith("--") and a.split("=")[0] not in RESUME_FLAGS]
    if extra:
        p.error(f"--resume continues a run with the flags it was started with; only --threads, --device and "
                f"--progress-every may be given beside it, not {' '.join(extra)}")
    if not os.path.isfile(os.path.join(args.resume, "metrics.json")):
        p.error(f"--resume {args.resume}: no metrics.json there to continue")
    try:
        saved = load_results(args.resume, script)["args"]
    except (ValueError, KeyError) as e:
        p.error(f"--resume {args.resume}: {e}")
    known = vars(args)
    from_command = {flag[2:].replace("-", "_") for flag in RESUME_FLAGS}  # this command's, never the folder's
    p.set_defaults(**{k: v for k, v in saved.items() if k in known and k not in from_command})
    return p.parse_args(argv)


def parse_with(p, argv, folder, script):
    """p.parse_args with the flags another script's run in `folder` was started with put before argv (so argv's take
    precedence), each as it would be typed: the saved values pass the same type checks. The run flags are not taken
    (robustness.py --from-vision reads vision.py's model and data flags this way)."""
    try:
        saved = load_results(folder, script)["args"]
    except ValueError as e:
        p.error(f"{folder}: {e}")
    known = vars(p.parse_args([]))
    skip = RUN_FLAGS | {"save_model"}
    typed = []
    for key, value in saved.items():
        if key not in known or key in skip or value is None or value is False or value in ({}, []):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, dict):  # --lr per model, as older runs saved it
            value = [f"{m}={v}" for m, v in value.items()]
        typed += [flag] if value is True else [flag, *map(str, value if isinstance(value, list) else [value])]
    return p.parse_args(typed + (sys.argv[1:] if argv is None else argv))


def given(argv, *flags):
    """Whether the command line names one of the flags (--flag or --flag=value)."""
    argv = sys.argv[1:] if argv is None else argv
    return any(a.split("=")[0] in flags for a in argv)


def subset_size(flag, n, available, what):
    """n, or all `available` when n is None; a ValueError naming the flag when n asks for more than there are."""
    if n is None:
        return available
    if n > available:
        raise ValueError(f"{flag} {n} asks for more than the {available} {what}")
    return n


# -----------------------------------------------------------------------------
# the front door: one-line errors and exit codes


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, timeout, a cluster's preemption), handled as Ctrl-C is: metrics and checkpoint kept."""


def _terminate(signum, frame):
    raise Terminated()


def cli(main, parse_args, argv=None):
    """Run a script's main as a command. Expected failures become one line on stderr and an exit code instead of a
    traceback (TRACEBACK=1 in the environment shows it): bad input, a missing or corrupt file, no CUDA (2); a
    diverged run, whose metrics.json says so (3); Ctrl-C (130) or SIGTERM (143), after which metrics.json keeps what
    was measured and says "interrupted": true, and checkpoint.pt holds what --resume continues from. Under torchrun the
    process group is left at the end, and rank 0 alone reports a divergence or an interruption."""
    script = os.path.basename(sys.modules[main.__module__].__file__)
    code, message = 0, None
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        data = main(parse_args(argv))
        diverged = [run for run, r in (data or {}).get("runs", {}).items() if r.get("diverged")]
        if diverged:
            code, message = 3, f"{len(diverged)} run(s) diverged ({', '.join(diverged)}); metrics.json marks them"
    except KeyboardInterrupt as e:
        code = 143 if isinstance(e, Terminated) else 130
        message = "terminated (SIGTERM)" if code == 143 else "interrupted"
        if e.args:  # recording() names the metrics.json: where the run is kept, and the command that continues it
            folder = os.path.dirname(e.args[0])
            message += (f"; {e.args[0]} keeps every evaluation so far and {folder}/checkpoint.pt the training state. "
                        f"Continue with: python {script} --resume {folder}")
    except (ValueError, OSError, EOFError) as e:
        if os.environ.get("TRACEBACK"):  # a developer's bug can raise these too: TRACEBACK=1 shows where
            raise
        if isinstance(e, OSError) and e.filename is not None and e.strerror:
            e = f"{e.strerror}: {e.filename}"
        print(f"{script}: {e}", file=sys.stderr)  # every rank: the error may be its own
        code = 2
    except RuntimeError as e:  # out of memory: torch's OutOfMemoryError (CUDA) or its CPU allocator's failure
        torch = sys.modules.get("torch")  # imported by every training script, not by report.py
        if not ((torch and isinstance(e, torch.OutOfMemoryError)) or "can't allocate memory" in str(e)):
            raise
        code, message = 2, ("out of memory; lower --batch-size (or the estimator's chunk), or the data's or the "
                            "model's size")
    finally:
        signal.signal(signal.SIGTERM, previous)
        rank = ranks()[0]
        if group := process_group():
            group.destroy_process_group()
    if message and rank == 0:
        print(f"{script}: {message}", file=sys.stderr)
    if code:
        sys.exit(code)


# -----------------------------------------------------------------------------
# threads, device, torchrun


def set_threads(n):
    """torch's intra-op threads for this process; n = 0 means the default policy. The scripts' small matrices make
    torch's threads spin against any other load on the machine (bench.py's shared_cpu_slowdown measures it), so the
    default is one thread per process: run seeds side by side as separate processes to use more cores."""
    import torch

    if n < 0:
        raise ValueError(f"--threads must be >= 0 (0: the default policy), got {n}")
    if n > 4 * (os.cpu_count() or 1):  # far more threads than cores only slows down (and can crash) a process
        raise ValueError(f"--threads {n} is more than 4x the {os.cpu_count()} cores of this machine")
    torch.set_num_threads(n or 1)
    return torch.get_num_threads()


def get_device(name="auto"):
    """'auto' -> cuda when available, else cpu; anything else is passed to torch.device."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was asked for, but no CUDA device is available (try --device cpu)")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):  # mps lacks the float64 the estimator counts in
        raise ValueError(f"--device {name!r} is not a device these scripts run on: use auto, cpu, cuda or "
                         "cuda:<index>")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         "numbered from 0")
    return device


def setup(args):
    """What every script's main does first: the thread policy (--threads), then the device (--device). Under torchrun
    (several processes) it also joins the process group: nccl with one GPU per process (LOCAL_RANK) on CUDA, gloo on
    a CPU; the other ranks' stdout is silenced, so that rank 0 alone prints."""
    import torch

    set_threads(args.threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
        if cuda:  # one GPU per process; never set on a CPU run (gloo has no device to set)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
        if torch.distributed.get_rank() > 0:
            sys.stdout = open(os.devnull, "w")
        if cuda:
            return torch.device("cuda", torch.cuda.current_device())
    return get_device(args.device)


def process_group():
    """torch.distributed once this process has joined a process group (under torchrun), else None: also in a process
    that never imported torch (report.py)."""
    torch = sys.modules.get("torch")
    if torch and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed
    return None


def ranks():
    """(rank, number of processes): (0, 1) outside torchrun."""
    group = process_group()
    return (group.get_rank(), group.get_world_size()) if group else (0, 1)


def all_sum(*values):
    """The sums over ranks of some numbers (floats); themselves outside torchrun."""
    import torch

    rank, world = ranks()
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device="cuda" if torch.distributed.get_backend() == "nccl" else "cpu")
    torch.distributed.all_reduce(t)
    return tuple(t.tolist())


def for_training(model, device, *, compile_model=False):
    """The module training runs through: under torchrun wrapped in DDP (BatchNorm synchronised on GPUs: PyTorch's
    SyncBatchNorm runs on GPUs only, so on a CPU each rank keeps its own batch statistics), and/or compiled.
    Evaluation and sensitivity run `model` itself: they are sharded by hand, not through DDP, and stay eager, since a
    compiled module compiles again for each new batch shape (the authors' ViT's first evaluation on an H100: 24 s
    compiled, 3.8 s eager)."""
    import torch

    if ranks()[1] > 1:
        if device.type == "cuda":
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    return torch.compile(model) if compile_model else model


def seed_all(seed):
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# -----------------------------------------------------------------------------
# files: strict JSON written atomically, run folders


def strict_json(obj):
    """obj with every non-finite float replaced by None, so that the file is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def write_json(path, obj, replace=True):
    """Write obj as strict JSON (NaN and inf as null) atomically: a temp file in the same folder, then rename, so a
    crash leaves the old file. The file gets the permissions of any other new file (0644 under the usual umask).
    replace=False refuses to replace an existing file (FileExistsError)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(strict_json(obj), fh, indent=1, allow_nan=False)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path exists
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def error_line(e):
    """'OSError: <its message's first line>', or the type alone for an error without a message (an EOFError, say)."""
    return ": ".join([type(e).__name__] + str(e).splitlines()[:1])


def torchvision_dataset(cls, root, files, **kw):
    """cls(root, download=True, **kw): a torchvision dataset, downloaded when missing. Offline, a FileNotFoundError
    names the files to provide (`files`), and a --data-dir that this call made (a mistyped one, say) is removed again
    while it holds no file; a file that is present but damaged gets a ValueError naming it."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise ValueError(f"--data-dir {root} is a file, not a folder")
    made = not os.path.exists(root)
    try:
        with one_at_a_time(root):  # seeds started side by side: the first extracts, the others wait, then read
            return cls(root=root, download=True, **kw)
    except Exception as e:  # offline, or a corrupt file: one clear message instead of a traceback
        if made and all(names in ([], [".lock"]) for _, _, names in os.walk(root)):  # only our lock and empty folders
            shutil.rmtree(root, ignore_errors=True)
        bad = corrupt_file(cls, root)
        if bad:
            raise ValueError(f"{bad[0]} is present but unreadable: {bad[1]}. Replace it with a good copy, or delete "
                             "it (torchvision then extracts or downloads it again)") from None
        raise FileNotFoundError(f"cannot load {cls.__name__} from {os.path.abspath(root)} ({error_line(e)}). Without "
                                f"a network, put {files} under that folder (or pass --data-dir), and torchvision will "
                                "use them") from None


@contextlib.contextmanager
def one_at_a_time(folder):
    """An exclusive lock on folder/.lock while the block runs. torchvision extracts a dataset's archives next to
    themselves on its first use, and a second process that reads them meanwhile finds them half written. Where the
    lock cannot be had (a folder that is not writable, a system without fcntl) the block runs unlocked."""
    try:
        import fcntl  # POSIX
        os.makedirs(folder, exist_ok=True)
        fh = open(os.path.join(folder, ".lock"), "a")
    except (ImportError, OSError):
        fh = None
    if fh is None:
        yield
        return
    with fh:  # closing the file releases the lock
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def corrupt_file(cls, root):
    """(path, problem) of the first file of a torchvision dataset that is present but damaged, else None: a wrong
    MD5 checksum (truncated or altered download), or an extracted MNIST-format file that cannot be parsed."""
    from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor
    from torchvision.datasets.utils import check_integrity

    if hasattr(cls, "resources"):  # MNIST, Fashion-MNIST: raw/<file>.gz and the extracted raw/<file>
        raw = os.path.join(root, cls.__name__, "raw")
        checks = [(os.path.join(raw, f), md5) for f, md5 in cls.resources]
        for gz, _ in checks:
            plain = gz[:-3]
            if os.path.exists(plain):
                try:
                    read_sn3_pascalvincent_tensor(plain)
                except Exception as e:
                    return plain, "not a complete IDX file" + (f" ({e})" if str(e) else "")
    elif hasattr(cls, "split_list"):  # SVHN
        checks = [(os.path.join(root, f), md5) for _, f, md5 in cls.split_list.values()]
    else:  # CIFAR-10
        folder = os.path.join(root, cls.base_folder)
        checks = [(os.path.join(root, cls.filename), cls.tgz_md5)]
        checks += [(os.path.join(folder, f), md5) for f, md5 in cls.train_list + cls.test_list]
    for path, md5 in checks:
        if os.path.exists(path) and not check_integrity(path, md5):
            return path, "its MD5 checksum is not the published one (a truncated or altered file)"
    return None


def load_results(path, script=None):
    """Read a metrics.json (or the folder holding it); a missing or corrupt file, or one written by another script
    than `script`, is a ValueError that says so."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.json")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"no results file at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid metrics.json ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
        raise ValueError(f"{path} is not a metrics.json written by this repository (no 'runs' mapping)")
    for run, r in data["runs"].items():  # a hand-edited file: say which run lacks what, not a KeyError later
        if not isinstance(r, dict) or not isinstance(r.get("history"), list) or not isinstance(r.get("final"), dict):
            raise ValueError(f"{path}: run {run!r} needs a 'history' list and a 'final' mapping")
    if script is not None and data.get("script", script) != script:
        raise ValueError(f"{path} was written by {data['script']}.py, not {script}.py")
    return data


def new_run_dir(script, run_name, out_dir="out"):
    """out/<script>/<run_name>/, made fresh: an existing folder is never reused, a -2, -3, ... suffix is added."""
    base = os.path.join(out_dir, script, run_name)
    path, k = base, 1
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            k += 1
            path = f"{base}-{k}"


def environment(device):
    import torch

    commit, dirty = git_state(os.path.dirname(os.path.abspath(__file__)))
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    # CPU training is bit-for-bit repeatable on one machine, not across processors (their kernels sum in other orders)
    return {"torch": torch.__version__, "device": name, "cpu": cpu_model(), "threads": torch.get_num_threads(),
            "git_commit": commit, "git_dirty": dirty}


def git_state(folder):
    """(commit, dirty) of the git checkout holding `folder`: dirty when a tracked file differs from that commit, so a
    run of edited code never passes for a run of the commit; (None, None) outside git."""
    try:
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, timeout=5, cwd=folder)
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        return head.stdout.strip(), bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def cpu_model():
    """The processor's name (Linux's /proc/cpuinfo; platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


class Run(NamedTuple):
    """One trained model of a run: metrics.json keys it as '<model>/seed<k>' and keeps both as fields beside its
    history and final numbers. `model` is the script's label (with its variant: 'vit', 'roberta-relu', 'vit-reg')."""
    model: str
    seed: int

    def __str__(self):
        return f"{self.model}/seed{self.seed}"


# -----------------------------------------------------------------------------
# the state of a training run, for --resume


def rng_state(generators=()):
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "generators": [g.get_state() for g in generators]}


def set_rng_state(state, generators=()):
    """The states of rng_state() put back. torch takes every generator's state as a CPU tensor, a CUDA generator's
    too, while a checkpoint loaded onto a GPU (map_location) holds them there: a resume on a GPU once failed so."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    for g, s in zip(generators, state["generators"]):
        g.set_state(s.cpu())


def snapshot(step, model, opt, generators=(), **extra):
    """A copy of the training state after `step` steps of the loop (its own unit): model, optimizer, every random
    generator that training draws from (Python, NumPy, torch's, CUDA's and the given ones), and `extra` tensors."""
    return {"step": step, "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(opt.state_dict()), "rng": rng_state(generators), **extra}


def restore(snap, model, opt, generators=()):
    """Put a snapshot back: training then continues exactly as the interrupted run would have. A snapshot that does
    not fit the model or optimizer (written with other flags), or whose random generators ran on another kind of device
    (a GPU run resumed with --device cpu, or the reverse), is a ValueError that says so."""
    first = lambda e: str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # noqa: E731
    try:
        model.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        rng = snap["rng"]
    except (RuntimeError, ValueError, KeyError, IndexError) as e:
        raise ValueError(f"checkpoint.pt does not fit this run's model and optimizer ({first(e)})") from None
    try:
        set_rng_state(rng, generators)
    except RuntimeError as e:  # a CPU generator's state and a CUDA one's differ in kind and size
        raise ValueError(f"checkpoint.pt holds the random generators of a run on another kind of device ({first(e)}); "
                         "resume it with the --device it ran on") from None
    return snap["step"]


class Progress:
    """Progress lines of one training run, printed by a background thread every `every` seconds of wall time
    (--progress-every; 0: none on a timer) whatever the evaluation schedule: the step, the latest training loss, the
    time per step, and the time to the next evaluation and to the end. The loop calls tick() at the top of every
    iteration; the time of an iteration that evaluates, less one training step's, is an evaluation's. Once a few steps
    (and the evaluation before them) are timed, one line gives the estimated time of the run on this machine and, where
    that is over an hour on a CPU, `hint`: a command of CPU size. Evaluations are at multiples of `eval_every` steps and
    at `total`. guess: (seconds per step, seconds per evaluation) from a timed forward pass (time_forward), shown until
    measured. early: the run may stop before `total` (--until-acc, --patience), so the estimate is an upper bound."""

    def __init__(self, run, start, total, eval_every, *, every, per_epoch=None, hint=None, cpu=True, guess=None,
                 early=False):
        self.run, self.start, self.total, self.eval_every = str(run), start, total, eval_every
        self.per_epoch, self.hint, self.cpu, self.guess, self.early = per_epoch, hint, cpu, guess, early
        self.steps, self.evals = [], []  # the durations of training iterations and of evaluations, in seconds
        self.before = {}  # {training, evaluations}: seconds of the invocations before a --resume (from the checkpoint)
        self.last, self.loss, self.told = None, None, False  # last: (time, step, evaluating) of the latest tick
        self.done = threading.Event()
        if guess:  # at once, before the first (maybe long) evaluation
            left = self.guessed_left(start)
            self.tell(f"about {duration(left)} (guessed from a timed forward pass; timed after a few steps)", left)
        self.thread = threading.Thread(target=self._print_every, args=(every,), daemon=True) if every else None
        if self.thread:
            self.thread.start()

    def tick(self, step, evaluating, loss=None):
        now = time.monotonic()
        if self.last is not None:
            dt = now - self.last[0]
            self.evals.append(dt) if self.last[2] else self.steps.append(dt)
        self.last, self.loss = (now, step, evaluating), loss
        if not self.told and len(self.steps) >= 3 and (self.evals or self.start % self.eval_every):
            self.told = True
            left = self.seconds_left(step)
            self.tell(f"{duration(left)} ({self.total - step} steps at {self.step_time() * 1e3:.0f} ms, "
                      f"{self.evals_left(step)} evaluations at {duration(self.eval_time())}, then the final "
                      "measurements)", left)

    def tell(self, estimate, seconds):
        print(f"{self.run} | estimated time of this run on this machine: {'at most ' if self.early else ''}{estimate}")
        if self.hint and self.cpu and seconds > 3600:
            print(f"{self.run} | over an hour on a CPU; {self.hint}")

    def step_time(self):
        return float(np.median(self.steps)) if self.steps else math.nan  # the median: robust to a warm-up step

    def eval_time(self):  # an evaluating iteration holds one training step too (but the last)
        return max(float(np.mean(self.evals)) - (self.step_time() if self.steps else 0), 0) if self.evals else 0

    def evals_left(self, step):  # evaluations after `step`: at multiples of eval_every, and the last step
        return self.total // self.eval_every - step // self.eval_every + (self.total % self.eval_every > 0)

    def seconds_left(self, step):
        return (self.total - step) * self.step_time() + self.evals_left(step) * self.eval_time()

    def guessed_left(self, step):  # by the guess, from the top of `step` (its evaluation included)
        return (self.total - step) * self.guess[0] + self.evals_left(step - 1) * self.guess[1]

    def line(self):
        now, step, evaluating = self.last
        where = f"{self.run} | step {step}/{self.total}" + (
            f" (epoch {step / self.per_epoch:.1f})" if self.per_epoch else "")
        if evaluating:
            what = "final evaluation and measurements" if step == self.total else "evaluating"
            line = f"{where} | {what} for {duration(time.monotonic() - now)}"
            if self.evals:
                return line + f" | the last evaluation took {duration(self.eval_time())}"
            if self.guess:  # nothing timed yet: the guess of a timed forward pass
                return line + f" | about {duration(self.guess[1])} each, end in about " \
                    f"{duration(self.guessed_left(step))} (guessed from a timed forward pass)"
            return line
        loss = f" | loss {self.loss.item():.4f}" if self.loss is not None else ""
        if not self.steps:
            return f"{where}{loss} | timing the first steps"
        to_eval = min((step // self.eval_every + 1) * self.eval_every, self.total) - step
        return (f"{where}{loss} | {self.step_time() * 1e3:.0f} ms/step | next evaluation in "
                f"{duration(to_eval * self.step_time())} | end in {duration(self.seconds_left(step))}")

    def _print_every(self, every):
        while not self.done.wait(every):
            if self.last is not None:
                print(self.line(), flush=True)

    def seconds(self):
        """{training, evaluations, final}: seconds in training steps, in evaluating iterations, and since the last
        tick (the final measurements), over the whole run: a resumed run adds the time of the invocations before, up to
        its checkpoint (the steps redone after it count once). What a protocol's time is spent on."""
        final = time.monotonic() - self.last[0] if self.last else 0.0
        return {"training": self.before.get("training", 0.0) + sum(self.steps),
                "evaluations": self.before.get("evaluations", 0.0) + sum(self.evals), "final": final}

    def end_early(self):
        """The run stops at the latest tick (--until-acc, --patience): the lines now say final measurements."""
        self.total = self.last[1]

    def stop(self):
        """Ends the printing thread, and waits for it: one still waking when the process exits can kill it (exit 134,
        'terminate called without an active exception': 4 smoke-sized runs in 64 under load, in torch 2.14)."""
        self.done.set()
        if self.thread:
            self.thread.join()


def time_forward(model, batch):
    """Seconds per input of model(batch) in eval mode, the second of two calls (the first warms up); it draws no
    random numbers, so training after it is unchanged. Progress's guess before any step is timed."""
    import torch

    model.eval()
    with torch.no_grad():
        model(batch)
        t = time.perf_counter()
        model(batch)
        return (time.perf_counter() - t) / len(batch)


def duration(seconds):
    """'45 s', '12.5 min', '3.2 h'."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 0.005:  # not '4.7e-06 s'
        return "0 s"
    if seconds < 120:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


# the flags that say what a run's numbers were measured under (noise, sigma, mask, noise seed, images): kept in each
# run's record, since a merged folder's args are those of its first source
MEASURED_UNDER = ["sigma", "mask", "sens_seed", "n_sens", "reps", "sens_positions", "sens_patch", "align",
                  "flat_patches", "dataset", "task", "split", "data_seed", "n_train", "n_test"]


def ended(record, key=None):
    """Whether a run's record in metrics.json has its final numbers (final[key] when given) or diverged: a run that
    has neither is still training, or was stopped."""
    return bool(record.get("diverged") or (key in record.get("final", {}) if key else record.get("final")))


DIVERGED_FACTOR = 100  # a training loss this many times its initial value (at least 1) means the run diverged


def start_run(script, args, default_name, device):
    """A fresh out/<script>/<run> folder and its Results, after the data are in place (so a missing dataset leaves no
    empty run folder); with --resume, the run folder given, its metrics and checkpoint. Under torchrun rank 0 alone
    creates the folder and writes in it, and every rank gets its path."""
    import torch

    rank, world = ranks()
    folder = None
    if rank == 0:
        folder = args.resume or new_run_dir(script, args.run_name or default_name, args.out_dir)
    if world > 1:
        box = [folder]
        torch.distributed.broadcast_object_list(box, src=0)
        folder = box[0]
    results = Results(folder, script, vars(args), device, write=rank == 0, resume=bool(args.resume))
    threads = torch.get_num_threads()
    point = results.resume_point
    what = f"writing {folder}" if not args.resume else f"resuming {folder} " + (
        f"from {point[0]}'s checkpoint at {point[1]['step']}" if point else "(no checkpoint: unfinished runs restart)")
    print(f"{what} | device {device} | {threads} thread"
          f"{'s' if threads > 1 else ''}" + (f" | {world} processes" if world > 1 else ""))
    return folder, results


class Results:
    """The metrics.json every script writes, saved atomically after every change so Ctrl-C loses nothing:
    {"script": ..., "args": {...}, "env": {...}, "runs": {"<model>/seed<k>": {"history": [{...}], "final": {...}}}}
    A run whose loss became non-finite holds "diverged": {"step": ..., "loss": null}; an interrupted invocation
    holds "interrupted": true. Beside it, checkpoint.pt holds the latest training state (see checkpoint()).
    write=False (torchrun ranks other than 0) keeps everything in memory only; resume=True reads the folder's
    metrics.json and checkpoint.pt and continues them."""

    def __init__(self, run_dir, script, args, device, write=True, resume=False):
        import torch

        self.folder, self.write = run_dir, write
        self.path = os.path.join(run_dir, "metrics.json")
        self.first_loss = {}  # run -> its first logged training loss, for diverged()
        self.latest = None  # (run, snapshot) of the latest training state, written by Ctrl-C
        self.resume_point = None
        self.device, self.current = torch.device(device), None  # current: the Progress of the run training now
        self.ended = None  # the Progress of the run whose training ended last
        if resume:
            self.data = load_results(self.path, script)
            self.data.pop("interrupted", None)
            self.data["args"] = dict(args)  # the flags it goes on with: the saved ones and the defaults of new flags
            self.data.setdefault("resumed", []).append(environment(device))
            ckpt = os.path.join(run_dir, "checkpoint.pt")
            if os.path.exists(ckpt):
                try:
                    saved = torch.load(ckpt, map_location=device, weights_only=False)
                    self.resume_point = saved["run"], saved["state"]
                except (RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as e:
                    raise ValueError(f"{ckpt} is not a readable checkpoint ({e})") from None
                if self.resume_point[0] not in self.data["runs"]:  # copied from another folder: never ignored silently
                    raise ValueError(f"{ckpt} holds run {self.resume_point[0]}, which this folder's metrics.json does "
                                     "not have: it is another run's checkpoint")
        else:
            self.data = {"script": script, "args": dict(args), "env": environment(device), "runs": {}}
        self.save()

    def _run(self, run):
        fields = run._asdict() if isinstance(run, Run) else {}
        return self.data["runs"].setdefault(str(run), {**fields, "history": [], "final": {}})

    def log(self, run, row):
        self._run(run)["history"].append(row)
        self.save()

    def final(self, run, values):
        record = self._run(run)
        record["final"].update(values)
        args = self.data["args"]  # what its numbers were measured under, kept beside them (a merge keeps it)
        record["measured_under"] = {k: args[k] for k in MEASURED_UNDER if k in args}
        timer = self.current or self.ended  # a second final() of a run (robustness.py's measurements) counts too
        if timer is not None and timer.run == str(run):  # where this invocation's time went
            record["seconds"] = timer.seconds()
        self.save()
        self.stop_progress()

    def progress(self, run, start, total, eval_every, **kw):
        """A Progress for `run`'s training loop (see Progress), printing every --progress-every seconds until the
        run's final numbers are in, another run starts, or recording() ends."""
        self.stop_progress()
        every = self.data["args"].get("progress_every", 20) if self.write else 0  # torchrun: rank 0 alone prints
        self.current = Progress(run, start, total, eval_every, every=every, cpu=self.device.type == "cpu", **kw)
        if self.resume_point is not None and self.resume_point[0] == str(run):  # its time before the checkpoint
            self.current.before = self.resume_point[1].get("seconds", {})  # (absent in older checkpoints)
        return self.current

    def stop_progress(self):
        if self.current is not None:
            self.current.stop()
            self.ended, self.current = self.current, None

    def finished(self, run, key=None):
        """Whether a resumed run already has its final numbers (final[key] when given) or diverged: it is not trained
        again."""
        return ended(self.data["runs"].get(str(run), {}), key)

    def resume(self, run, key):
        """The checkpoint's snapshot if it belongs to `run` (else None, and the run starts afresh). The run's history
        rows from that step on (`key`: the history's loop unit) are dropped: they are measured again."""
        if self.resume_point is None or self.resume_point[0] != str(run):
            self._run(run)["history"] = []
            return None
        snap = self.resume_point[1]
        history = self._run(run)["history"] = [h for h in self._run(run)["history"] if h[key] < snap["step"]]
        if history:  # the divergence limit keeps referring to the run's first loss
            self.first_loss[str(run)] = history[0]["train_loss"]
        print(f"{run}: resumed after {key} {snap['step']}")
        return snap

    def checkpoint(self, run, step, evaluating, save_every, model, opt, generators=(), **extra):
        """Called at the top of every step of a training loop: at an evaluation, or every save_every steps, keep a
        snapshot of the state after `step` steps as the latest (Ctrl-C inside recording() writes it), and every
        save_every steps also write it to checkpoint.pt now (atomically: a temp file, renamed)."""
        saving = bool(save_every) and step % save_every == 0
        if evaluating or saving:
            now = self.current is not None and self.current.run == str(run)  # its time so far, for a resumed run
            seconds = {k: v for k, v in self.current.seconds().items() if k != "final"} if now else {}
            self.latest = (run, snapshot(step, model, opt, generators, seconds=seconds, **extra))
        if saving:
            self.write_checkpoint()

    def write_checkpoint(self):
        import torch

        if self.latest is None or not self.write:
            return
        run, state = self.latest
        if not self._run(run)["history"]:  # metrics.json lists the run before its first checkpoint exists (a run with
            self.save()  # rows is on disk already), so a kill -9 between the two never leaves one --resume refuses
        path = os.path.join(self.folder, "checkpoint.pt")
        try:
            torch.save({"run": str(run), "state": state}, path + ".tmp")
            os.replace(path + ".tmp", path)
        except (OSError, RuntimeError) as e:  # a full disk or a file-size cap: say which file, leave no .tmp
            if os.path.exists(path + ".tmp"):
                os.unlink(path + ".tmp")
            raise OSError(f"could not write the checkpoint {path} ({e})") from None

    def diverged(self, run, step, loss, unit="step"):
        """Whether the training `loss` (a float) shows the run diverged: non-finite, or above DIVERGED_FACTOR times
        its first value in this run (the loss at initialisation; at least 1), which a bounded model such as an LSTM
        reaches instead of inf. If so the run is marked diverged at `step` in metrics.json and one line says so.
        Training loops call this at every logged step and after the last one, before measuring anything, so that no
        sensitivity is ever reported for a diverged model."""
        first = self.first_loss.setdefault(str(run), loss)
        limit = DIVERGED_FACTOR * max(first, 1.0) if math.isfinite(first) else math.inf
        if math.isfinite(loss) and loss <= limit:
            return False
        self._run(run)["diverged"] = {"step": step, "loss": loss}
        self.save()
        why = "not finite" if not math.isfinite(loss) else f"over {DIVERGED_FACTOR}x the initial {first:.3g}"
        if self.write:
            print(f"{run} diverged at {unit} {step} (training loss {loss:.4g}: {why}): stopped, no sensitivity "
                  "reported; lower --lr", file=sys.stderr)
        return True

    @contextlib.contextmanager
    def recording(self):
        """Ctrl-C or SIGTERM inside marks metrics.json "interrupted": true and writes the latest training state to
        checkpoint.pt before it propagates (cli() then exits 130 or 143); so does an error (a file found damaged
        after training, say), without the mark. `--resume <folder>` continues from there."""
        try:
            yield self
        except KeyboardInterrupt as e:
            self.stop_progress()
            self.data["interrupted"] = True
            self.save()
            self.write_checkpoint()
            raise type(e)(self.path) from None
        except Exception:
            self.write_checkpoint()
            raise
        finally:
            self.stop_progress()

    def save(self):
        if self.write:
            write_json(self.path, self.data)
