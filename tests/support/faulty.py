"""The real objective with faults injected on chosen calls (NaN loss, NaN gradient, SIGUSR1), for the trainer's
non-finite guard and stop-signal tests; also imported by the programs those tests run in subprocesses."""

import os
import signal

from torch import nn

import eigtrain.train.command as train_module


class Faulty(nn.Module):
    """The real objective, with a NaN loss, a NaN gradient (finite loss) or a SIGUSR1 on the given calls."""

    def __init__(self, inner, nan_loss_calls=(), nan_grad_calls=(), signal_calls=()):
        super().__init__()
        self.inner, self.split_batch, self.calls = inner, inner.split_batch, 0
        self.nan_loss_calls, self.nan_grad_calls, self.signal_calls = nan_loss_calls, nan_grad_calls, signal_calls

    def forward(self, z1, z2):
        self.calls += 1
        if self.calls in self.signal_calls:
            os.kill(os.getpid(), signal.SIGUSR1)
        if self.calls in self.nan_grad_calls:
            z1.register_hook(lambda g: g * float("nan"))
        loss, terms = self.inner(z1, z2)
        return (loss * float("nan") if self.calls in self.nan_loss_calls else loss), terms


def faulty_objectives(monkeypatch, **faults):
    build = train_module.build_objective
    monkeypatch.setattr(train_module, "build_objective", lambda *a, **k: Faulty(build(*a, **k), **faults))
