"""Sweep point names: a multirun point's directory is named by its own result-changing overrides; and the
resolver configs/train.yaml names it with (`register_resolvers`, called by whatever composes the training config).
Hydra's own ``${hydra:job.override_dirname}`` cannot take its place: it would keep credentials of URL values and whole
paths in the name, exclude keys only one by one (not `logging` with its sub-keys), and has no bound on the length."""

from __future__ import annotations

import hashlib
import re

from omegaconf import OmegaConf

from eigtrain.redact import redact_url

# Keys that do not change what a sweep point trains -- where, how fast and how observably it runs, when this
# invocation stops -- and so never name its directory: changing one on a requeue resumes the point instead of
# restarting it from step 0. A key listed here covers its sub-keys (`logging` covers `logging.wandb.mode`).
# Every other key (objective, model, data content and order, optimizer, batch sizes, precision, seed, steps, ...)
# names the point.
NOT_RESULT_KEYS = (
    "run_dir",
    "name",
    "hydra",
    "launcher",
    "logging",
    "monitor",  # where it runs and what it reports
    "stop_after",
    "checkpoint_every",
    "keep_last",
    "log_every",
    "max_nonfinite_steps",
    "dist_timeout_s",
    "signal_check_every",
    "device",
    "cpu_threads",
    "engine.compile",
    "engine.channels_last",  # speed, not the result
    "engine.deterministic",  # reproducibility to the last bit, not what is trained
    "data.num_workers",
    "data.pin_memory",
    "data.prefetch_factor",
    "data.persistent_workers",
    "data.io_timeout_s",
    "data.decode",
    "data.shard_index",
    "data.allow_pipe",
)


def names_point(key: str) -> bool:
    """Whether an override of `key` changes what is trained (and so names a sweep point's directory)."""
    key = key.lstrip("+~")
    return not any(key == k or key.startswith(k + ".") for k in NOT_RESULT_KEYS)


def sweep_point(overrides) -> str:
    """A multirun job's directory name: its own result-changing overrides, sorted (`optim.lr=0.05,seed=1`).

    The same point gives the same name on every submission, whatever NOT_RESULT_KEYS it also sets, so a requeued
    or re-run point resumes from its own checkpoints; different points never share one. Credentials in URL values
    never reach the name (eigtrain.redact).
    """
    kept = sorted(o for o in overrides if names_point(o.split("=")[0]))
    name = ",".join(_short(redact_url(o)) for o in kept) or "default"
    if len(name) > 160:  # file names are limited to 255 bytes
        name = f"{name[:140]}-{_digest(name)}"
    return name


def _short(override: str) -> str:
    """key=value with a path value as its last part plus a digest of the whole: data.root=digits-1a2b3c4d.
    Hydra's quotes are dropped first: `data.shards='X'` (how a brace pattern must be given) is the point X."""
    key, _, value = override.partition("=")
    value = _QUOTED.sub(lambda m: m.group(2), value)
    if "/" in value:
        value = f"{value.rstrip('/').rpartition('/')[2] or 'root'}-{_digest(value)[:8]}"
    return f"{key}={value}"


_QUOTED = re.compile(r"""(['"])(.*?)\1""")  # a quoted string of a Hydra override value


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def register_resolvers() -> None:
    """The resolver of configs/train.yaml: a sweep point's directory (hydra.sweep.subdir)."""
    OmegaConf.register_new_resolver("eigtrain.sweep_point", sweep_point, replace=True)
