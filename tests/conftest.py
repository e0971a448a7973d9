"""What several test files share: stopping a run in the middle of its training."""

import os
import signal

import torch


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
