"""Checkpoint directories: ``step-N/``, a completion marker written last, discovery, keep-last-k.

A checkpoint directory holds
  - the engine's sharded model + optimizer state (torch.distributed.checkpoint or DeepSpeed files),
  - ``rank-R.pt`` per rank: RNG states (eigtrain.train.random_state) and the data cursor (differ between ranks),
  - ``trainer.json``: step, samples seen, skip counter, wandb run id (same on all ranks),
  - ``checksums.json``: every file's sha256 (eigtrain.runs.checkpoint_verify), written by rank 0 before the marker,
  - ``COMPLETE``, written by rank 0 only after every rank finished writing.
Discovery ignores directories without the marker, so a save killed half-way is never chosen; resume and readers
take the newest step that verifies. Nothing is unpickled beyond plain data (eigtrain.runs.checkpoint_read).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist

from eigtrain import safe_files
from eigtrain.runs.checkpoint_read import load_tensors, model_weights, read_json, reading
from eigtrain.runs.checkpoint_verify import newest_verified, write_checksums
from eigtrain.runs.step_dirs import (  # the step directories' names and discovery, here for callers of this module
    MARKER,
    OWNER,
    _step_dirs,
    complete_checkpoints,
    is_complete,
    latest_checkpoint,
    step_dir,
)
from eigtrain.schema import ModelConfig, TrainConfig, typed

__all__ = [
    "model_weights",
    "complete_checkpoints",
    "latest_checkpoint",
    "step_dir",
]  # read by eigtrain.export.embed and the tests from here
log = logging.getLogger(__name__)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # a directory too: fsync makes its entries (new files, renames) durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path``, then every directory (deepest first) and ``path``'s parent, so that after
    a crash what the directories list is on disk whole (the engines' own writers, DeepSpeed's included, do not)."""
    path = Path(path)
    dirs = [path.parent, path]
    for p in sorted(path.rglob("*")):
        if p.is_dir():
            dirs.append(p)
        elif p.is_file():
            # Another rank's temporary file may be renamed meanwhile: its writer syncs the file it became.
            with contextlib.suppress(FileNotFoundError):
                _fsync_path(p)
    for d in reversed(dirs):
        _fsync_path(d)


def mark_complete(path: Path, info: Mapping[str, Any]) -> None:
    """Write the marker atomically (temp file, fsync, rename, directory fsync) so it is either absent or whole.
    Call it only once the checkpoint's own files are durable (`fsync_tree`)."""
    safe_files.write_text(Path(path) / MARKER, json.dumps(dict(info)))  # fsyncs the file and the directory


def is_ours(path: Path) -> bool:
    """Whether eigtrain wrote this step directory: its ownership file (written first) or its marker (last)."""
    return (Path(path) / OWNER).is_file() or is_complete(path)


def _claim_step_dir(path: Path) -> str:
    """Make ``path`` for a save, after deleting a stale partial save of this step (eigtrain's: nothing is complete
    there); '' when done, or why not: a directory of that name that eigtrain did not write is left alone."""
    if path.exists() and not is_ours(path):
        return (
            f"{path} exists and was not written by eigtrain (no {OWNER} or {MARKER} in it): refusing to replace "
            f"it; move it out of {path.parent}"
        )
    if path.exists():
        _discard(path)
    _remove_unclaimed(path.parent)
    # made whole under a temporary name, then renamed into place: a kill never leaves a step-N without its ownership
    # file (which a restart would have to refuse as someone else's)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=UNCLAIMED, dir=path.parent))
    safe_files.write_text(staging / OWNER, "written by eigtrain's Checkpointer\n")
    staging.chmod(0o755)  # mkdtemp makes it private
    os.rename(staging, path)
    return ""


UNCLAIMED, DISCARDED = ".claiming", ".discarded"  # step directories being made / deleted, left only by a kill


def _discard(path: Path) -> None:
    """Delete one of eigtrain's step directories: renamed out of the step-N names first, so that a kill mid-delete
    leaves no step-N without its ownership file (a restart would have to refuse it as someone else's)."""
    doomed = path.with_name(f".{path.name}.{os.getpid()}{DISCARDED}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _remove_unclaimed(root: Path) -> None:
    """Delete what killed saves and prunes left: dot-named step directories being made (holding at most the
    ownership file) or being deleted (eigtrain's by their ownership file or marker)."""
    for stale in [*root.glob(f".step-*{UNCLAIMED}"), *root.glob(f".step-*{DISCARDED}")]:
        if not stale.is_dir() or stale.is_symlink():
            continue
        made = stale.name.endswith(UNCLAIMED) and {p.name for p in stale.iterdir()} <= {OWNER}
        if made or (stale.name.endswith(DISCARDED) and is_ours(stale)):
            shutil.rmtree(stale, ignore_errors=True)


def _delete(paths: list[Path]) -> list[Path]:
    """Delete the step directories eigtrain wrote and no reader holds (eigtrain.runs.lock); warn about (and keep) any
    other."""
    from eigtrain.runs.lock import unpinned

    deleted = []
    for p in paths:
        if not is_ours(p):
            log.warning("%s was not written by eigtrain (no %s or %s in it): left as it is", p, OWNER, MARKER)
            continue
        with unpinned(p) as free:
            if free:
                _discard(p)
                deleted.append(p)
            else:
                log.warning("%s is being read (eigtrain-rr or -eval): kept; a later save prunes it", p)
    return deleted


def prune(root: Path, keep_last: int, upto: int | None = None) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints, and any incomplete directory
    (a save that died) older than the newest complete one; only directories eigtrain wrote. Returns what was
    deleted. ``upto``: the step just saved; newer steps (one that failed verification, left by the resume that fell
    back before it) are neither counted nor deleted, so the step just saved is always kept."""
    done = [(s, p) for s, p in complete_checkpoints(root) if upto is None or s <= upto]
    if not done:
        return []
    newest = done[-1][0]
    doomed = [p for _, p in done[: max(0, len(done) - keep_last)]] if keep_last > 0 else []
    doomed += [p for s, p in _step_dirs(root) if s < newest and not is_complete(p)]
    return _delete(doomed)


def remove_incomplete(root: Path) -> list[Path]:
    """Delete every directory eigtrain wrote without the marker (left by a killed run; never resumed from)."""
    return _delete([p for _, p in _step_dirs(root) if not is_complete(p)])


# -- the checkpointer ------------------------------------------------------------------------------
def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class Checkpointer:
    """Collects the engine state, trainer counters and per-rank state into ``root/step-N/``, and decides when:
    every ``cfg.checkpoint_every`` steps, at the last step, and at once on a stop signal (polled across ranks every
    ``cfg.signal_check_every`` steps); keeps ``cfg.keep_last``. `cfg`: the training config (its keys' defaults and
    docs: eigtrain.schema.TrainConfig; the composed DictConfig reads the same)."""

    def __init__(self, root: Path, engine: Any, cfg: TrainConfig, *, rank: int = 0, world_size: int = 1):
        self.root, self.engine, self.keep_last = Path(root), engine, cfg.keep_last
        self.rank, self.world_size = rank, world_size
        self.every, self.signal_check_every = cfg.checkpoint_every, cfg.signal_check_every
        self.stop_requested = False  # a stop signal reached every rank: save now, then leave
        self.last_saved: Path | None = None  # the newest complete checkpoint: written or resumed from
        self._periodic_waiting = False  # a periodic save not yet written (it waits for an applied update)
        self._polled_step: int | None = None

    def due(self, step: int, last_step: int) -> bool:
        """Whether ``step`` asks for a save: periodic (or one still waiting), the last step, or a stop signal. Call
        on every rank at every step (the same answer everywhere): it polls the stop flag, a collective every
        ``signal_check_every`` steps in a process group; a second call at the same step polls nothing."""
        if self._polled_step != step:
            from eigtrain.dist import stop_requested

            self._polled_step = step
            self.stop_requested = stop_requested(poll=step % self.signal_check_every == 0)
            self._periodic_waiting |= bool(self.every) and step % self.every == 0
        return self._periodic_waiting or step == last_step or self.stop_requested

    def should_save(self, step: int, last_step: int, applied: torch.Tensor | bool = True) -> bool:
        """Whether to save after ``step``: when `due`, unless only a periodic save asks and the step's update was
        not ``applied`` (after a skipped update the model's statistics may be NaN: the save waits for the next
        applied one). The last step and a stop signal save regardless. ``applied`` (a device tensor) is read only
        when a periodic save waits on it."""
        save = self.due(step, last_step) and (step == last_step or self.stop_requested or bool(applied))
        self._periodic_waiting &= not save
        return save

    def save(self, step: int, trainer_state: Mapping[str, Any], rank_state: Mapping[str, Any]) -> Path:
        path = step_dir(self.root, step)
        from eigtrain.dist import broadcast_object

        # Rank 0 makes the directory; the others wait for its answer (a refusal stops every rank, none hangs).
        refused = broadcast_object(_claim_step_dir(path) if self.rank == 0 else None)
        if refused:
            raise FileExistsError(refused)
        self.engine.save(path, client_state=trainer_state)
        with safe_files.atomic_open(path / f"rank-{self.rank}.pt", "wb") as f:
            torch.save(dict(rank_state), f)
        if self.rank == 0:
            safe_files.write_text(path / "trainer.json", json.dumps(dict(trainer_state), indent=1))
        # Each rank flushes what it wrote (a shared filesystem syncs a file from the node that wrote it), then
        # the directories: only then may the marker say "complete".
        fsync_tree(path)
        _barrier()  # every rank finished writing, durably
        if self.rank == 0:
            checksums = write_checksums(path, skip=(OWNER, MARKER))
            mark_complete(path, {"step": step, "world_size": self.world_size, "checksums": checksums})
            prune(self.root, self.keep_last, upto=step)
        self.last_saved = path
        return path

    def resume(self) -> tuple[Path | None, dict[str, Any], dict[str, Any]]:
        """Rank 0 picks the newest complete checkpoint that verifies (deleting partial ones; one that fails its
        checksums is skipped with a warning) and tells the other ranks; every rank restores the engine from it.
        Returns (path or None, trainer_state, this rank's state)."""
        from eigtrain.dist import broadcast_object

        if self.rank == 0:
            remove_incomplete(self.root)
        latest = broadcast_object(str(newest_verified(self.root) or "") if self.rank == 0 else None)
        self.last_saved = Path(latest) if latest else None
        return (self.last_saved, *self.load(self.last_saved)) if self.last_saved else (None, {}, {})

    def load(self, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore the engine from ``path``; return (trainer_state, this rank's state)."""
        path = Path(path)
        self.engine.load(path)
        trainer_state = read_json(path / "trainer.json")
        saved_world = read_json(path / MARKER).get("world_size")
        if saved_world == self.world_size:
            return trainer_state, load_tensors(path / f"rank-{self.rank}.pt")
        # Another world size (e.g. a requeued job on fewer nodes): the data cursor carries over (the stream
        # re-plans the rest of the epoch) but per-rank RNG streams cannot, so the resume is not exact.
        log.warning(
            "checkpoint %s was written by %s ranks, this run has %d: resuming, but not exactly",
            path,
            saved_world,
            self.world_size,
        )
        return trainer_state, {"data": load_tensors(path / "rank-0.pt")["data"]}


# -- trained weights -------------------------------------------------------------------------------
EXPORT_NAME = "model.safetensors"
MODEL_INFO_NAME = "model.json"  # input shapes the encoder was built for


def export_model(path: Path, state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, Any]) -> None:
    """The trained weights as safetensors; metadata values are stored as JSON strings."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    meta = {k: json.dumps(v) for k, v in metadata.items()}
    safe_files.write_with(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_encoder(run_dir: Path, step_path: Path | None = None) -> torch.nn.Module:
    """The trained encoder of a run (eval mode): architecture from ``run_dir/config.yaml`` and
    ``run_dir/model.json`` (input shapes), weights from ``run_dir/model.safetensors`` or, if given,
    a checkpoint directory."""
    from safetensors.torch import load_file

    from eigtrain.models import build_encoder
    from eigtrain.runs.saved_config import load_saved_config

    run_dir = Path(run_dir)
    cfg = load_saved_config(run_dir / "config.yaml")
    shapes = read_json(run_dir / MODEL_INFO_NAME)
    model = build_encoder(typed(ModelConfig, cfg.model), cfg.dim, shapes["input_shape"], shapes["context_shape"])
    source = Path(step_path) if step_path is not None else run_dir / EXPORT_NAME
    if step_path is None and not source.exists():
        raise FileNotFoundError(f"{source} does not exist: the run has not finished (pass a checkpoint directory)")
    weights = model_weights(source) if step_path is not None else None
    with reading(source):  # safetensors is plain data; a file of other weights fails here, in one line
        model.load_state_dict(weights if weights is not None else load_file(str(source)))
    return model.eval()


def read_encoder(run_dir: Path, step_path: Path | None) -> tuple[torch.nn.Module, str]:
    """`load_encoder` and the sha256 of the weights read (the export file, or every file of the step), the step
    pinned meanwhile so that a trainer still pruning this run cannot delete it mid-read (eigtrain.runs.lock)."""
    from eigtrain.runs.checkpoint_read import CheckpointReadError
    from eigtrain.runs.checksums import file_sha256, files_sha256
    from eigtrain.runs.lock import pinned

    if step_path is None:
        return load_encoder(run_dir, None), file_sha256(Path(run_dir) / EXPORT_NAME)
    with pinned(step_path) as present:
        if not present:
            raise CheckpointReadError(step_path, "pruned by the trainer before it could be read; run the command again")
        return load_encoder(run_dir, step_path), files_sha256(step_path)
