"""Two gloo processes: the loss and the DDP-averaged parameter gradients equal the single-process values
on the concatenated batch, for every family, nested and not."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from eigtrain.objectives import build_objective
from tests.support.runs import free_port

IN_DIM, DIM, LOCAL_BATCH, WORLD = 5, 6, 8, 2

CASES = [
    (name, kwargs, nesting)
    for name, kwargs in [
        ("lora", {}),
        ("lora", {"center": True, "constant_mode": "none"}),
        ("scl", {"normalize": True}),
        ("lora", {"constant_mode": "none"}),  # "lora" above holds the constant outside the prefixes (the default)
        ("scl", {"normalize": "prefix"}),  # (tests/objectives/test_reduction_choice.py runs these through every route)
        ("rq", {}),
        ("rq", {"pairs": True}),
        ("rq_direct", {}),
        ("vicreg", {}),
        ("vicreg_paper", {}),
    ]
    for nesting in ("none", "joint", "sequential")
    if not (kwargs.get("normalize") and nesting == "sequential")  # rejected: the norm is no stop-gradient
]


def _model(pairs: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    encoders = torch.nn.ModuleList([torch.nn.Linear(IN_DIM, DIM) for _ in range(2 if pairs else 1)])
    return encoders.double()


def _data():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD * LOCAL_BATCH, IN_DIM, generator=gen, dtype=torch.float64)
    a = x + 0.3 * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return x, a


class _Pair(torch.nn.Module):
    """Forward both inputs so DDP sees every parameter used in one call."""

    def __init__(self, encoders):
        super().__init__()
        self.encoders = encoders

    def forward(self, x, a):
        return self.encoders[0](x), self.encoders[-1](a)


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, a = _data()
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    results = []
    for name, kwargs, nesting in CASES:
        objective = build_objective(name, DIM, nesting=nesting, **kwargs)
        encoders = _model(objective.pairs)
        ddp = DDP(_Pair(encoders))
        z1, z2 = ddp(x[rows], a[rows])
        loss, _ = objective(z1, z2)
        loss.backward()
        results.append((loss.detach(), [p.grad.detach().clone() for p in encoders.parameters()]))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_process_loss_and_ddp_gradients_equal_single_process(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    x, a = _data()
    for i, (name, kwargs, nesting) in enumerate(CASES):
        objective = build_objective(name, DIM, nesting=nesting, distributed=False, **kwargs)
        encoders = _model(objective.pairs)
        loss, _ = objective(encoders[0](x), encoders[-1](a))
        loss.backward()
        grads = [p.grad for p in encoders.parameters()]
        for rank_loss, rank_grads in (r[i] for r in ranks):
            case = f"{name} {kwargs} nesting={nesting}"
            torch.testing.assert_close(rank_loss, loss.detach(), rtol=1e-10, atol=1e-12, msg=case)
            for got, want in zip(rank_grads, grads):
                torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=case)
