"""Gradient accumulation is exact: accumulation 1 and 4 give the same global-batch loss and the same gradients,
for every objective family (two gloo processes, float64), with dropout too (the graph forward replays the masks of
the graph-free one); BatchNorm statistics move once per micro-batch. With BatchNorm the step is not exact (each
micro-batch is normalized by its own statistics): the losses differ and the trainer says so once."""

import copy
import logging
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eigtrain.engine import chunks
from eigtrain.engine.base import LossFn, accumulated_backward, accumulation_caveat
from eigtrain.engine.ddp import DDPEngine
from eigtrain.objectives import build_objective
from eigtrain.schema import SGDConfig
from tests.support.runs import free_port, overrides

IN_DIM, DIM, LOCAL_BATCH, WORLD, ACCUM = 5, 6, 16, 2, 4
SGD = SGDConfig(lr=1.0, momentum=0.0, weight_decay=0.0)  # lr 1: the update is minus the gradient

CASES = [
    ("lora", {}, "none"),
    ("lora", {"center": True, "constant_mode": "none"}, "joint"),
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

        def make():
            return torch.nn.Sequential(torch.nn.Linear(IN_DIM, 8), torch.nn.GELU(), torch.nn.Linear(8, DIM))

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


@pytest.mark.slow
def test_accumulation_1_and_4_give_the_same_loss_and_gradients_on_two_processes(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
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
    exact = _grads(
        objective, module, micro, lambda m, mbs: accumulated_backward(m, m, mbs, fn, lambda t, i: t.backward())
    )
    naive = _grads(objective, module, micro, lambda m, mbs: [(fn(m, mb)[0] / ACCUM).backward() for mb in mbs])
    for e, w in zip(exact, whole):
        torch.testing.assert_close(e, w, rtol=1e-10, atol=1e-12)
    assert max((n - w).abs().max() for n, w in zip(naive, whole)) > 1e-3


def test_batchnorm_statistics_move_once_per_micro_batch():
    """The graph-free first pass leaves BatchNorm's running statistics as they were: after the step they equal
    those of one train-mode forward per micro-batch (so resuming and accumulation-free runs stay exact)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(IN_DIM, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, DIM)
    )
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


class DropoutEncoders(torch.nn.Module):
    """Pairs: phi with Dropout(0.3) (its masks, drawn row after row on the CPU, are the same for the whole batch
    and for its micro-batches in order), psi without."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.phi = torch.nn.Sequential(
            torch.nn.Linear(IN_DIM, 8), torch.nn.GELU(), torch.nn.Dropout(0.3), torch.nn.Linear(8, DIM)
        )
        self.psi = torch.nn.Sequential(torch.nn.Linear(IN_DIM, 8), torch.nn.GELU(), torch.nn.Linear(8, DIM))

    def forward(self, x, a):
        return self.phi(x), self.psi(a)


def _dropout_step(accum, encode_log=None):
    objective = build_objective("vicreg", DIM, pairs=True, distributed=False)
    model = DropoutEncoders().double()
    engine = DDPEngine(model, SGD, device=torch.device("cpu"), precision="fp32")
    fn = loss_fn(objective)
    if encode_log is not None:
        encode = fn.encode
        fn = LossFn(lambda m, mb: encode_log.append(encode(m, mb)) or encode_log[-1], objective)
    before = [p.detach().clone() for p in model.parameters()]
    x, a = data(0)
    torch.manual_seed(7)
    result = engine.train_step(list(zip(chunks(x, accum), chunks(a, accum))), fn, lr=1.0)
    return result.loss, [p.detach() - b for p, b in zip(model.parameters(), before)], torch.rand(3)


def test_dropout_masks_are_replayed_so_accumulation_1_and_4_agree():
    one, four = _dropout_step(1), _dropout_step(ACCUM)
    torch.testing.assert_close(four[0], one[0], rtol=1e-12, atol=1e-12)
    assert max(u.abs().max() for u in one[1]) > 1e-3
    for got, want in zip(four[1], one[1]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert torch.equal(four[2], one[2])  # the random stream advanced as by one forward (resume stays exact)


def test_graph_forward_recomputes_the_graph_free_embeddings_under_dropout():
    calls = []
    _dropout_step(ACCUM, encode_log=calls)
    assert len(calls) == 2 * ACCUM  # graph-free pass, then graph pass
    for cached, graph in zip(calls[:ACCUM], calls[ACCUM:]):
        for c, g in zip(cached, graph):
            assert torch.equal(c, g.detach())


def test_batchnorm_accumulation_is_not_exact_and_is_named():
    """Train-mode BatchNorm normalizes each micro-batch by its own statistics: accumulation 1 and 4 give different
    losses for the same weights and batch; without BatchNorm they are equal."""

    def step_loss(model, accum):
        engine = DDPEngine(copy.deepcopy(model), SGD, device=torch.device("cpu"), precision="fp32")
        x, a = data(0)
        micro = list(zip(chunks(x, accum), chunks(a, accum)))
        return engine.train_step(micro, loss_fn(build_objective("scl", DIM, distributed=False)), lr=0.0).loss

    torch.manual_seed(0)
    with_bn = torch.nn.Sequential(
        torch.nn.Linear(IN_DIM, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, DIM)
    ).double()
    plain = Encoders(False).double()
    assert abs(step_loss(with_bn, 1) - step_loss(with_bn, ACCUM)) > 1e-3
    torch.testing.assert_close(step_loss(plain, ACCUM), step_loss(plain, 1), rtol=1e-12, atol=1e-12)
    assert "BatchNorm1d in the encoder: each micro-batch is normalized by its own" in accumulation_caveat(with_bn, 4)
    assert accumulation_caveat(with_bn, 1) is None and accumulation_caveat(plain, 4) is None


DS_CASES = [("vicreg", {}, "joint")]


def _deepspeed_worker(rank, port, out_dir):
    from eigtrain.engine.deepspeed_zero import DeepSpeedEngine

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = []
    for name, kwargs, nesting in DS_CASES:
        for accum in (1, ACCUM):
            objective = build_objective(name, DIM, nesting=nesting, **kwargs)
            model = Encoders(objective.pairs)
            engine = DeepSpeedEngine(
                model,
                SGD,
                device=torch.device("cpu"),
                stage=2,
                precision="fp32",
                micro_batch_size=LOCAL_BATCH // accum,
                grad_accum_steps=accum,
            )
            before = [p.detach().clone() for p in engine.model.parameters()]
            x, a = (t.float() for t in data(rank))
            result = engine.train_step(list(zip(chunks(x, accum), chunks(a, accum))), loss_fn(objective), lr=1.0)
            results.append((result.loss, [p.detach() - b for p, b in zip(engine.model.parameters(), before)]))
    torch.save(results, os.path.join(out_dir, f"ds{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_deepspeed_accumulation_1_and_4_give_the_same_loss_and_update(tmp_path):
    """DeepSpeed's own accumulation boundary, with each micro-batch's exact share (no 1/accumulation scaling)."""
    mp.spawn(_deepspeed_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = torch.load(tmp_path / "ds0.pt")
    for i, case in enumerate(DS_CASES):
        (loss1, update1), (loss4, update4) = results[2 * i], results[2 * i + 1]
        torch.testing.assert_close(loss4, loss1, rtol=1e-5, atol=1e-6, msg=str(case))
        assert max(u.abs().max() for u in update1) > 1e-3
        for got, want in zip(update4, update1):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=str(case))


def test_trainer_names_the_batchnorm_caveat_once_and_the_losses_differ(digits_root, tmp_path, caplog):
    """cpu_debug's tiny CNN has BatchNorm: 64 x 1 and 16 x 4 give different step-1 losses for the same weights and
    batch, and the accumulated run says why, once, at start."""
    from eigtrain.train.command import compose_config, run

    losses = {}
    for micro in (64, 16):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="eigtrain.train.command"):
            cfg = compose_config(
                overrides(tmp_path / f"run{micro}", digits_root, "steps=1", f"micro_batch_size={micro}")
            )
            losses[micro] = run(cfg)["loss"]
        named = [r for r in caplog.records if "normalized by its own statistics" in r.getMessage()]
        assert len(named) == (1 if micro == 16 else 0), caplog.text
    assert abs(losses[64] - losses[16]) > 1e-3, losses
