"""Directories eigtrain writes into (run directories, evaluation reports): it claims a directory only when it is
new, empty, or already eigtrain's, so that it never overwrites or deletes what it did not write.

A run directory is eigtrain's once it holds ``.eigtrain-run`` (written when a run first claims it), or -- for runs
made before that mark -- when everything in it is a name eigtrain writes there. Anything else is refused with one
line, before any work and with nothing changed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from eigtrain import safe_files

RUN_MARK = ".eigtrain-run"
# What eigtrain itself puts into a run directory (trainer, launcher, eigtrain-rr/-eval defaults).
RUN_ENTRIES = frozenset(
    {
        RUN_MARK,
        "config.yaml",
        "model.json",
        "environment.json",
        "wandb_id",
        "metrics.jsonl",
        "model.safetensors",
        "model.tmp",
        "checkpoints",
        "data",
        "wandb",
        "slurm",
        "rr",
        "eval",
        ".eigtrain-lock",  # the trainer's lock (eigtrain.runs.lock)
        "lineage.jsonl",  # resumes that started a new lineage (eigtrain.runs.lineage)
        "checksums.json",  # the sha256 of model.safetensors (eigtrain.runs.checkpoint_verify.record_file)
        ".eigtrain-key",  # the run's identity key (eigtrain.runs.lineage.run_key)
    }
)
EVAL_ENTRIES = frozenset(
    {"table.md", "table.csv", "report.json", "accuracy_vs_dim.png", "retrieval_vs_dim.png", "retrieval_funnels.png"}
)
# eigtrain-embed's fixed names; its chunks (rank-R-chunk-IIIII.safetensors) are matched by eigtrain.export.corpus
EMBED_ENTRIES = frozenset({"manifest.json", ".manifest.json.tmp"})


class OutputDirError(FileExistsError, ValueError):
    """A directory eigtrain must not write into: the message names it and what is in it (a ValueError too, so
    that every command's one-line error handling reports it)."""


def foreign_entries(directory: str | os.PathLike, own: Iterable[str]) -> list[str]:
    """Names in `directory` that are not among `own` (sorted); [] for a missing or empty directory."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    own = set(own)
    return sorted(
        p.name for p in directory.iterdir() if p.name not in own and safe_files.temporary_of(p.name) not in own
    )


def _listing(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_output_dir(directory: str | os.PathLike, own: Iterable[str], key: str) -> None:
    """Refuse (OutputDirError) a `directory` that is a file or holds anything but the names in `own`."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputDirError(f"{key}={directory} is a file, not a directory: refusing to replace it")
    foreign = foreign_entries(directory, own)
    if foreign:
        raise OutputDirError(
            f"{key}={directory} holds files eigtrain did not write ({_listing(foreign)}): refusing "
            f"to write into it (nothing was changed there); choose a new or empty directory"
        )


def claim_run_dir(run_dir: str | os.PathLike, launcher_folder: str | None = None) -> str:
    """Make `run_dir` (rank 0, before anything is written there) and mark it eigtrain's; '' when done, or the one
    line saying why not (a directory holding what eigtrain did not write is left as it is). `launcher_folder`: the
    Slurm launcher's log folder, written before the job starts (eigtrain's too when it lies in `run_dir`)."""
    run_dir = Path(run_dir)
    mark = run_dir / RUN_MARK
    if mark.is_file() and not mark.is_symlink():  # a link is no mark: whoever planted it is not eigtrain
        return ""
    own = set(RUN_ENTRIES)
    if launcher_folder and Path(launcher_folder).parent.resolve() == run_dir.resolve():
        own.add(Path(launcher_folder).name)
    try:
        check_output_dir(run_dir, own, "run_dir")
    except OutputDirError as refusal:
        return str(refusal)
    run_dir.mkdir(parents=True, exist_ok=True)
    safe_files.write_text(run_dir / RUN_MARK, "an eigtrain run directory: eigtrain writes, resumes and prunes here\n")
    return ""
