"""eigtrain-export's work: a trained run and its Rayleigh-Ritz export as one standalone file (usage and
configuration: eigtrain.export.export_config, checked before this module, and torch, are imported)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eigtrain import safe_files
from eigtrain.export.export_config import FORMATS, USAGE, ExportConfig  # noqa: F401

FORMAT_TAG = "eigtrain-standalone-v1"  # metadata["format"]: the mark of a file eigtrain-export wrote
META_NAME = "eigtrain.json"  # TorchScript extra file / ONNX metadata_props key "eigtrain"
ONNX_META_KEY = "eigtrain"
ONNX_OPSET = 18


class StandaloneModel(nn.Module):
    """images in [0, 1] -> (images - mean) / std -> encoder -> Rayleigh-Ritz head: the ordered features."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, encoder: nn.Module, head: nn.Module, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.encoder, self.head = encoder, head
        self.register_buffer("mean", mean.float().view(1, -1, 1, 1))
        self.register_buffer("std", std.float().view(1, -1, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        z = self.encoder((images - self.mean) / self.std)
        return self.head(z.float())


def build_standalone(run_dir: str | os.PathLike, rr_dir: str | os.PathLike | None = None) -> tuple[nn.Module, dict]:
    """The standalone model of a run (eval mode, CPU) and its metadata. The encoder is read from the very weights
    the Rayleigh-Ritz export was computed from (its manifest's source), checked by their sha256."""
    from eigtrain.export.embed import open_run
    from eigtrain.export.files import MANIFEST, TENSORS, load_head
    from eigtrain.export.run_preprocess import SIMILARITY, normalization, preprocess_spec
    from eigtrain.runs.checksums import file_sha256

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a training run directory (no config.yaml)")
    rr = Path(rr_dir) if rr_dir else run_dir / "rr"
    if not (rr / TENSORS).is_file() or not (rr / MANIFEST).is_file():
        raise FileNotFoundError(
            f"no Rayleigh-Ritz export at {rr} (no {TENSORS} / {MANIFEST}): run eigtrain-rr run_dir={run_dir} first, "
            f"or pass rr=PATH"
        )
    source = _read_manifest(rr / MANIFEST).get("source", {})
    if source.get("kind") != "checkpoint" or not source.get("path"):
        raise ValueError(f"{rr} was not computed from a training run's weights (source kind {source.get('kind')!r})")
    weights = Path(source["path"])
    run = open_run(str(run_dir), str(weights) if weights.is_dir() else None)
    if source.get("sha256") and run.weights_sha256 != source["sha256"]:
        raise ValueError(
            f"{rr} was computed from other weights than {run.weights} holds now (sha256 differs): run eigtrain-rr again"
        )
    shapes = _read_manifest(run_dir / "model.json")
    input_shape = [int(s) for s in shapes["input_shape"]]
    if len(input_shape) != 3:
        raise ValueError(f"{run_dir}'s encoder takes inputs of shape {input_shape}, not images (C, H, W)")
    encoder: nn.Module = getattr(run.encoder, "phi") if run.pairs else run.encoder  # a PairEncoder's image side
    head = load_head(rr, side="left")
    transform, eigenvalues = head.get_buffer("transform"), head.get_buffer("eigenvalues")
    norm = normalization(run)
    model = StandaloneModel(encoder.cpu(), head, torch.tensor(norm["mean"]), torch.tensor(norm["std"])).eval()
    tensors = rr / TENSORS
    metadata = {
        "format": FORMAT_TAG,
        "input": {
            "name": "images",
            "shape": [None, *input_shape],
            "dtype": "float32",
            "layout": "NCHW",
            "range": [0.0, 1.0],
            "normalization": {"mean": list(norm["mean"]), "std": list(norm["std"]), "applied": "inside the model"},
        },
        "output": {"name": "features", "shape": [None, int(transform.shape[1])], "ordered": True},
        "eigenvalues": [float(v) for v in eigenvalues],
        "preprocess": preprocess_spec(run.data, input_shape, norm),  # raw image -> input (eigtrain.export.preprocess)
        "similarity": dict(SIMILARITY),
        "head_input": "l2_normalized" if head.l2_normalize else "raw",
        "source": {
            "run_dir": str(run_dir.resolve()),
            "weights": str(Path(run.weights).resolve()),
            "weights_sha256": run.weights_sha256,
            "rr": str(rr.resolve()),
            "rr_sha256": file_sha256(tensors),
        },
    }
    return model, metadata


def _read_manifest(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object")
    return value


# -- writing -------------------------------------------------------------------------------------------------
def example_input(metadata: dict, batch: int = 2) -> torch.Tensor:
    """A batch of the model's input spec (seeded, in [0, 1]): what tracing runs on."""
    generator = torch.Generator().manual_seed(0)
    return torch.rand(batch, *metadata["input"]["shape"][1:], generator=generator)


def torchscript_bytes(model: nn.Module, metadata: dict) -> bytes:
    """The traced model serialized in memory: torch.jit.save's own file writer aborts the process (SIGABRT, a C++
    frame dump) when the disk fills or `ulimit -f` is reached; eigtrain writes the bytes, one line on failure."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, yet the one torch-only format
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # a ViT's image-size assert: the size is fixed
        traced = torch.jit.trace(model, example_input(metadata), check_trace=False)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer, _extra_files={META_NAME: json.dumps(metadata)})
    return buffer.getvalue()


def require_onnx() -> None:
    """One line before any work when format=onnx cannot be written here (not a ModuleNotFoundError at the end)."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401  (torch's dynamo exporter needs it)
    except ImportError as missing:
        raise ValueError(
            f"format=onnx needs the onnx packages ({missing.name} is not installed): pip install 'eigtrain[onnx]' "
            f"(or format=torchscript, which needs torch alone)"
        ) from None


def onnx_bytes(model: nn.Module, metadata: dict) -> bytes:
    """torch.onnx.export's torch.export-based exporter (dynamo=True; the TorchScript-based one is deprecated): one
    self-contained model with a dynamic batch axis, which onnxruntime loads, serialized in memory with the metadata
    added as metadata_props (eigtrain writes the bytes: one line when the disk fills)."""
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):  # the exporter's progress lines: not our output
        program = torch.onnx.export(
            model,
            (example_input(metadata),),
            input_names=["images"],
            output_names=["features"],
            dynamic_shapes={"images": {0: batch}},
            opset_version=ONNX_OPSET,
            dynamo=True,
            verbose=False,
        )
    assert program is not None  # no file given: the exporter returns the program
    proto = program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = ONNX_META_KEY, json.dumps(metadata)
    return proto.SerializeToString()


def read_metadata(path: str | os.PathLike) -> dict | None:
    """The eigtrain metadata of a file eigtrain-export wrote (either format), or None for any other file. Reads
    the TorchScript archive as a zip and the ONNX file as a protobuf: nothing is executed or unpickled."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = [n for n in archive.namelist() if n.endswith(f"/extra/{META_NAME}")]
                value = json.loads(archive.read(names[0])) if len(names) == 1 else None
        else:
            import onnx

            proto = onnx.load(str(path), load_external_data=False)
            found = [p.value for p in proto.metadata_props if p.key == ONNX_META_KEY]
            value = json.loads(found[0]) if len(found) == 1 else None
    except Exception:  # noqa: BLE001  (any file that is not one of ours, whatever its parser says)
        return None
    return value if isinstance(value, dict) and value.get("format") == FORMAT_TAG else None


def check_target(out: Path, overwrite: bool) -> None:
    """Refuse (FileExistsError, one line) an out= that exists, unless it is an eigtrain-export file and overwrite."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_file() or read_metadata(out) is None:
        raise FileExistsError(
            f"out={out} exists and was not written by eigtrain-export: refusing to replace it (nothing was changed); "
            f"choose a new path"
        )
    if not overwrite:
        raise FileExistsError(f"out={out} already holds an eigtrain-export file; pass overwrite=true to replace it")


def export_standalone(cfg: ExportConfig) -> dict:
    """Build the model and write it to cfg.out through a temporary file beside it, renamed when complete."""
    out = Path(str(cfg.out))
    check_target(out, cfg.overwrite)  # before any work
    if cfg.format == "onnx":
        require_onnx()
    model, metadata = build_standalone(str(cfg.run_dir), cfg.rr)
    data = (onnx_bytes if cfg.format == "onnx" else torchscript_bytes)(model, metadata)
    safe_files.make_dir(out.parent)
    check_target(out, cfg.overwrite)  # again: something may have appeared there meanwhile
    safe_files.write_bytes(out, data)  # a fresh temporary beside out=, fsynced, renamed over it when whole
    return metadata


def main(argv: list[str] | None = None) -> int:
    from eigtrain.cli import COMMAND_ERRORS, asks_for_help, compose_dataclass, one_line_errors

    args = sys.argv[1:] if argv is None else argv
    if asks_for_help(args, USAGE):
        return 0

    def body() -> None:
        cfg = compose_dataclass(ExportConfig, args).validate()
        metadata = export_standalone(cfg)
        shape: Any = metadata["input"]["shape"][1:]
        width = metadata["output"]["shape"][1]
        print(
            f"eigtrain-export: {cfg.out} ({cfg.format}): images (N, {', '.join(map(str, shape))}) in [0, 1] -> "
            f"{width} ordered features"
        )

    return one_line_errors("eigtrain-export", body, (*COMMAND_ERRORS, KeyError))


if __name__ == "__main__":
    sys.exit(main())
