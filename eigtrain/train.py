"""eigtrain-train: pretrain an encoder on shards with any objective and nesting (Hydra entry point).

    eigtrain-train experiment=cpu_debug                                   # one CPU process, seconds
    torchrun --nproc_per_node 8 -m eigtrain.train experiment=cifar10_scl  # one node
    eigtrain-train experiment=cifar10_scl launcher=slurm launcher.nodes=4 launcher.gpus_per_node=8

Data flows one way: shards -> loader (decode only) -> device -> augmentation -> encoder -> objective.
A run resumes automatically from the newest complete checkpoint in ``run_dir``.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from eigtrain import checkpoint as ckpt
from eigtrain import dist
from eigtrain.config_check import ConfigError, validate
from eigtrain.data import CorruptDataError, build_augment
from eigtrain.data import from_config as data_setup
from eigtrain.engine import build_engine, chunks, lr_at
from eigtrain.engine.base import LossFn, accumulation_caveat, enable_cuda_fast_paths
from eigtrain.metrics_log import MetricsLog, Progress, Throughput, stable_run_id, write_run_records
from eigtrain.models import build_encoder, use_sync_batch_norm
from eigtrain.monitor import build_monitor
from eigtrain.objectives import build_objective
from eigtrain.redact import redact_config, redact_logs, redact_url, redact_yaml_file
from eigtrain.skipped_batches import agreed_count, rows, stand_in
from eigtrain.output_dirs import claim_run_dir

CONFIG_PACKAGE = "eigtrain.configs"  # configs/ of the repository, shipped inside the package (pyproject.toml)
log = logging.getLogger("eigtrain.train")


class NonFiniteError(RuntimeError):
    """Too many steps with a non-finite loss or gradient."""


def compose_config(overrides: Sequence[str] = (), config_name: str = "train") -> DictConfig:
    """The composed training config, as the command line would build it (for tests, tools, launchers)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_PACKAGE, version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def prepare_data(cfg: DictConfig, rank: int, cache_dir: Path | None = None):
    """Input shapes (x, a or None); rank 0 first writes the demo shards when configured and missing (into a new
    or empty directory only) or counts the samples of foreign shards once (cached in `cache_dir`)."""
    return data_setup.prepare_data(cfg, rank, cache_dir, barrier=dist.barrier)


def make_loss_fn(engine, objective, pairs: bool) -> LossFn:
    """loss_fn(module, (first, second)) for engine.train_step: encoder under autocast, objective in fp32
    (encode and objective apart, so that accumulation can evaluate the objective on the whole batch)."""

    def encode(module, micro):
        first, second = micro
        with engine.autocast():
            # Views: one forward over both (one pass through BatchNorm and the wrapper); pairs: phi(x), psi(a).
            return module(first, second) if pairs else module(torch.cat([first, second])).chunk(2)

    return LossFn(encode, objective)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train as ``cfg`` says (one rank of the job); returns the final step, loss and paths."""
    env = dist.resolve_env()
    micro_batch, accum = validate(cfg, env.world_size)  # before any expensive work
    nest, coefficients = cfg.nesting, {k: v for k, v in cfg.objective.items() if k != "name"}
    objective = build_objective(cfg.objective.name, cfg.dim, nesting=nest.mode, prefixes=nest.prefixes,
                                weights=nest.weights, pairs=cfg.data.mode == "pairs",
                                local_batch=micro_batch * accum, **coefficients)  # what one call sees per rank
    threads, had_group = torch.get_num_threads(), torch.distributed.is_initialized()
    torch.set_num_threads(cfg.cpu_threads or threads)
    device = dist.select_device(env, cfg.device)  # the one place that binds this rank's GPU
    dist.init_distributed(env, backend="nccl" if device.type == "cuda" else "gloo", timeout_s=cfg.dist_timeout_s)
    if device.type == "cuda":
        enable_cuda_fast_paths()  # TF32 + cuDNN autotuning (the objective keeps IEEE fp32)
    # Only the multi-process group made here is destroyed at the end; the one-process group the DeepSpeed
    # engine makes for itself stays (DeepSpeed caches its groups for the life of the process).
    owns_group = torch.distributed.is_initialized() and not had_group
    logging.basicConfig(level=logging.INFO if env.rank == 0 else logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    redact_logs()  # a shard URL in a log line loses its credentials (Slurm writes these lines into the run dir)
    try:
        return _train(cfg, env, device, objective.to(device), micro_batch, accum)
    finally:  # leave the process as it was (tests and launchers call run() in-process)
        torch.set_num_threads(threads)
        if owns_group:
            dist.destroy()


def _train(cfg: DictConfig, env: dist.DistEnv, device: torch.device, objective, micro_batch: int, accum: int) -> dict[str, Any]:
    rank, world, rank0, data, pairs = env.rank, env.world_size, env.rank == 0, cfg.data, cfg.data.mode == "pairs"
    run_dir = Path(cfg.run_dir)
    folder = cfg.launcher.get("folder")  # the Slurm launcher's logs: written there before the job started
    refused = dist.broadcast_object(claim_run_dir(run_dir, folder) if rank0 else None)  # before anything else
    if refused:
        raise ConfigError(refused)
    x_shape, a_shape = prepare_data(data, rank, cache_dir=run_dir / "data")
    ckpt.seed_all(cfg.seed)  # the same initial weights on every rank
    model = build_encoder(cfg.model, cfg.dim, x_shape, a_shape)
    model = use_sync_batch_norm(model, cfg.model.sync_batch_norm, world, device)  # GPU jobs: on by default for ResNets
    engine = build_engine(cfg.engine, cfg.optim, model, device=device, micro_batch_size=micro_batch, grad_accum_steps=accum)
    stream = data_setup.build_stream(data, batch_size=cfg.batch_size // world, rank=rank, world_size=world,
                                     seed=cfg.seed, device=device, cache_dir=run_dir / "data")
    mean, std = (tuple(v) if v else None for v in (data.mean, data.std))
    augment = build_augment(data.augment, image_size=data.view_size, mean=mean, std=std).to(device)
    generator = torch.Generator(device=device)
    generator.manual_seed(ckpt.seed_all(cfg.seed, rank, 1))  # per-rank randomness from here on
    log.info("%d rank(s) on %s; per-rank micro-batch %d x %d accumulation; %.2fM parameters", world, device,
             micro_batch, accum, sum(p.numel() for p in model.parameters()) / 1e6)
    if rank0 and (caveat := accumulation_caveat(model, accum)):
        log.warning(caveat)  # once, at start: the README's "what accumulation makes exact"

    checkpoints = ckpt.Checkpointer(run_dir / "checkpoints", engine, keep_last=cfg.keep_last, rank=rank, world_size=world)
    latest, trainer_state, rank_state = checkpoints.resume()
    state = {"step": 0, "samples": 0, "skipped_steps": 0, "skipped_batches": 0, "wandb_id": None, **trainer_state}
    if latest:
        stream.load_state_dict(rank_state["data"])
        if "rng" in rank_state:
            ckpt.set_rng_state(rank_state["rng"], {"augment": generator})
        log.info("resumed from %s (step %d)", latest, state["step"])
    model_info = {"dim": cfg.dim, "input_shape": list(x_shape), "context_shape": list(a_shape) if a_shape else None}
    if rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        state["wandb_id"] = stable_run_id(run_dir, state["wandb_id"])
        write_run_records(run_dir, OmegaConf.to_yaml(redact_config(cfg)), model_info, Path(__file__).resolve().parent)
        metrics = MetricsLog(run_dir, wandb_cfg=cfg.logging.wandb, run_id=state["wandb_id"],
                             config=OmegaConf.to_container(cfg, resolve=True), resume_step=state["step"])
        progress = Progress(cfg.steps, state["step"], enabled=cfg.logging.progress)

    keep_multiple = accum * (2 if objective.split_batch else 1)

    def inputs(batch: dict) -> tuple[list, bool]:
        """uint8 batch -> device -> augmented, normalized views (or pairs) -> (micro-batches, usable). A batch left
        with fewer than 2 samples per micro-batch by dropped corrupt samples is unusable: a stand-in of that size
        keeps this rank in step with the others, and every rank skips the update (`eigtrain.skipped_batches`)."""
        usable = rows(batch) - rows(batch) % keep_multiple >= 2 * accum
        batch = batch if usable else stand_in(batch, 2 * accum)
        if pairs:
            x, a = (batch[k].to(device, non_blocking=True) for k in ("x", "a"))
            first, second = augment.view(x, generator, 0), (augment.view(a, generator, 1) if a.dtype == torch.uint8 else a)
        else:
            sizes = batch.get("size")  # data.image_fit=whole: each image's valid region, crops come from all of it
            sizes = None if sizes is None else sizes.to(device, non_blocking=True)  # once for both views
            first, second = augment(batch["image"].to(device, non_blocking=True), generator=generator, sizes=sizes)
        keep = len(first) - len(first) % keep_multiple  # a batch shortened by dropped corrupt samples
        first, second = first[:keep], second[:keep]
        if engine.channels_last and first.ndim == 4:
            first, second = (t.contiguous(memory_format=torch.channels_last) for t in (first, second))
        return list(zip(chunks(first, accum), chunks(second, accum))), usable

    loss_fn, end = make_loss_fn(engine, objective, pairs), min(cfg.steps, cfg.stop_after or cfg.steps)
    monitor_every = int((cfg.get("monitor") or {}).get("every") or 0)
    monitor = build_monitor(cfg, device=device, autocast=engine.autocast) if rank0 else None
    throughput, batches = Throughput(), iter(stream)
    saved, pending_save, stop, result = latest or None, False, False, None
    # Skipped updates since the host last looked: a device counter, read (one synchronisation) only at logging,
    # checkpoint and stop steps, so an ordinary step never waits for the GPU.
    unread_skips = torch.zeros((), dtype=torch.int64, device=device)
    unusable_steps: list[int] = []  # this rank's steps on a stand-in batch since the last check

    def count_skips(step: int) -> None:
        skips = int(unread_skips.item())
        if not skips:  # the same on every rank: an unusable batch on any rank made every rank skip
            return
        unread_skips.zero_()
        unusable = agreed_count(unusable_steps)
        unusable_steps.clear()
        if unusable:
            state["skipped_batches"] += unusable
            log.warning("step %d: %d step(s) skipped since the last check for a batch without enough usable samples "
                        "on some rank (%d so far; data.max_corrupt bounds the unusable samples)", step, unusable,
                        state["skipped_batches"])
        if skips == unusable:
            return
        state["skipped_steps"] += skips - unusable
        log.warning("step %d: non-finite loss or gradient, %d update(s) skipped since the last check (%d so far)",
                    step, skips - unusable, state["skipped_steps"])
        if state["skipped_steps"] > cfg.max_nonfinite_steps:
            raise NonFiniteError(
                f"{state['skipped_steps']} steps had a non-finite loss or gradient, more than "
                f"max_nonfinite_steps={cfg.max_nonfinite_steps}; stopped at step {step}; last good checkpoint: {saved}")

    try:
        while state["step"] < end and not stop:
            t0 = time.perf_counter()
            batch = next(batches)
            throughput.add(cfg.batch_size, time.perf_counter() - t0)
            lr = lr_at(state["step"], cfg.optim, cfg.steps)
            micro_batches, usable = inputs(batch)
            result = engine.train_step(micro_batches, loss_fn, lr, usable=usable)
            unusable_steps += [] if usable else [state["step"] + 1]
            unread_skips += ~torch.as_tensor(result.applied, device=device)
            state["step"], state["samples"] = state["step"] + 1, state["samples"] + cfg.batch_size
            step = state["step"]
            # A signal on any rank: save now, on all ranks, and leave (the ranks agree every signal_check_every steps)
            stop = dist.stop_requested(poll=step % cfg.signal_check_every == 0)
            pending_save = pending_save or step % cfg.checkpoint_every == 0
            monitored = monitor_every > 0 and (step % monitor_every == 0 or step == end)
            logging_step = step % cfg.log_every == 0 or step == end or monitored
            applied = True
            if logging_step or pending_save or stop:  # the same decision on every rank
                count_skips(step)
                applied = bool(result.applied)
            if rank0 and logging_step:
                rate, wait = throughput.read()
                knn = monitor(engine.model) if monitored else {}  # kNN accuracy per prefix size (monitor.every)
                metrics.log(step, {"loss": result.loss, **result.terms, "lr": lr, "grad_norm": result.grad_norm,
                                   "samples": state["samples"], "samples_per_s": rate, "data_wait": wait,
                                   "skipped_steps": state["skipped_steps"],
                                   "skipped_batches": state["skipped_batches"], **knn})
                progress.update(step, loss=float(result.loss), samples_per_s=rate, data_wait=wait,
                                eigenvalues=result.terms.get("eigenvalues"))
            # No periodic checkpoint right after a skipped update (statistics may be NaN); the last one always.
            if (pending_save and applied) or step == end or stop:
                saved = checkpoints.save(step, state, {"rng": ckpt.rng_state({"augment": generator}), "data": stream.state_dict()})
                pending_save = False
        final_weights = engine.model_state_dict() if state["step"] == cfg.steps else None  # a collective for ZeRO-3
        if rank0 and final_weights is not None:
            ckpt.export_model(run_dir / ckpt.EXPORT_NAME, final_weights, {"step": state["step"], **model_info})
    finally:
        if rank0:
            metrics.close()
            progress.close()
    return {"step": state["step"], "loss": float(result.loss) if result is not None else None, "run_dir": str(run_dir),
            "checkpoint": str(saved) if saved else None, "skipped_steps": state["skipped_steps"],
            "skipped_batches": state["skipped_batches"], "stopped_on_signal": stop}


def _job_world_size(cfg: DictConfig) -> int:
    """Ranks of the job `cfg` starts: the Slurm allocation's, or this process's (torchrun, srun, one)."""
    if cfg.launcher.name == "slurm":  # checked on the login node, before anything is submitted
        from eigtrain.launch.slurm import world_size

        return world_size(cfg.launcher)
    return dist.resolve_env().world_size


def _check_point(overrides: list[str], config_name: str | None) -> None:
    cfg = compose_config(overrides, config_name or "train")
    validate(cfg, world_size=_job_world_size(cfg))


@hydra.main(config_path=f"pkg://{CONFIG_PACKAGE}", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from torch.distributed.checkpoint.api import CheckpointException

    from eigtrain.data import ShardError
    from eigtrain.launch import launch

    # Hydra's output directory for this job: run_dir, or run_dir/<the point's overrides> in a multirun.
    # Made concrete here, so a job submitted to Slurm (and requeued) keeps it.
    cfg.run_dir = HydraConfig.get().runtime.output_dir
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # Hydra saved the sweep's command line: without credentials
        redact_yaml_file(Path(HydraConfig.get().sweep.dir) / "multirun.yaml")
    try:
        validate(cfg, world_size=_job_world_size(cfg))
        launch(cfg.launcher, run, cfg)
    except ConfigError as exn:
        raise SystemExit(f"eigtrain-train: config error: {exn}") from None
    except CorruptDataError as exn:  # past data.max_corrupt: one line naming the count and the last sample
        raise SystemExit(f"eigtrain-train: {exn}") from None
    except (ShardError, TimeoutError) as exn:  # a shard that cannot be read, a stalled source: one line naming it
        raise SystemExit(f"eigtrain-train: data error: {exn}") from None
    except NonFiniteError as exn:  # past max_nonfinite_steps: names the last good checkpoint
        raise SystemExit(f"eigtrain-train: {exn}") from None
    except OSError as exn:  # a full disk, a read-only run directory: one line naming the file
        raise SystemExit(f"eigtrain-train: cannot write {exn.filename or 'the run'}: {exn.strerror or exn}") from None
    except ValueError as exn:  # found once the data is read (e.g. too few samples for one batch per worker)
        raise SystemExit(f"eigtrain-train: {exn}") from None
    except CheckpointException as exn:  # torch.distributed.checkpoint's, one per failed rank; a full disk among them
        errors = {f"{type(e).__name__}: {str(e).splitlines()[0]}" for e, _ in exn.failures.values()}
        free = shutil.disk_usage(cfg.run_dir).free
        raise SystemExit(f"eigtrain-train: cannot write a checkpoint in {cfg.run_dir} ({free} bytes free there): "
                         f"{'; '.join(sorted(errors))}") from None


def main() -> None:
    from eigtrain.cli import check_hydra_command_line

    try:  # before Hydra runs: a config error is one line naming the key, not a traceback
        check_hydra_command_line(sys.argv[1:], _check_point)
    except (ConfigError, ValueError) as exn:
        raise SystemExit(redact_url(f"eigtrain-train: config error: {exn}")) from None
    try:
        _hydra_main()
    except SystemExit as exn:  # every one-line error, whichever component raised it: no credential in it
        if isinstance(exn.code, str):
            raise SystemExit(redact_url(exn.code)) from None
        raise


if __name__ == "__main__":
    main()
