"""Rank-0 logging: ``metrics.jsonl`` always, wandb optionally, and a progress display.

(Named ``metrics_log`` rather than ``logging`` so it never shadows the standard library module.)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from eigtrain import safe_files
from eigtrain.runs.checkpoint import MODEL_INFO_NAME
from eigtrain.runs.checkpoint_verify import record_file
from eigtrain.runs.wandb_run import import_wandb, open_run
from eigtrain.schema import WandbConfig

WANDB_MODES = ("offline", "online", "disabled")


def _plain(v: Any) -> Any:
    """JSON-ready value; non-finite floats become null (strict JSON has no NaN)."""
    if isinstance(v, torch.Tensor):
        v = v.detach().float().cpu()
        v = v.item() if v.ndim == 0 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop lines logged after ``last_step`` (by a run that died after its last checkpoint), so the
    file reads as one uninterrupted run after a resume."""
    safe_files.refuse_link(path)  # it is rewritten below, and appended to after
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and _logged_step(path, line) <= last_step]
    safe_files.write_text(path, "".join(line + "\n" for line in kept))


def _logged_step(path: Path, line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path} holds a line that is not a logged step ({line[:60]!r}): not eigtrain's log") from None


class MetricsLog:
    """One JSON object per logged step in ``run_dir/metrics.jsonl`` (+ wandb when enabled)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        wandb_cfg: WandbConfig,
        run_id: str,
        config: Mapping[str, Any],
        resume_step: int,
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        truncate_metrics(self.path, resume_step)
        self._file = safe_files.open_append(self.path)
        self._wandb = None
        mode = wandb_cfg.mode
        if mode not in WANDB_MODES:
            raise ValueError(f"logging.wandb.mode={mode!r} is not known; allowed: {', '.join(WANDB_MODES)}")
        wandb = import_wandb(mode, f"logging to {self.path} only")
        if wandb is not None:
            self._wandb = open_run(wandb, wandb_cfg, run_id, run_dir, config)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(wandb_record(record), step=step)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


WANDB_EIGENVALUES = 64  # curves in wandb; the whole spectrum stays in metrics.jsonl


def wandb_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl record as wandb plots it: one curve per coordinate over the steps (`eigenvalue/001`: the
    first coordinate's Rayleigh quotient on the batch, in coordinate order, up to WANDB_EIGENVALUES; not the sorted
    spectrum, which eigtrain-rr logs as `rr/spectrum`), every other value as it is."""
    out = {k: v for k, v in record.items() if k != "eigenvalues"}
    spectrum = record.get("eigenvalues")
    if isinstance(spectrum, list) and all(isinstance(v, (int, float)) for v in spectrum):
        out.update({f"eigenvalue/{i:03d}": v for i, v in enumerate(spectrum[:WANDB_EIGENVALUES], 1)})
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _spectrum(eigenvalues: Any, shown: int = 6) -> str:
    ev = _plain(eigenvalues)
    if not ev:
        return ""
    fmt = lambda x: "nan" if x is None else f"{x:.3g}"  # noqa: E731
    tail = f" … {fmt(ev[-1])}" if len(ev) > shown else ""
    return f"λ[{' '.join(map(fmt, ev[:shown]))}{tail}]"


class Progress:
    """Rank-0 progress: a live rich bar on a terminal, plain lines otherwise (logs of batch jobs)."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool):
        self.enabled, self.total = enabled, total_steps
        self._bar = None
        if enabled and sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
            )
            self._task = self._bar.add_task("", total=total_steps, completed=start_step)
            self._bar.start()

    def update(
        self, step: int, *, loss: float, samples_per_s: float, data_wait: float, eigenvalues: Any = None
    ) -> None:
        if not self.enabled:
            return
        text = f"loss {loss:.4g} | {samples_per_s:,.0f} samples/s | data wait {100 * data_wait:.0f}% | {_spectrum(eigenvalues)}"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, description=text)
        else:
            print(f"step {step}/{self.total} | {text}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class Throughput:
    """Samples/s and the share of wall time spent waiting for data, between two log steps."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._t0, self._wait, self._samples = time.perf_counter(), 0.0, 0

    def add(self, samples: int, data_wait_s: float) -> None:
        self._samples += samples
        self._wait += data_wait_s

    def next(self, batches: Iterator[Any], samples: int) -> Any:
        """The next batch of ``samples`` samples from ``batches``; the wait for it counts as data wait."""
        t0 = time.perf_counter()
        batch = next(batches)
        self.add(samples, time.perf_counter() - t0)
        return batch

    def read(self) -> tuple[float, float]:
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        rate, share = self._samples / elapsed, min(1.0, self._wait / elapsed)
        self.reset()
        return rate, share


class Reporter:
    """What training shows, and when: a metrics record (metrics.jsonl, wandb) and a progress line every ``every``
    steps, at the last step, and at each step the monitor scores (its kNN accuracies join the record). Every rank
    holds one and takes the same decisions (at a logging step every rank reads the skip counter); only the one
    given a `MetricsLog` and a `Progress` (rank 0's) writes, and only it scores."""

    def __init__(self, every: int, monitor: Any, metrics: MetricsLog | None = None, progress: Progress | None = None):
        self.every, self.monitor, self.metrics, self.progress = every, monitor, metrics, progress
        self.throughput = Throughput()

    def due(self, step: int, last_step: int) -> bool:
        return step % self.every == 0 or step == last_step or self.monitor.due(step, last_step)

    def log(self, step: int, last_step: int, result: Any, lr: float, state: Any, model: Any) -> None:
        """Record training ``result`` (a `StepResult`) at ``step``, with the loop's counters (``state``)."""
        if self.metrics is None or self.progress is None:
            return
        rate, wait = self.throughput.read()
        knn = self.monitor(model) if self.monitor.due(step, last_step) else {}  # kNN accuracy per prefix size
        self.metrics.log(
            step,
            {
                "loss": result.loss,
                **result.terms,
                "lr": lr,
                "grad_norm": result.grad_norm,
                "samples": state.samples,
                "samples_per_s": rate,
                "data_wait": wait,
                "skipped_steps": state.skipped_steps,
                "skipped_batches": state.skipped_batches,
                **knn,
            },
        )
        self.progress.update(
            step,
            loss=float(result.loss),
            samples_per_s=rate,
            data_wait=wait,
            eigenvalues=result.terms.get("eigenvalues"),
        )

    def close(self) -> None:
        for part in (self.metrics, self.progress):
            if part is not None:
                part.close()


# -- what produced this run ------------------------------------------------------------------------
def stable_run_id(run_dir: Path, from_checkpoint: str | None) -> str:
    """The wandb run id: the checkpoint's, else the one this run dir already has, else a new one."""
    id_file = Path(run_dir) / "wandb_id"
    run_id = from_checkpoint or (id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8])
    safe_files.write_text(id_file, run_id)
    return run_id


def write_run_records(run_dir: Path, config_yaml: str, model_info: Mapping[str, Any], repo_dir: Path) -> None:
    """config.yaml (resolved), model.json (what the encoder was built for), environment.json."""
    run_dir = Path(run_dir)
    safe_files.write_text(run_dir / "config.yaml", config_yaml)
    record_file(run_dir, "config.yaml")  # readers verify it (eigtrain.runs.saved_config)
    safe_files.write_text(run_dir / MODEL_INFO_NAME, json.dumps(dict(model_info)))
    safe_files.write_text(run_dir / "environment.json", json.dumps(run_environment(repo_dir), indent=1))


_LIBRARIES = ("torch", "torchvision", "timm", "kornia", "deepspeed", "webdataset", "hydra-core", "numpy", "wandb")


def run_environment(repo_dir: Path) -> dict[str, Any]:
    """git sha (and whether the tree was dirty), library versions, python: written to run_dir."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True, timeout=10)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    versions: dict[str, str | None] = {}
    for lib in _LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    status = git("status", "--porcelain")
    return {
        "git_sha": git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "python": sys.version.split()[0],
        "versions": versions,
        "cuda": torch.version.cuda,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
