"""eigtrain-train: pretrain an encoder on shards with any objective and nesting (Hydra entry point).

    eigtrain-train experiment=cpu_debug                                   # one CPU process, seconds
    torchrun --nproc_per_node 8 -m eigtrain.train.command experiment=cifar10_scl  # one node
    eigtrain-train experiment=cifar10_scl launcher=slurm launcher.nodes=4 launcher.gpus_per_node=8

Data flows one way: shards -> loader (decode only) -> device -> augmentation -> encoder -> objective.
A run resumes automatically from the newest complete checkpoint in ``run_dir``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, cast

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from eigtrain import dist
from eigtrain.data import build_augment
from eigtrain.data import from_config as data_setup
from eigtrain.engine import build_engine, lr_at
from eigtrain.engine.base import LossFn, accumulation_caveat, enable_cuda_fast_paths
from eigtrain.models import build_encoder, use_sync_batch_norm
from eigtrain.models.pretrained import load_pretrained
from eigtrain.objectives import build_objective
from eigtrain.redact import redact_config, redact_logs, redact_url, redact_yaml_file
from eigtrain.runs import checkpoint as ckpt
from eigtrain.runs.checkpoint_verify import record_file
from eigtrain.runs.lineage import check_resume, identity, run_key, saved_trainer_state
from eigtrain.runs.lock import WriterSlot
from eigtrain.runs.output_dirs import claim_run_dir
from eigtrain.schema import ConfigError, DataConfig, TrainConfig, train_config
from eigtrain.train import random_state
from eigtrain.train.checks import batch_split, decide_normalization, validate
from eigtrain.train.compose import CONFIG_PACKAGE, compose_config  # noqa: F401  (tools, tests, launchers)
from eigtrain.train.failures import failure_line, quiet_sharer_reports
from eigtrain.train.metrics_log import MetricsLog, Progress, Reporter, stable_run_id, write_run_records
from eigtrain.train.monitor import build_monitor
from eigtrain.train.state import RankState, TrainState
from eigtrain.train.step_inputs import StepInputs, make_loss_fn, view_options

log = logging.getLogger("eigtrain.train.command")


def prepare_data(cfg: DataConfig, rank: int, cache_dir: Path | None = None):
    """Input shapes (x, a or None); rank 0 first writes the demo shards when configured and missing (into a new
    or empty directory only) or counts the samples of foreign shards once (cached in `cache_dir`)."""
    return data_setup.prepare_data(cfg, rank, cache_dir, barrier=dist.barrier)


def run(
    composed: DictConfig, batches: tuple[int, int] | None = None, converted: TrainConfig | None = None
) -> dict[str, Any]:
    """Train as the composed config says (one rank); returns the final step, loss and paths. `batches`: (micro-batch,
    accumulation) where the launch validated it, else validated here. Converted once (`converted`: by the launch,
    else here): the components take parts of its TrainConfig; the composed config is kept for the records
    (config.yaml, lineage, metrics)."""
    env = dist.resolve_env()
    quiet_sharer_reports()  # a dead data worker is one line, not a sharer thread's traceback before it
    cfg = converted if converted is not None else train_config(composed)  # the one conversion
    micro_batch, accum = batches or validate(cfg, env.world_size)  # before any expensive work
    nest, coefficients = cfg.nesting, {k: v for k, v in vars(cfg.objective).items() if k != "name"}
    objective = build_objective(
        cfg.objective.name,
        cfg.dim,
        nesting=nest.mode,
        prefixes=nest.prefixes,
        weights=nest.weights,
        pairs=cfg.data.mode == "pairs",
        local_batch=micro_batch * accum,
        **coefficients,
    )  # what one call sees per rank
    threads, had_group = torch.get_num_threads(), torch.distributed.is_initialized()
    torch.set_num_threads(cfg.cpu_threads or threads)
    device = dist.select_device(env, cfg.device)  # the one place that binds this rank's GPU
    dist.init_distributed(env, backend="nccl" if device.type == "cuda" else "gloo", timeout_s=cfg.dist_timeout_s)
    if device.type == "cuda":
        enable_cuda_fast_paths(cfg.engine.deterministic)  # TF32 + cuDNN autotuning (the objective keeps IEEE fp32)
    # Only the multi-process group made here is destroyed at the end; the one-process group the DeepSpeed
    # engine makes for itself stays (DeepSpeed caches its groups for the life of the process).
    owns_group = torch.distributed.is_initialized() and not had_group
    logging.basicConfig(
        level=logging.INFO if env.rank == 0 else logging.WARNING, format="%(asctime)s %(name)s: %(message)s"
    )
    redact_logs()  # a shard URL in a log line loses its credentials (Slurm writes these lines into the run dir)
    try:
        return _train(cfg, composed, env, device, objective.to(device), (micro_batch, accum))
    finally:  # leave the process as it was (tests and launchers call run() in-process)
        torch.set_num_threads(threads)
        if owns_group:
            dist.destroy()


@dataclass
class Trainer:
    """The components one rank trains with (`_setup`); each keeps its own state and decides its own timing."""

    engine: Any
    loss_fn: LossFn
    inputs: StepInputs  # loader batch -> micro-batches on the device
    batches: Iterator[dict]
    state: TrainState  # step, samples, skip counters: trainer.json
    rank_state: RankState  # data cursor and RNG: rank-R.pt
    checkpoints: ckpt.Checkpointer  # when to save, and when a stop signal ends the run
    report: Reporter  # when to log (and the monitor when to score)
    model_info: dict[str, Any]


def _train(
    cfg: TrainConfig, composed: DictConfig, env: dist.DistEnv, device: torch.device, objective, batches
) -> dict[str, Any]:
    """The training loop: each step a batch, an update and the counters; each component says whether the step is its
    turn (the reporter to log, the checkpointer to save or stop), alike on every rank."""
    with WriterSlot() as writer:  # one trainer per run directory, for the whole run (released however it ends)
        return _loop(_setup(cfg, composed, env, device, objective, batches, writer), cfg, env.rank == 0)


def _loop(t: Trainer, cfg: TrainConfig, rank0: bool) -> dict[str, Any]:
    state, checkpoints, report, end = t.state, t.checkpoints, t.report, min(cfg.steps, cfg.stop_after or cfg.steps)
    result = None
    try:
        while state.step < end and not checkpoints.stop_requested:
            batch = report.throughput.next(t.batches, cfg.batch_size)
            lr = lr_at(state.step, cfg.optim, cfg.steps)
            micro_batches, usable = t.inputs(batch)
            result = t.engine.train_step(micro_batches, t.loss_fn, lr, usable=usable)
            step = state.advance(result.applied, usable)
            log_due, save_due = report.due(step, end), checkpoints.due(step, end)
            if log_due or save_due:  # the same on every rank: the only steps at which the host reads the device
                state.read_skips(checkpoints.last_saved)
            if log_due:
                report.log(step, end, result, lr, state, t.engine.model)
            if checkpoints.should_save(step, end, result.applied):
                checkpoints.save(step, state.state_dict(), t.rank_state.state_dict())
        final_weights = t.engine.model_state_dict() if state.step == cfg.steps else None  # a collective for ZeRO-3
        if rank0 and final_weights is not None:
            ckpt.export_model(Path(cfg.run_dir) / ckpt.EXPORT_NAME, final_weights, {"step": state.step, **t.model_info})
            record_file(Path(cfg.run_dir), ckpt.EXPORT_NAME)  # readers verify it (eigtrain.export.embed.open_run)
    finally:
        report.close()
    return {
        "step": state.step,
        "loss": float(result.loss) if result is not None else None,
        "run_dir": str(Path(cfg.run_dir)),
        "checkpoint": str(checkpoints.last_saved) if checkpoints.last_saved else None,
        "skipped_steps": state.skipped_steps,
        "skipped_batches": state.skipped_batches,
        "stopped_on_signal": checkpoints.stop_requested,
    }


def _setup(
    cfg: TrainConfig, composed: DictConfig, env: dist.DistEnv, device: torch.device, objective, batches, writer=None
) -> Trainer:
    """Claim the run directory, prepare the data, build the model, engine, stream and augmentation; `_resume`."""
    rank, world, rank0, data = env.rank, env.world_size, env.rank == 0, cfg.data
    micro_batch, accum = batches
    run_dir = Path(cfg.run_dir)
    folder = cfg.launcher.folder if cfg.launcher.name == "slurm" else None  # its logs: written before the job started
    # before anything else: a directory of eigtrain's, and no other trainer writing it (eigtrain.runs.lock)
    refused = dist.broadcast_object((claim_run_dir(run_dir, folder) or writer.take(run_dir)) if rank0 else None)
    if refused:
        raise ConfigError(refused)
    x_shape, a_shape = prepare_data(data, rank, cache_dir=run_dir / "data")
    random_state.seed_all(cfg.seed)  # the same initial weights on every rank
    model = load_pretrained(build_encoder(cfg.model, cfg.dim, x_shape, a_shape), cfg.model)  # model.pretrained
    model = use_sync_batch_norm(model, cfg.model.sync_batch_norm, world, device)  # GPU jobs: on by default for ResNets
    view_hw = data.view_size or (x_shape[-2:] if len(x_shape) == 3 else None)  # images: compile_mode=auto's cue
    sizes = dict(micro_batch_size=micro_batch, grad_accum_steps=accum, view_hw=view_hw)
    engine = build_engine(cfg.engine, cfg.optim, model, device=device, **sizes)
    stream = data_setup.build_stream(
        data,
        batch_size=cfg.batch_size // world,
        rank=rank,
        world_size=world,
        seed=cfg.seed,
        device=device,
        cache_dir=run_dir / "data",
    )
    norm, warning = decide_normalization(cfg, x_shape[0])  # data.mean/std, else the weights', else the preset's
    if warning and rank0:
        log.warning(warning)
    view_size = (data.view_size[0], data.view_size[1]) if data.view_size else None
    augment = build_augment(data.augment, image_size=view_size, **norm.kwargs(), **view_options(data, engine))
    augment = augment.to(device)
    generator = torch.Generator(device=device)
    generator.manual_seed(random_state.seed_all(cfg.seed, rank, 1))  # per-rank randomness from here on
    log.info(
        "%d rank(s) on %s; per-rank micro-batch %d x %d accumulation; %.2fM parameters",
        world,
        device,
        micro_batch,
        accum,
        sum(p.numel() for p in model.parameters()) / 1e6,
    )
    if rank0 and (caveat := accumulation_caveat(model, accum)):
        log.warning(caveat)  # once, at start: the README's "what accumulation makes exact"
    pairs = data.mode == "pairs"
    inputs = StepInputs(
        augment,
        generator,
        device,
        pairs=pairs,
        accum=accum,
        split_batch=objective.split_batch,
        channels_last=engine.channels_last,
    )
    model_info = {"dim": cfg.dim, "input_shape": list(x_shape), "context_shape": list(a_shape) if a_shape else None}
    model_info["normalization"] = norm.record()  # what eigtrain-rr, -eval, -embed and -export normalize with
    loss_fn, records = make_loss_fn(engine, objective, pairs), (composed, model_info)
    return _resume(cfg, records, env, device, engine, loss_fn, inputs, stream)


def _resume(
    cfg: TrainConfig, records, env: dist.DistEnv, device: torch.device, engine, loss_fn: LossFn, inputs, stream
) -> Trainer:
    """Resume from the newest complete checkpoint, if any; then rank 0 writes the run records and opens the logs."""
    (composed, model_info), rank0, run_dir = records, env.rank == 0, Path(cfg.run_dir)
    checkpoints = ckpt.Checkpointer(run_dir / "checkpoints", engine, cfg, rank=env.rank, world_size=env.world_size)
    state = TrainState(device, batch_size=cfg.batch_size, max_nonfinite_steps=cfg.max_nonfinite_steps)
    rank_state = RankState(stream, inputs.generator)
    if rank0:  # before anything is loaded or rewritten: the same objective, model, data and schedule
        done = ckpt.complete_checkpoints(checkpoints.root)
        saved_identity = saved_trainer_state(done[-1][1]).get("identity") if done else None
        args = (redact_config(composed), done[-1][0], cfg.new_lineage, composed, saved_identity) if done else ()
        lineage = check_resume(run_dir, *args) if done else ""
    if refused := dist.broadcast_object(lineage if rank0 else None):
        raise ConfigError(refused)
    latest, trainer_state, saved_rank_state = checkpoints.resume()
    if latest:
        state.load_state_dict(trainer_state)
        rank_state.load_state_dict(saved_rank_state)
        log.info("resumed from %s (step %d)", latest, state.step)
    if rank0:  # every checkpoint from now on says what its steps are steps of (a new lineage: the new values)
        key = run_key(run_dir, create=True)
        assert key is not None  # (create=True makes one)
        state.identity = identity(composed, key)
    metrics = progress = None
    if rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        state.wandb_id = stable_run_id(run_dir, state.wandb_id)
        write_run_records(
            run_dir, OmegaConf.to_yaml(redact_config(composed)), model_info, Path(__file__).resolve().parent
        )
        metrics = MetricsLog(
            run_dir,
            wandb_cfg=cfg.logging.wandb,
            run_id=state.wandb_id,
            config=cast(dict, OmegaConf.to_container(composed, resolve=True)),
            resume_step=state.step,
        )
        progress = Progress(cfg.steps, state.step, enabled=cfg.logging.progress)
    norm = model_info["normalization"]
    monitor = build_monitor(cfg, norm, device=device, autocast=engine.autocast, scores=rank0)  # kNN on rank 0
    report = Reporter(cfg.log_every, monitor, metrics, progress)
    return Trainer(engine, loss_fn, inputs, iter(stream), state, rank_state, checkpoints, report, model_info)


def _job_world_size(cfg: TrainConfig) -> int:
    """Ranks of the job `cfg` starts: the Slurm allocation's, or this process's (torchrun, srun, one)."""
    if cfg.launcher.name == "slurm":  # checked on the login node, before anything is submitted
        from eigtrain.launch.slurm import world_size

        return world_size(cfg.launcher)
    return dist.resolve_env().world_size


_CHECKED: set[tuple[str, ...]] = set()  # points main() validated before Hydra ran: not validated again


def _check_point(overrides: list[str], config_name: str | None) -> None:
    from eigtrain.cli import point_key

    cfg = train_config(compose_config(overrides, config_name or "train"))  # this check's one conversion
    validate(cfg, world_size=_job_world_size(cfg))
    _CHECKED.add((config_name or "train", *point_key(overrides)))


@hydra.main(config_path=f"pkg://{CONFIG_PACKAGE}", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: named below

    from eigtrain.cli import point_key
    from eigtrain.launch import launch

    # Hydra's output directory for this job: run_dir, or run_dir/<the point's overrides> in a multirun.
    # Made concrete here, so a job submitted to Slurm (and requeued) keeps it.
    cfg.run_dir = HydraConfig.get().runtime.output_dir
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # Hydra saved the sweep's command line: without credentials
        redact_yaml_file(Path(HydraConfig.get().sweep.dir) / "multirun.yaml")
    try:
        job = train_config(cfg)  # the job's one conversion; its run and its launcher take parts of it
        world, point = (
            _job_world_size(job),
            (HydraConfig.get().job.config_name, *point_key(HydraConfig.get().overrides.task)),
        )
        # validated once per launch: by main() before Hydra ran (every point of the command line), else here
        batches = batch_split(job, world) if point in _CHECKED else validate(job, world_size=world)
        workers = job.data.num_workers
        if job.launcher.name != "local":  # Slurm: launcher.save_on_signal decides (launch/slurm.py)
            launch(job.launcher, run, cfg, batches=batches, converted=job, loader_workers=workers)
        else:  # here or under torchrun: SIGTERM / SIGINT save at the next step boundary, as under Slurm
            with dist.stop_at_step_boundary():
                result = launch(job.launcher, run, cfg, batches=batches, converted=job, loader_workers=workers)
            if result.get("stopped_on_signal"):
                dist.leave_after_stop("eigtrain-train", result["step"], result["checkpoint"])
    except (Exception, CheckpointException) as exn:  # expected failures: one line (eigtrain.train.failures)
        line = failure_line(exn, cfg.run_dir)
        if line is None:
            raise
        raise SystemExit(line) from None


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
