"""Trainer step benchmarks on CPU with the tiny encoder (experiment=cpu_debug); prints JSON.

1. overhead: the trainer's full step (engine.train_step: encoder on both views, objective in fp32,
   gradient norm + clipping, device-side finiteness flag, learning rate, guarded optimizer step) against a bare step
   (same encoder on the same views, mean-square loss, backward, SGD step). Measured interleaved, median
   of --repeats; goal: ratio <= 1.10. The on-device augmentation is reported separately (data pipeline).
2. communication share with 2 gloo ranks: the step with DDP and the global-batch objective, against the
   same step with no communication (plain module, local objective) in the same two processes.
Both report medians of interleaved repeats (and, for 1, the ratio of the fastest repeats, which is the
steadier figure on a shared machine).

    python tools/bench_train.py --batch 256 --repeats 40
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eigtrain.data import build_augment
from eigtrain.engine.ddp import DDPEngine
from eigtrain.models import build_encoder
from eigtrain.objectives import build_objective
from eigtrain.schema import train_config
from eigtrain.train.command import compose_config
from eigtrain.train.step_inputs import make_loss_fn

SHAPE = (1, 8, 8)  # digits


def setup(batch: int, objective_name: str, distributed: bool):
    cfg = train_config(compose_config(["experiment=cpu_debug", f"objective={objective_name}", f"batch_size={batch}"]))
    torch.manual_seed(0)
    model = build_encoder(cfg.model, cfg.dim, SHAPE)
    coefficients = {k: v for k, v in vars(cfg.objective).items() if k != "name"}
    objective = build_objective(cfg.objective.name, cfg.dim, distributed=distributed, **coefficients)
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, *SHAPE), dtype=torch.uint8, generator=gen)
    augment = build_augment(cfg.data.augment)
    views = augment(images, generator=gen)
    return cfg, model, objective, images, augment, gen, views


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_ms(samples: list[float]) -> float:
    return 1e3 * statistics.median(samples)


def overhead(batch: int, repeats: int, objective_name: str) -> dict:
    cfg, model, objective, images, augment, gen, views = setup(batch, objective_name, distributed=False)
    bare_model = copy.deepcopy(model)
    bare_opt = torch.optim.SGD(
        bare_model.parameters(), lr=0.01, momentum=cfg.optim.momentum, weight_decay=cfg.optim.weight_decay
    )
    engine = DDPEngine(model, cfg.optim, device=torch.device("cpu"), grad_clip=cfg.optim.grad_clip)
    loss_fn = make_loss_fn(engine, objective, pairs=False)
    both = torch.cat(views)

    def bare():
        bare_model.train()
        loss = bare_model(both).square().mean()
        loss.backward()
        bare_opt.step()
        bare_opt.zero_grad(set_to_none=True)

    def full():
        engine.train_step([views], loss_fn, lr=0.01)

    def aug():
        augment(images, generator=gen)

    for fn in (bare, full, aug):
        for _ in range(5):
            fn()
    samples = {"bare": [], "full": [], "augment": []}
    for _ in range(repeats):  # interleaved, so load changes hit both alike
        samples["bare"].append(timed(bare))
        samples["full"].append(timed(full))
        samples["augment"].append(timed(aug))
    ms = {k: median_ms(v) for k, v in samples.items()}
    best = {k: 1e3 * min(v) for k, v in samples.items()}  # the least disturbed run on a shared machine
    return {
        "objective": objective_name,
        "batch": batch,
        "dim": cfg.dim,
        "bare_step_ms": ms["bare"],
        "full_step_ms": ms["full"],
        "augment_ms": ms["augment"],
        "ratio_full_over_bare": ms["full"] / ms["bare"],
        "ratio_full_over_bare_min": best["full"] / best["bare"],
        "ratio_full_plus_augment_over_bare": (ms["full"] + ms["augment"]) / ms["bare"],
    }


def _comm_worker(rank: int, port: int, batch: int, repeats: int, objective_name: str, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    per_rank = batch // 2
    cfg, model, objective, _, _, _, views = setup(per_rank, objective_name, distributed=True)
    local_objective = build_objective(
        cfg.objective.name, cfg.dim, distributed=False, **{k: v for k, v in vars(cfg.objective).items() if k != "name"}
    )
    engine = DDPEngine(model, cfg.optim, device=torch.device("cpu"), grad_clip=cfg.optim.grad_clip)
    with_comm = make_loss_fn(engine, objective, pairs=False)
    without_comm = make_loss_fn(engine, local_objective, pairs=False)
    local_opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def comm():  # the trainer's step: DDP gradient all-reduce + moment all-reduce (no finiteness vote: not needed)
        engine.train_step([views], with_comm, lr=0.01)

    def no_comm():  # the same arithmetic on the plain module, nothing leaves the process
        loss, _ = without_comm(engine.model, views)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(engine.model.parameters(), cfg.optim.grad_clip, foreach=True)
        local_opt.step()
        local_opt.zero_grad(set_to_none=True)

    for fn in (comm, no_comm):
        for _ in range(5):
            fn()
    samples = {"comm": [], "no_comm": []}
    for _ in range(repeats):
        dist.barrier()
        samples["comm"].append(timed(comm))
        dist.barrier()
        samples["no_comm"].append(timed(no_comm))
    if rank == 0:
        ms = {k: median_ms(v) for k, v in samples.items()}
        out.put(
            {
                "ranks": 2,
                "per_rank_batch": per_rank,
                "step_ms": ms["comm"],
                "step_without_communication_ms": ms["no_comm"],
                "communication_share": max(0.0, 1 - ms["no_comm"] / ms["comm"]),
            }
        )
    dist.destroy_process_group()


def communication(batch: int, repeats: int, objective_name: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_comm_worker, args=(r, port, batch, repeats, objective_name, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="global batch (images; two views each)")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--objective", default="scl")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {
        "machine": {"cpus": os.cpu_count(), "torch_threads_per_process": 1, "load_avg_1min": os.getloadavg()[0]},
        "overhead": overhead(args.batch, args.repeats, args.objective),
        "communication": communication(args.batch, args.repeats, args.objective),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
