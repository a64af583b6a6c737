"""A checkpoint's DCP `.metadata` is read by an unpickler that builds exact (module, name) pairs only (issue 51 §1):
the review's reproducer (pickle protocol 4 resolving `os.system` as a dotted name through DCP's metadata module) and
variants it did not name run nothing and are refused in one line; real metadata still loads."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from eigtrain.runs.checkpoint_read import CheckpointReadError, SafeFileSystemReader


def _short(text: bytes) -> bytes:
    return b"\x8c" + bytes([len(text)]) + text  # SHORT_BINUNICODE


def _calling(module: str, name: str, argument: str) -> bytes:
    """A protocol-4 pickle that calls module.name(argument) (STACK_GLOBAL, TUPLE1, REDUCE), then a STOP."""
    return (
        b"\x80\x04" + _short(module.encode()) + _short(name.encode()) + b"\x93" + _short(argument.encode()) + b"\x85R."
    )


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("torch.distributed.checkpoint.metadata", "os.system"),  # the review's reproducer
        ("pathlib", "os.system"),  # an allowed module, a dotted name through its own `os`
        ("torch", "serialization.os.system"),  # torch's dtype lookup, a dotted path
        ("collections", "OrderedDict.fromkeys"),  # an allowed class, one of its methods
        ("torch.distributed.checkpoint.metadata", "field"),  # a name the metadata module imported, not a class of it
        ("os", "system"),
    ],
)
def test_a_planted_global_runs_nothing_and_is_one_line(tmp_path, module, name):
    marker = tmp_path / "code-ran"
    (tmp_path / ".metadata").write_bytes(_calling(module, name, f"touch {marker}"))
    with pytest.raises(CheckpointReadError, match=r"cannot read .*\.metadata: .*is not checkpoint metadata"):
        SafeFileSystemReader(str(tmp_path)).read_metadata()
    assert not marker.exists()


def test_real_metadata_still_loads(tmp_path):
    dcp.save({"model": {"w": torch.ones(3, 2, dtype=torch.bfloat16)}}, checkpoint_id=str(tmp_path), no_dist=True)
    metadata = SafeFileSystemReader(str(tmp_path)).read_metadata()
    assert list(metadata.state_dict_metadata["model.w"].size) == [3, 2]
