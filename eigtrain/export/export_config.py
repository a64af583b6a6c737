"""eigtrain-export: a trained run and its Rayleigh-Ritz export as one standalone file, TorchScript or ONNX.

    eigtrain-export run_dir=RUN format=torchscript out=model.pt     # loads with torch alone (torch.jit.load)
    eigtrain-export run_dir=RUN format=onnx out=model.onnx          # loads with onnxruntime alone

The file maps float images in [0, 1], shape (N, C, H, W) at the run's training resolution, to the ordered features
(N, d): the run's input normalization, its encoder (as its objective saw it: l2-normalized for SCL) and the
Rayleigh-Ritz head (z - mean) @ transform, in one graph. Any prefix [:, :k] is the k-dimensional embedding. The
eigenvalues and the input spec ride in the file's metadata (TorchScript: the extra file `eigtrain.json`; ONNX:
metadata_props key `eigtrain`), beside the format tag that marks a file eigtrain wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

USAGE = __doc__  # eigtrain-export -h (eigtrain.commands): this module is its configuration, read before torch
FORMATS = ("torchscript", "onnx")


@dataclass
class ExportConfig:
    run_dir: str | None = None  # a training run directory (config.yaml, model.json, its weights)
    format: str = "torchscript"  # torchscript | onnx
    out: str | None = None  # the file to write (appears only when complete)
    rr: str | None = None  # the Rayleigh-Ritz export (default: run_dir/rr, eigtrain-rr's default out=)
    overwrite: bool = False  # replace an earlier eigtrain-export file at out= (anything else there is refused)

    def validate(self) -> "ExportConfig":
        if not self.run_dir:
            raise ValueError("run_dir= is required: the training run to export")
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r} is not allowed; allowed: {', '.join(FORMATS)}")
        if not self.out:
            raise ValueError("out= is required: the file to write")
        return self
