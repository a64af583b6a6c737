"""Reading checkpoint files without running code from them: a run directory may come from anyone.

Every file eigtrain reads from a checkpoint is plain data: JSON, safetensors, or a pickle opened by an unpickler
that builds only tensors and a fixed list of plain classes (``torch.load(weights_only=True)``; DCP's ``.metadata``
through `_MetadataUnpickler`). DeepSpeed's ZeRO-3 consolidation (``zero_to_fp32``) is run with its ``torch.load``
replaced by a weights-only one. A file that cannot be read so is refused with one line, `CheckpointReadError`:
"cannot read <file>: <why>".
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element  # the helper DefaultLoadPlanner itself uses
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

DEEPSPEED_ZERO12 = "mp_rank_00_model_states.pt"  # ZeRO-1/2: rank 0 wrote the whole module
DEEPSPEED_ZERO3 = "zero_pp_rank_*_model_states.pt"  # ZeRO-3: one partition per rank


class CheckpointReadError(ValueError):
    """A checkpoint file that cannot be read (missing, truncated, corrupt, or not plain data): one line naming it. A
    ValueError, so that every command's one-line error handling reports it (and the trainer's never calls it a
    write error)."""

    def __init__(self, path: Path | str, why: Any):
        reason = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
        super().__init__(f"cannot read {path}: {reason}")
        self.path = Path(path)


@contextlib.contextmanager
def reading(path: Path | str):
    """Any failure inside becomes CheckpointReadError naming `path` (a file the block reads)."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name

    try:
        yield
    except CheckpointReadError:
        raise
    except CheckpointException as error:  # DCP's, one wrapped exception per failed rank: the first one's cause
        cause = next(iter(error.failures.values()))[0]
        if isinstance(cause, CheckpointReadError):
            raise cause from None
        raise CheckpointReadError(path, f"{type(cause).__name__}: {cause}") from None
    except pickle.UnpicklingError as error:
        if "Weights only load failed" in str(error):  # torch's long advice to load it unsafely: not ours to give
            raise CheckpointReadError(
                path, "not plain tensors and data (a pickle that could run code): refused"
            ) from None
        raise CheckpointReadError(path, f"{type(error).__name__}: {error}") from None
    except Exception as error:  # JSON, DCP, safetensors, truncation: each library raises its own kind
        raise CheckpointReadError(path, f"{type(error).__name__}: {error}") from None


def read_json(path: Path) -> Any:
    with reading(path):
        return json.loads(Path(path).read_text())


def load_tensors(path: Path, map_location: Any = "cpu", **kwargs) -> Any:
    """A torch.save file as plain data (tensors, numbers, strings, containers) and DeepSpeed's few plain classes."""
    with reading(path), torch.serialization.safe_globals(_deepspeed_plain_classes()):
        return torch.load(path, map_location=map_location, weights_only=True, **kwargs)


def _deepspeed_plain_classes() -> list:
    try:  # the three plain DeepSpeed classes a ZeRO checkpoint holds (eigtrain.engine.deepspeed_zero)
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return []
    return [LossScaler, ZeroStageEnum, fragment_address]


# -- torch.distributed.checkpoint ------------------------------------------------------------------
class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` is a pickle (its own reader unpickles it with no restriction): build only DCP's metadata
    classes, torch sizes, dtypes, layouts and paths. Every global is an exact (module, name) pair: a name with a dot
    is refused whatever its module (pickle protocol 4 resolves ``os.system`` as an attribute path through any module
    that imported os), and a name of DCP's metadata module counts only when it is a class that module defines."""

    _METADATA_MODULE = "torch.distributed.checkpoint.metadata"
    _NAMES = {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name and ((module, name) in self._NAMES or self._metadata_class(module, name)):
            return super().find_class(module, name)
        if "." not in name and module == "torch":
            found = getattr(torch, name, None)
            if isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not checkpoint metadata (refused: it could run code)")

    def _metadata_class(self, module: str, name: str) -> bool:
        if module != self._METADATA_MODULE:
            return False
        import torch.distributed.checkpoint.metadata as metadata

        found = getattr(metadata, name, None)
        return isinstance(found, type) and found.__module__ == module


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata is read by `_MetadataUnpickler`; tensors DCP loads weights-only itself, and
    byte entries go through the caller's weights-only planner (WeightsOnlyLoadPlanner below)."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        path = Path(self.path) / ".metadata"
        with reading(path), open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
            if not isinstance(metadata, Metadata):
                raise ValueError(f"holds a {type(metadata).__name__}, not DCP metadata")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def dcp_model_weights(step_path: Path) -> dict[str, torch.Tensor]:
    """The model entries ("model.*") of a DCP checkpoint, read into tensors of the recorded shapes (no module needed;
    the optimizer's entries are not read)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = SafeFileSystemReader(str(step_path))
    entries = reader.read_metadata().state_dict_metadata
    model = {
        fqn.removeprefix("model."): torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for fqn, md in entries.items()
        if fqn.startswith("model.") and isinstance(md, TensorStorageMetadata)
    }
    if not model:
        raise CheckpointReadError(Path(step_path) / ".metadata", "no model weights recorded")
    with reading(step_path), single_process_ok():
        dcp.load({"model": model}, storage_reader=reader, planner=WeightsOnlyLoadPlanner(), no_dist=True)
    return model


# -- DeepSpeed ---------------------------------------------------------------------------------------
class _WeightsOnlyTorch:
    """`torch` as DeepSpeed's zero_to_fp32 module sees it while eigtrain consolidates: every load is weights-only."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def load(f, map_location=None, mmap=None, weights_only=None, **kwargs):
        return load_tensors(Path(f), map_location=map_location or "cpu", mmap=bool(mmap))


def zero3_model_weights(step_path: Path) -> dict[str, torch.Tensor]:
    """ZeRO-3 partitions gathered by DeepSpeed's converter, every file loaded weights-only (`_WeightsOnlyTorch`)."""
    from deepspeed.utils import zero_to_fp32

    if zero_to_fp32.torch is not torch:  # the converter no longer loads through the name we replace: refuse
        raise CheckpointReadError(step_path, "this DeepSpeed's zero_to_fp32 cannot be made weights-only")
    zero_to_fp32.torch = _WeightsOnlyTorch()
    try:
        with reading(step_path):
            return dict(
                zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(step_path.parent), tag=step_path.name)
            )
    finally:
        zero_to_fp32.torch = torch


def model_weights(step_path: Path) -> dict[str, torch.Tensor]:
    """The full model weights stored in a checkpoint directory (DDP/DCP or DeepSpeed ZeRO 1-3), on CPU."""
    step_path = Path(step_path)
    if (step_path / DEEPSPEED_ZERO12).exists():
        state = load_tensors(step_path / DEEPSPEED_ZERO12)
        if not isinstance(state, dict) or not isinstance(state.get("module"), dict):
            raise CheckpointReadError(step_path / DEEPSPEED_ZERO12, "holds no 'module' weights")
        return state["module"]
    if list(step_path.glob(DEEPSPEED_ZERO3)):
        return zero3_model_weights(step_path)
    return dcp_model_weights(step_path)


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner unpickles non-tensor entries (optimizer hyper-parameters) with
    weights_only=False; this one refuses anything but plain data."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


@contextlib.contextmanager
def single_process_ok():
    # Without a process group DCP warns on every call that it assumes a single process: that is intended.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process")
        yield
