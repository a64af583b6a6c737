"""eigtrain-train's expected failures, each as the one line the user sees (naming the cause, never a traceback);
anything else propagates as it is."""

from __future__ import annotations

import shutil

from eigtrain.data import CorruptDataError, ShardError
from eigtrain.safe_files import OutputError
from eigtrain.schema import ConfigError
from eigtrain.train.state import NonFiniteError


def failure_line(exn: BaseException, run_dir: str) -> str | None:  # noqa: PLR0911
    """The one line for an expected failure of a run in `run_dir`, or None (let it propagate)."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(exn, ConfigError):
        return f"eigtrain-train: config error: {exn}"
    if isinstance(exn, (CorruptDataError, NonFiniteError)):  # past data.max_corrupt / max_nonfinite_steps
        return f"eigtrain-train: {exn}"
    if isinstance(exn, (ShardError, TimeoutError)):  # a shard that cannot be read, a stalled source: naming it
        return f"eigtrain-train: data error: {exn}"
    if isinstance(exn, ConnectionError) or (isinstance(exn, RuntimeError) and "DataLoader worker" in str(exn)):
        return _dead_worker(exn)  # e.g. the OOM killer took a reader: its queue breaks, or the loader says so
    if isinstance(exn, OutputError):  # eigtrain.safe_files': its message names the file and the cause
        return f"eigtrain-train: {exn.strerror}"
    if isinstance(exn, OSError):  # a full disk, a read-only run directory: naming the file
        return f"eigtrain-train: cannot write {exn.filename or 'the run'}: {exn.strerror or exn}"
    if isinstance(exn, ValueError):  # found once the data is read (e.g. too few samples for one batch per worker)
        return f"eigtrain-train: {exn}"
    if isinstance(exn, CheckpointException) and any("DataLoader worker" in str(e) for e, _ in exn.failures.values()):
        return _dead_worker(next(e for e, _ in exn.failures.values() if "DataLoader worker" in str(e)))  # (mid-save)
    if isinstance(exn, CheckpointException):  # torch.distributed.checkpoint's, one per failed rank; a full disk
        errors = {f"{type(e).__name__}: {str(e).splitlines()[0]}" for e, _ in exn.failures.values()}
        free = shutil.disk_usage(run_dir).free
        return (
            f"eigtrain-train: cannot write a checkpoint in {run_dir} ({free} bytes free there): "
            f"{'; '.join(sorted(errors))}"
        )
    return None


def _dead_worker(exn: BaseException) -> str:
    """The line for a data worker that died mid-run. The loader's own finalizer would then print its traceback as the
    process ends ("Exception ignored in ... __del__"): silenced, the one line says it all."""
    import sys

    sys.unraisablehook = lambda unraisable: None
    what = str(exn).splitlines()[0].rstrip(". ") if str(exn) else type(exn).__name__
    return (
        f"eigtrain-train: data error: {what}: a data worker died (killed for memory?); run the same command again "
        f"to resume from the last checkpoint, with fewer data.num_workers if it recurs"
    )


def quiet_sharer_reports() -> None:
    """A data worker killed while it fetched a shared tensor's file descriptor breaks multiprocessing's resource
    sharer connection in this process, and the sharer's thread reports that through sys.excepthook as a traceback,
    while the run goes on to name the dead worker in one line (`_dead_worker`). Such reports are dropped; any other
    goes to the hook as before. Installed once."""
    import sys

    previous = sys.excepthook
    if getattr(previous, "quiets_sharer", False):
        return

    def hook(kind, value, tb):
        if issubclass(kind, (OSError, EOFError)) and _raised_in(tb, "multiprocessing/resource_sharer.py"):
            return
        previous(kind, value, tb)

    hook.quiets_sharer = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _raised_in(tb, file: str) -> bool:
    """Whether a frame of the traceback runs in `file` (a path's tail)."""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(file):
            return True
        tb = tb.tb_next
    return False
