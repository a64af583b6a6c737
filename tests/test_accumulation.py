"""Gradient accumulation is exact: accumulation 1 and 4 give the same global-batch loss and the same gradients,
for every objective family (two gloo processes, float64), and BatchNorm statistics move once per micro-batch."""

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eigtrain.engine import chunks
from eigtrain.engine.base import LossFn, accumulated_backward
from eigtrain.engine.ddp import DDPEngine
from eigtrain.objectives import build_objective

IN_DIM, DIM, LOCAL_BATCH, WORLD, ACCUM = 5, 6, 16, 2, 4
SGD = {"name": "sgd", "lr": 1.0, "momentum": 0.0, "weight_decay": 0.0}  # lr 1: the update is minus the gradient

CASES = [
    ("lora", {}, "none"),
    ("lora", {"center": True}, "joint"),
    ("scl", {"normalize": "full"}, "joint"),
    ("scl", {"normalize": "prefix"}, "joint"),
    ("scl", {}, "sequential"),
    ("rq", {}, "joint"),
    ("rq", {"pairs": True, "center": True}, "none"),
    ("rq_direct", {}, "sequential"),
    ("vicreg", {}, "joint"),
    ("vicreg_paper", {}, "none"),
]


class Encoders(torch.nn.Module):
    """One encoder on two views, or two encoders on pairs (x, a); a GELU MLP (no BatchNorm: exact in float64)."""

    def __init__(self, pairs: bool):
        super().__init__()
        torch.manual_seed(0)
        make = lambda: torch.nn.Sequential(torch.nn.Linear(IN_DIM, 8), torch.nn.GELU(), torch.nn.Linear(8, DIM))
        self.phi = make()
        self.psi = make() if pairs else None

    def forward(self, x, a=None):
        return self.phi(x) if a is None else (self.phi(x), self.psi(a))


def loss_fn(objective) -> LossFn:
    def encode(module, micro):
        x, a = micro
        return module(x, a) if objective.pairs else module(torch.cat([x, a])).chunk(2)

    return LossFn(encode, objective)


def data(rank: int):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD * LOCAL_BATCH, IN_DIM, generator=gen, dtype=torch.float64)
    a = x + 0.3 * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    return x[rows], a[rows]


def step(name, kwargs, nesting, accum, rank):
    """One engine step; returns (loss, eigenvalues, update = -gradient per parameter)."""
    objective = build_objective(name, DIM, nesting=nesting, **kwargs)
    model = Encoders(objective.pairs).double()
    engine = DDPEngine(model, SGD, device=torch.device("cpu"), precision="fp32")
    before = [p.detach().clone() for p in model.parameters()]
    x, a = data(rank)
    result = engine.train_step(list(zip(chunks(x, accum), chunks(a, accum))), loss_fn(objective), lr=1.0)
    assert bool(result.applied)
    return result.loss, result.terms["eigenvalues"], [p.detach() - b for p, b in zip(model.parameters(), before)]


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = [[step(*case, accum, rank) for accum in (1, ACCUM)] for case in CASES]
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_accumulation_1_and_4_give_the_same_loss_and_gradients_on_two_processes(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for (name, kwargs, nesting), (one, four) in zip(CASES, results):
            case = f"rank {rank}: {name} {kwargs} nesting={nesting}"
            torch.testing.assert_close(four[0], one[0], rtol=1e-12, atol=1e-12, msg=case)  # loss
            torch.testing.assert_close(four[1], one[1], rtol=1e-12, atol=1e-12, msg=case)  # eigenvalue estimates
            assert max(w.abs().max() for w in one[2]) > 1e-3, case  # the update is not trivially zero
            for got, want in zip(four[2], one[2]):
                torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=case)


def _grads(objective, module, micro_batches, fn):
    module.zero_grad()
    fn(module, micro_batches)
    return [p.grad.clone() for p in module.parameters()]


def test_objective_per_micro_batch_would_not_be_exact():
    """The test above can fail: averaging the objective over micro-batches (the old accumulation) changes
    VICReg's gradient, while the accumulated backward matches the whole batch."""
    objective = build_objective("vicreg", DIM, distributed=False)
    module, fn = Encoders(False).double(), loss_fn(objective)
    x, a = data(0)
    micro = list(zip(chunks(x, ACCUM), chunks(a, ACCUM)))
    whole = _grads(objective, module, [(x, a)], lambda m, mbs: fn(m, mbs[0])[0].backward())
    exact = _grads(objective, module, micro, lambda m, mbs: accumulated_backward(m, m, mbs, fn, lambda t, i: t.backward()))
    naive = _grads(objective, module, micro, lambda m, mbs: [(fn(m, mb)[0] / ACCUM).backward() for mb in mbs])
    for e, w in zip(exact, whole):
        torch.testing.assert_close(e, w, rtol=1e-10, atol=1e-12)
    assert max((n - w).abs().max() for n, w in zip(naive, whole)) > 1e-3


def test_batchnorm_statistics_move_once_per_micro_batch():
    """The graph-free first pass leaves BatchNorm's running statistics as they were: after the step they equal
    those of one train-mode forward per micro-batch (so resuming and accumulation-free runs stay exact)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN_DIM, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, DIM))
    reference = copy.deepcopy(model)
    engine = DDPEngine(model, SGD, device=torch.device("cpu"), precision="fp32")
    x, a = (t.float() for t in data(0))
    micro = list(zip(chunks(x, ACCUM), chunks(a, ACCUM)))
    engine.train_step(micro, loss_fn(build_objective("scl", DIM, distributed=False)), lr=0.0)
    with torch.no_grad():
        for mx, ma in micro:
            reference(torch.cat([mx, ma]))
    for name, buffer in reference.named_buffers():
        assert torch.equal(dict(model.named_buffers())[name], buffer), name


DS_CASES = [("vicreg", {}, "joint")]


def _deepspeed_worker(rank, port, out_dir):
    from eigtrain.engine.deepspeed_zero import DeepSpeedEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = []
    for name, kwargs, nesting in DS_CASES:
        for accum in (1, ACCUM):
            objective = build_objective(name, DIM, nesting=nesting, **kwargs)
            model = Encoders(objective.pairs)
            engine = DeepSpeedEngine(model, SGD, device=torch.device("cpu"), stage=2, precision="fp32",
                                     micro_batch_size=LOCAL_BATCH // accum, grad_accum_steps=accum)
            before = [p.detach().clone() for p in engine.model.parameters()]
            x, a = (t.float() for t in data(rank))
            result = engine.train_step(list(zip(chunks(x, accum), chunks(a, accum))), loss_fn(objective), lr=1.0)
            results.append((result.loss, [p.detach() - b for p, b in zip(engine.model.parameters(), before)]))
    torch.save(results, os.path.join(out_dir, f"ds{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_deepspeed_accumulation_1_and_4_give_the_same_loss_and_update(tmp_path):
    """DeepSpeed's own accumulation boundary, with each micro-batch's exact share (no 1/accumulation scaling)."""
    mp.spawn(_deepspeed_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = torch.load(tmp_path / "ds0.pt")
    for i, case in enumerate(DS_CASES):
        (loss1, update1), (loss4, update4) = results[2 * i], results[2 * i + 1]
        torch.testing.assert_close(loss4, loss1, rtol=1e-5, atol=1e-6, msg=str(case))
        assert max(u.abs().max() for u in update1) > 1e-3
        for got, want in zip(update4, update1):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=str(case))
