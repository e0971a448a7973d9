"""What several test files share: stopping a run in the middle of its training; the losses its divergence checks see;
what its loop tells its progress and checkpoints; its optimizer's steps; torch's thread count kept; a spy on a
function's keyword arguments; a module's prints; a synthetic run's final record; the figures report.py draws. And the
order the suite runs in."""

import os
import signal

import pytest
import torch

import runs


def stop_at_backward(monkeypatch, n, how="ctrl-c"):
    """The n-th call of backward() (a training step) raises KeyboardInterrupt as Ctrl-C does (how="ctrl-c"), or
    sends this process SIGTERM as `kill` does (how="sigterm"); monkeypatch.undo() puts backward back."""
    real, calls = torch.Tensor.backward, []

    def backward(self, *a, **k):
        calls.append(1)
        if len(calls) == n:
            if how == "ctrl-c":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "backward", backward)


@pytest.fixture
def kept_threads():
    """torch's thread count as it was before the test, put back after it (for code that sets its own)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def divergence_checks(monkeypatch):
    """The training losses every Results.diverged call is given from now on, in order (a list that fills as runs
    go)."""
    losses, real = [], runs.Results.diverged
    monkeypatch.setattr(runs.Results, "diverged", lambda self, run, step, loss, *a: losses.append(loss) or
                        real(self, run, step, loss, *a))
    return losses


def loop_calls(monkeypatch):
    """What a training loop tells its progress lines and its checkpoints from now on: (start, total, eval_every) for
    each run's progress, then at the top of each step (step, evaluating) for each tick and (step, evaluating,
    save_every) for each checkpoint call, in lists that fill as runs go. The progress lines' estimates, the times
    (report.py --times) and the snapshots rest on these, which no reported number shows."""
    calls = {"progress": [], "tick": [], "checkpoint": []}
    progress, tick, checkpoint = runs.Results.progress, runs.Progress.tick, runs.Results.checkpoint

    def made(self, run, start, total, eval_every, **kw):
        calls["progress"].append((start, total, eval_every))
        return progress(self, run, start, total, eval_every, **kw)

    def ticked(self, step, evaluating, loss=None):
        calls["tick"].append((step, evaluating))
        return tick(self, step, evaluating, loss)

    def checkpointed(self, run, step, evaluating, save_every, *a, **kw):
        calls["checkpoint"].append((step, evaluating, save_every))
        return checkpoint(self, run, step, evaluating, save_every, *a, **kw)
    monkeypatch.setattr(runs.Results, "progress", made)
    monkeypatch.setattr(runs.Progress, "tick", ticked)
    monkeypatch.setattr(runs.Results, "checkpoint", checkpointed)
    return calls


def optimizer_steps(monkeypatch, optimizer):
    """The steps every `optimizer` (a torch.optim class) takes from now on, counted in a list that fills as runs
    go; monkeypatch.undo() stops the count."""
    steps, real = [], optimizer.step
    monkeypatch.setattr(optimizer, "step", lambda self, *a, **k: steps.append(1) or real(self, *a, **k))
    return steps


def spy(made, key, make):
    """`make` itself, with the keyword arguments of its last call kept in made[key]."""
    def called(*a, **kw):
        made[key] = kw
        return make(*a, **kw)
    return called


def forward_sizes(model):
    """The batch size of every forward of `model` from now on, in a list that fills: how a test sees how many inputs
    an evaluation sends at a time, which leaves its numbers unchanged."""
    sizes = []
    model.register_forward_hook(lambda module, inputs, out: sizes.append(len(inputs[0])))
    return sizes


def printing(monkeypatch, module):
    """Every call of print in `module` from now on, as (args, keyword arguments), in a list that fills; each still
    prints. How a test sees `flush=`, which the PYTHONUNBUFFERED of a developer's shell would hide."""
    calls = []
    monkeypatch.setattr(module, "print", lambda *a, **kw: calls.append((a, kw)) or print(*a, **kw), raising=False)
    return calls


def synthetic_final(ood, sens_sparse, sens_frequent):
    """A synthetic.py run's final record: OOD accuracy ood (0: it learned the sparse feature, 1: the frequent one)
    and the two candidate functions' sensitivities; the rest fixed."""
    return {"ood_acc": ood, "test_acc": 1.0, "align_sparse": 0.9, "align_frequent": 0.1, "sens": 0.0,
            "sens_sparse_fn": sens_sparse, "sens_frequent_fn": sens_frequent}


@pytest.fixture
def drawn(monkeypatch):
    """The figures report.py draws during a test, kept as matplotlib objects to read the numbers from instead of
    written; closed after the test."""
    import report

    figures = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.append(fig) or path)
    yield figures
    for fig in figures:
        report.pyplot().close(fig)


def pytest_collection_modifyitems(items):
    """Tests marked `first` (`bash reproduce.sh smoke`: about half of the whole suite's time) run first, so under
    `pytest -n 2` (the README's command) one process runs it while the other takes every other test (--dist
    worksteal, pyproject.toml)."""
    items.sort(key=lambda item: item.get_closest_marker("first") is None)
