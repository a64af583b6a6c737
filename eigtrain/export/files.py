"""Ordered-embedding export: `rr.safetensors` + `manifest.json` (+ an eigenvalue-decay plot), and the
loader that turns an export into a truncatable head z -> (z - mean) @ transform[:, :k]."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

from eigtrain import safe_files
from eigtrain.export.prefixes import spectral_k_report
from eigtrain.export.raw_span import DerivedPaper, paper_from_export
from eigtrain.export.rayleigh_ritz import IN_SPAN_TOL, RRResult
from eigtrain.redact import redact_config
from eigtrain.runs.checksums import file_sha256
from eigtrain.runs.lock import RunDirInUse, lock_directory, release_directory

TENSORS = "rr.safetensors"
MANIFEST = "manifest.json"
DECAY_PLOT = "eigenvalues.png"
EXPORT_FILES = (TENSORS, MANIFEST, DECAY_PLOT)
EXPORT_FORMAT = "eigtrain-rr-export-v1"  # manifest["format"]: the positive mark of a directory eigtrain-rr wrote
_LEGACY_KEYS = {"source", "n", "mode", "dim", "num_features", "tensors"}  # manifests written before the mark
INPUTS = ("raw", "l2_normalized")  # what the head is applied to: source["input"] (eigtrain.export.embed.objective_view)


class ExportTargetError(FileExistsError, ValueError):
    """`out=` names something eigtrain must not replace: the message says what and how to proceed."""


def is_export(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory eigtrain-rr wrote: its manifest carries eigtrain's format tag (or, for
    exports made before the tag, its keys) and it holds nothing but the export's own files."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        names = {p.name for p in path.iterdir()}
    except (OSError, ValueError):
        return False
    own = manifest.get("format") == EXPORT_FORMAT if isinstance(manifest, dict) else False
    legacy = isinstance(manifest, dict) and _LEGACY_KEYS <= manifest.keys() and TENSORS in names
    return (own or legacy) and names <= set(EXPORT_FILES)


def check_export_target(out_dir: str | os.PathLike, overwrite: bool) -> None:
    """Refuse (ExportTargetError, one line) an `out=` that is not free: anything but a missing path, an empty
    directory or -- with overwrite=true -- an earlier export. Called before any work and again on saving."""
    out = Path(out_dir)
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    if not is_export(out) or out.is_symlink():
        raise ExportTargetError(
            f"out={out} exists and is not an eigtrain-rr export: refusing to replace it "
            f"(nothing was changed there); choose a new or empty directory"
        )
    if not overwrite:
        raise ExportTargetError(f"out={out} already holds an eigtrain-rr export; pass overwrite=true to replace it")


@contextlib.contextmanager
def claimed_target(out_dir: str | os.PathLike | None, overwrite: bool, rank: int) -> Iterator[None]:
    """Check `out=` before any work (`check_export_target`) and, on rank 0, hold it for the whole job: an exclusive
    flock on the directory (made empty when missing), so a second eigtrain-rr into the same out= is refused in one
    line at its start instead of replacing the first one's export at its end. An empty directory this job made is
    removed when the job fails (rmdir: never a directory with anything in it)."""
    if out_dir is None:
        yield
        return
    out = Path(out_dir)
    check_export_target(out, overwrite)
    if rank != 0:
        yield
        return
    made = not out.exists()
    safe_files.make_dir(out)
    try:
        lock = lock_directory(out)
    except RunDirInUse:
        raise ExportTargetError(
            f"out={out} is being written by another eigtrain-rr: wait for it to end, or choose another out="
        ) from None
    try:
        yield
    finally:
        release_directory(lock)
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()  # only the empty directory a failed job leaves; the export (not empty) stays


def save_export(
    result: RRResult, out_dir: str | os.PathLike, source: dict, plot: bool = True, overwrite: bool = False
) -> Path:
    """Write the export; `source` describes what was reduced (kind, path, sha256, ...; URLs are redacted). The
    directory appears only when complete: it is written beside its final place and renamed into it. An earlier
    export there is replaced only with `overwrite` (and removed only once the new one is in place); anything
    else there is refused (`check_export_target`)."""
    out = Path(out_dir)
    check_export_target(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        _write_export(result, staging, source, plot)
        staging.chmod(0o755)  # mkdtemp makes it private
        if overwrite and out.exists() and any(out.iterdir()):
            old = out.with_name(f".{out.name}.{os.getpid()}.old")
            out.rename(old)
            staging.rename(out)
            _remove_export(old)
        else:
            _rename_no_replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)  # made by mkdtemp above: wholly this call's
    return out


def _rename_no_replace(staging: Path, out: Path) -> None:
    """Move the finished export to a missing path or over an empty directory; a directory someone filled meanwhile
    (the kernel refuses to rename over a non-empty one) is one line, and stays as it is."""
    try:
        staging.rename(out)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        raise ExportTargetError(
            f"out={out} was filled by another writer while this export was made: it is left as it is; run again "
            f"with another out= (or overwrite=true to replace an export)"
        ) from None


def _remove_export(path: Path) -> None:
    """Delete an export directory eigtrain wrote: its own files only (rmdir fails on anything else)."""
    for name in EXPORT_FILES:
        (path / name).unlink(missing_ok=True)
    path.rmdir()


def _write_export(result: RRResult, out: Path, source: dict, plot: bool) -> None:
    tensors = {"eigenvalues": result.eigenvalues, "transform": result.transform, "mean": result.mean}
    if result.right_transform is not None:
        assert result.right_mean is not None  # the pairs case sets both
        tensors.update(right_transform=result.right_transform, right_mean=result.right_mean)
    tensors.update(_trivial_tensors(result))
    head_input = source.get("input", "raw")
    if head_input not in INPUTS:
        raise ValueError(f"source input={head_input!r} is unknown; allowed: {', '.join(INPUTS)}")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(out / TENSORS), {"input": head_input})
    manifest = {
        "format": EXPORT_FORMAT,
        "input": head_input,
        "source": redact_config(source),
        "n": result.n,
        "mode": result.mode,
        "dim": int(result.transform.shape[0]),
        "num_features": int(result.transform.shape[1]),
        "dim_right": int(result.right_transform.shape[0]) if result.right_transform is not None else None,
        "dtype": str(result.transform.dtype).replace("torch.", ""),
        "eigenvalues": [float(v) for v in result.eigenvalues],
        "tensors": sorted(tensors),
        "sha256": {
            TENSORS: file_sha256(out / TENSORS)
        },  # load_head verifies it: an rr.safetensors swapped in is refused
        **rr_manifest(result),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if plot:
        plot_decay(result.eigenvalues, out / DECAY_PLOT, title=f"Rayleigh-Ritz ({result.mode}), n={result.n}")


def _trivial_tensors(result: RRResult) -> dict:
    """The excluded constant mode (eigenvalue 1 and its read-out z @ trivial_transform ~ 1) and, when the export
    excludes it, the paper's convention solved on the same moments (paper_*: the constant kept as feature 1)."""
    tensors = {}
    if result.trivial is not None:
        tensors["trivial_eigenvalue"] = torch.tensor([result.trivial["eigenvalue"]], dtype=result.eigenvalues.dtype)
        tensors["trivial_transform"] = result.trivial["transform"]
        if result.trivial.get("right_transform") is not None:
            tensors["trivial_right_transform"] = result.trivial["right_transform"]
    paper = result.extra.get("paper_convention")
    if isinstance(paper, DerivedPaper):  # its features are a function of the export's own tensors (load_head)
        tensors["paper_eigenvalues"] = paper.eigenvalues
    elif paper is not None:
        tensors.update(paper_eigenvalues=paper.eigenvalues, paper_transform=paper.transform, paper_mean=paper.mean)
        if paper.right_transform is not None:
            tensors.update(paper_right_transform=paper.right_transform, paper_right_mean=paper.right_mean)
    return {k: v.clone() for k, v in tensors.items()}  # safetensors refuses tensors sharing memory (means)


def rr_manifest(result: RRResult) -> dict:
    """The manifest's Rayleigh-Ritz facts: the trivial mode, how the dimensions were spent, the spectrum's k."""
    trivial = {"handling": "keep" if result.trivial is None else "exclude"}
    if result.trivial is not None:
        trivial.update({k: v for k, v in result.trivial.items() if not isinstance(v, torch.Tensor)})
        trivial["in_span"] = result.trivial["residual"] <= IN_SPAN_TOL
    return {
        "trivial": trivial,
        "dimensions": result.dims,
        "spectral_k": spectral_k_report(result.eigenvalues),
        "cuts": result.extra.get("cuts"),  # which cuts the data determine (rr_prefixes.cuts_report)
        "ties": result.extra.get("ties"),  # ties=variance: the groups reordered by variance
        "spectrum": [float(v) for v in result.extra.get("spectrum", result.eigenvalues)],  # the solve's, descending
        "exact_spectrum": _floats(result.extra.get("exact_spectrum")),  # ridge > 0: the unregularized one
    }


def _floats(values) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


def warm_plot_imports() -> None:
    """Import what `plot_decay` needs and load matplotlib's font cache (a background thread's work)."""
    from matplotlib import font_manager
    from matplotlib.backends import backend_agg  # noqa: F401

    font_manager.findfont("DejaVu Sans")


def plot_decay(eigenvalues: torch.Tensor, path: str | os.PathLike, title: str = "") -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: no backend or figure manager to load
    from matplotlib.figure import Figure

    values = eigenvalues.detach().cpu().double().numpy()
    fig = Figure(figsize=(5, 3.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3)
    ax.set_xlabel("index i")
    ax.set_ylabel("eigenvalue / singular value")
    if (values > 0).all() and values.max() / values.min() > 50:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def _verify_tensors(file: Path) -> None:
    """ValueError (one line) when the export's manifest recorded rr.safetensors' sha256 and the file differs (another
    export's tensors swapped in, or corruption); exports from before the record are read as they are."""
    try:
        recorded = json.loads((file.parent / MANIFEST).read_text()).get("sha256", {}).get(file.name)
    except (OSError, ValueError, AttributeError):
        return
    if recorded is not None and file_sha256(file) != recorded:
        raise ValueError(
            f"{file} does not match the sha256 its {MANIFEST} recorded (replaced or changed since eigtrain-rr wrote "
            f"it): run eigtrain-rr again"
        )


class OrderedHead(nn.Module):
    """z -> (z - mean) @ transform[:, :k]: the first k ordered features, for any k. l2_normalize: the export was
    solved on z / ||z|| (a run whose objective normalizes, e.g. SCL): the head normalizes z first (idempotent)."""

    transform: torch.Tensor  # buffers
    mean: torch.Tensor
    eigenvalues: torch.Tensor

    def __init__(
        self, transform: torch.Tensor, mean: torch.Tensor, eigenvalues: torch.Tensor, l2_normalize: bool = False
    ):
        super().__init__()
        self.register_buffer("transform", transform)
        self.register_buffer("mean", mean)
        self.register_buffer("eigenvalues", eigenvalues)
        self.l2_normalize = l2_normalize

    def forward(self, z: torch.Tensor, k: int | None = None) -> torch.Tensor:
        if k is not None and not 1 <= k <= self.transform.shape[1]:
            raise ValueError(f"k={k} must lie in 1..{self.transform.shape[1]}")
        t = self.transform[:, :k]
        z = z.to(t.dtype)
        if self.l2_normalize:
            z = F.normalize(z, dim=-1)
        return (z - self.mean) @ t


def _paper_tensors(t: dict, file: Path) -> dict:
    """The paper convention's tensors: stored (paper_*), or derived from the export's (`DerivedPaper`), its
    eigenvalues held to the ones the export stored."""
    if "paper_transform" in t:
        return {k.removeprefix("paper_"): v for k, v in t.items() if k.startswith("paper_")}
    values, transform = paper_from_export(t["eigenvalues"], t["transform"], t["mean"])
    stored = t["paper_eigenvalues"].double()
    if not torch.allclose(values, stored, rtol=0, atol=1e-9 * max(1.0, float(stored.abs().max()))):
        raise ValueError(f"{file}: the paper convention derived from the export does not give its stored eigenvalues")
    return {"eigenvalues": values, "transform": transform, "mean": torch.zeros_like(t["mean"], dtype=torch.float64)}


def load_head(
    path: str | os.PathLike, side: str = "left", dtype: torch.dtype = torch.float32, convention: str = "export"
) -> OrderedHead:
    """Load an export directory (or its rr.safetensors) as an OrderedHead; side='right' for svd's a-side.
    convention='paper': the paper's convention stored beside an export that excludes the trivial mode."""
    path = Path(path)
    file = path / TENSORS if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no Rayleigh-Ritz export at {file}")
    _verify_tensors(file)
    try:
        t = load_file(str(file))
        with safe_open(str(file), "pt") as f:  # exports before the input was recorded: raw
            normalized = (f.metadata() or {}).get("input", "raw") == "l2_normalized"
    except SafetensorError as error:  # truncated, empty, or not safetensors at all (never unpickled)
        raise ValueError(f"cannot read {file}: {error}") from None
    if convention == "paper":
        if "paper_eigenvalues" not in t:
            raise ValueError(f"{file} holds no paper-convention tensors (it was exported with trivial=keep)")
        t = _paper_tensors(t, file)
    elif convention != "export":
        raise ValueError(f"convention={convention!r} is unknown; allowed: export, paper")
    if side == "right":
        if "right_transform" not in t:
            raise ValueError(f"{file} has no right-side tensors (it was not exported in svd mode)")
        return OrderedHead(
            t["right_transform"].to(dtype), t["right_mean"].to(dtype), t["eigenvalues"].to(dtype), normalized
        )
    return OrderedHead(t["transform"].to(dtype), t["mean"].to(dtype), t["eigenvalues"].to(dtype), normalized)
