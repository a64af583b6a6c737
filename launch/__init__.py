"""Launchers: `local` runs in this process (also under torchrun), `slurm` submits with submitit."""

from collections.abc import Callable

from eigtrain.schema import LocalLauncherConfig, SlurmLauncherConfig


def launch(
    cfg: LocalLauncherConfig | SlurmLauncherConfig, fn: Callable, *args, loader_workers: int | None = None, **kwargs
):
    """Run `fn(*args, **kwargs)` as the `launcher` config (its option's dataclass) says: `name` "local" or "slurm".

    local: calls it here and returns its result. slurm: returns the submitted submitit job
    (after waiting for it when `launcher.wait` is true); `loader_workers` (data.num_workers) sizes a task's CPUs
    where launcher.cpus_per_task is null.
    """
    kind = cfg.name  # every launcher option has it (eigtrain.schema)
    if kind == "local":
        return fn(*args, **kwargs)
    if kind == "slurm":
        from eigtrain.launch.slurm import submit

        return submit(cfg, fn, *args, loader_workers=loader_workers, **kwargs)
    raise ValueError(f"launcher.name={kind!r}; allowed: 'local', 'slurm'")
