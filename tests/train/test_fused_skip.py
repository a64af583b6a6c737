"""The non-finite skip inside torch's fused SGD / AdamW (found_inf, as AMP's grad scaler) is today's skip by flat
copies: parameters and optimizer state bit-identical after every step of a run with skipped and applied steps
(a skipped first step included), and it adds no copy of the parameters (issue 37)."""

import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from eigtrain.engine.base import flat_guarded_step, guarded_step

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, fused=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1, fused=True),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 3, 1)).to(memory_format=torch.channels_last)


def _backward(model, scale: float, seed: int) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    x = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(seed))
    loss = model(x.contiguous(memory_format=torch.channels_last)).square().mean() * scale
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    return torch.isfinite(loss) & torch.stack([g.isfinite().all() for g in grads]).all()


def _snapshot(model, optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters() if p in optimizer.state]
    return params, state


def _same(a, b) -> bool:
    (pa, sa), (pb, sb) = a, b
    return (
        all(torch.equal(x, y) for x, y in zip(pa, pb))
        and len(sa) == len(sb)
        and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(sa, sb))
    )


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_skip_is_todays_skip_bit_for_bit(name):
    fused_model = _model()
    flat_model = copy.deepcopy(fused_model)
    fused_opt, flat_opt = OPTIMIZERS[name](fused_model.parameters()), OPTIMIZERS[name](flat_model.parameters())
    for i, scale in enumerate([float("nan"), 1.0, 1.0, float("inf"), 1.0, float("nan"), 1.0]):
        before = _snapshot(fused_model, fused_opt)
        ok = _backward(fused_model, scale, i)
        assert bool(ok) == (scale == 1.0) and bool(_backward(flat_model, scale, i)) == bool(ok)
        guarded_step(fused_opt, ok)  # fused: found_inf inside the kernel
        flat_guarded_step(flat_opt, ok)  # today's: flat copies, selected after the step
        after = _snapshot(fused_model, fused_opt)
        assert _same(after, _snapshot(flat_model, flat_opt)), (name, i)
        if not bool(ok) and i:
            assert _same(before, after)  # a skipped step changes nothing


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_skip_copies_nothing(name):
    """The guard around a fused step is the found_inf flag alone: no cat, no where, no copy of the parameters."""
    model = _model()
    opt = OPTIMIZERS[name](model.parameters())
    guarded_step(opt, _backward(model, 1.0, 0))  # the state exists
    ok = _backward(model, 1.0, 1)
    with _CountOps() as guarded:
        guarded_step(opt, ok)
    _backward(model, 1.0, 2)
    with _CountOps() as plain:
        opt.step()
    extra = [op for op in guarded.ops if op not in plain.ops or guarded.ops.count(op) > plain.ops.count(op)]
    assert len(guarded.ops) - len(plain.ops) <= 3, extra
    assert not any(op.startswith(("cat", "where", "_foreach_copy")) for op in extra), extra
