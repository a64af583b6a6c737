"""eigtrain-export: one file (TorchScript or ONNX) holding normalization + encoder + Rayleigh-Ritz head, loaded in a
process where `import eigtrain` fails, gives eigtrain's own pipeline's ordered features on the same images."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from eigtrain.data import build_augment
from eigtrain.export.command import main as rr_main
from eigtrain.export.embed import normalization, open_run
from eigtrain.export.files import load_head
from eigtrain.export.standalone import main as export_main
from eigtrain.export.standalone import read_metadata
from eigtrain.train.command import compose_config, run
from tests.support.runs import clean_env

QUIET = ["logging.progress=false", "logging.wandb.mode=disabled"]

# The child's first lines: a meta-path finder refuses every eigtrain import (as where eigtrain is not installed),
# and the child proves it before loading the file.
BLOCK = """
import sys
class _NoEigtrain:
    def find_spec(self, name, path=None, target=None):
        if name == "eigtrain" or name.startswith("eigtrain."):
            raise ModuleNotFoundError("No module named 'eigtrain' (blocked)")
sys.meta_path.insert(0, _NoEigtrain())
try:
    import eigtrain
    raise SystemExit("eigtrain is importable")
except ModuleNotFoundError:
    pass
"""
LOAD = {
    "torchscript": """
import json, numpy as np, torch
extra = {"eigtrain.json": ""}
model = torch.jit.load(sys.argv[1], _extra_files=extra)
with torch.no_grad():
    out = model(torch.from_numpy(np.load(sys.argv[2]))).numpy()
meta = json.loads(extra["eigtrain.json"])
""",
    "onnx": """
import json, numpy as np, onnxruntime
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
out = session.run(None, {session.get_inputs()[0].name: np.load(sys.argv[2])})[0]
meta = json.loads(session.get_modelmeta().custom_metadata_map["eigtrain"])
assert "torch" not in sys.modules, "onnxruntime alone"
""",
}
SAVE = """
assert not any(m == "eigtrain" or m.startswith("eigtrain.") for m in sys.modules)
np.save(sys.argv[3], out)
print(json.dumps(meta))
"""


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """A 4-step SCL run (tiny CNN, digits 8x8, l2-normalized objective view) and its eigtrain-rr export."""
    root = tmp_path_factory.mktemp("standalone")
    cfg = compose_config(
        ["experiment=cpu_debug", f"run_dir={root / 'run'}", f"data.root={root / 'digits'}", "steps=4", *QUIET]
    )
    run(cfg)
    assert rr_main([f"run_dir={root / 'run'}", "num_workers=0", "batch_size=256"]) == 0
    return root / "run"


def eigtrain_pipeline(run_dir, images_uint8):
    """The ordered features as eigtrain computes them (eigtrain.export.embed.embed_split, then the export's head)."""
    trained = open_run(str(run_dir))
    data = trained.cfg.data
    normalize = build_augment("none", image_size=data.view_size, **normalization(trained))
    with torch.no_grad():
        z = trained.encoder(normalize.view(torch.from_numpy(images_uint8), None, 0))
        return load_head(run_dir / "rr")(z).numpy(), trained.output


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_standalone_file_matches_eigtrain_without_eigtrain(exported_run, fmt, tmp_path, capsys):
    out = tmp_path / f"model.{fmt}"
    assert export_main([f"run_dir={exported_run}", f"format={fmt}", f"out={out}"]) == 0
    images = (load_digits().images[:37] * 16).clip(0, 255).astype(np.uint8)[:, None]  # as the shards store them
    np.save(tmp_path / "images.npy", images.astype(np.float32) / 255)  # the file's input: [0, 1]
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(BLOCK + LOAD[fmt] + SAVE))
    child = subprocess.run(
        [sys.executable, "-I", str(script), str(out), str(tmp_path / "images.npy"), str(tmp_path / "out.npy")],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    meta = json.loads(child.stdout.strip().splitlines()[-1])
    expected, head_input = eigtrain_pipeline(exported_run, images)
    got = np.load(tmp_path / "out.npy")
    assert got.shape == expected.shape == (37, 16)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    eigenvalues = json.loads((exported_run / "rr" / "manifest.json").read_text())["eigenvalues"]
    assert meta["eigenvalues"] == pytest.approx(eigenvalues, rel=1e-6)
    assert meta["input"]["shape"] == [None, 1, 8, 8] and meta["head_input"] == head_input == "l2_normalized"
    assert read_metadata(out) == meta  # eigtrain recognizes its own file (overwrite=true may replace it)


def test_refuses_what_it_must_not_replace_or_cannot_read(exported_run, tmp_path, capsys):
    foreign = tmp_path / "notes.onnx"
    foreign.write_bytes(b"someone else's file")
    assert export_main([f"run_dir={exported_run}", "format=onnx", f"out={foreign}"]) == 2
    assert foreign.read_bytes() == b"someone else's file"
    assert export_main([f"run_dir={tmp_path / 'missing'}", f"out={tmp_path / 'a.pt'}"]) == 2
    assert export_main([f"run_dir={exported_run}", f"rr={tmp_path}", f"out={tmp_path / 'b.pt'}"]) == 2
    assert export_main([f"run_dir={exported_run}", "format=tflite", f"out={tmp_path / 'c.pt'}"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 4 and all(line.startswith("eigtrain-export: ") for line in errors), errors
    assert "not written by eigtrain-export" in errors[0] and "no config.yaml" in errors[1]
    assert "no Rayleigh-Ritz export" in errors[2] and "format='tflite'" in errors[3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.onnx"]  # nothing written, no temporary left


def test_overwrite_only_its_own_file(exported_run, tmp_path):
    out = tmp_path / "model.pt"
    assert export_main([f"run_dir={exported_run}", f"out={out}"]) == 0
    assert export_main([f"run_dir={exported_run}", f"out={out}"]) == 2  # there already: overwrite=true needed
    before = out.stat().st_mtime_ns
    assert export_main([f"run_dir={exported_run}", f"out={out}", "overwrite=true"]) == 0
    assert read_metadata(out)["format"] == "eigtrain-standalone-v1" and out.stat().st_mtime_ns != before


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory, digits_root):
    """A ViT-B/16-shaped run (timm, depth 2, width 64) on 32x32 views of the digits, 2 steps, and its export."""
    root = tmp_path_factory.mktemp("standalone_vit")
    small = "model.timm_kwargs={depth: 2, embed_dim: 64, num_heads: 2}"
    overrides = ["model.backbone=timm:vit_base_patch16_224", small, "data.view_size=[32,32]", "steps=2"]
    run(compose_config(["experiment=cpu_debug", f"run_dir={root / 'run'}", f"data.root={digits_root}", *overrides]))
    assert rr_main([f"run_dir={root / 'run'}", "num_workers=0", "batch_size=512"]) == 0
    return root / "run"


def test_vit_run_exports_to_both_formats(vit_run, tmp_path):
    images = (load_digits().images[:9] * 16).clip(0, 255).astype(np.uint8)
    images = np.kron(images, np.ones((4, 4), np.uint8))[:, None]  # 32x32, the training resolution: no resize
    expected, _ = eigtrain_pipeline(vit_run, images)
    x = torch.from_numpy(images.astype(np.float32) / 255)
    for fmt in ("torchscript", "onnx"):
        assert export_main([f"run_dir={vit_run}", f"format={fmt}", f"out={tmp_path / fmt}"]) == 0
    got = torch.jit.load(str(tmp_path / "torchscript"))(x).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"images": x.numpy()})[0], expected, rtol=0, atol=1e-4)


def test_onnx_without_its_packages_is_one_line_before_any_work(exported_run, tmp_path, capsys, monkeypatch):
    """issue 55: format=onnx without onnx installed was a ModuleNotFoundError traceback after the model was built."""
    import builtins

    real_import = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name.split(".")[0] in ("onnx", "onnxscript"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnx)
    code = export_main([f"run_dir={exported_run}", "format=onnx", f"out={tmp_path / 'm.onnx'}"])
    line = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in line and "pip install 'eigtrain[onnx]'" in line, line
    assert not (tmp_path / "m.onnx").exists()


def _export_in_child(run_dir, out, fmt: str, file_limit: int | None = None):
    """eigtrain-export in a child process (an abort there cannot take the test with it), under `ulimit -f`."""
    import resource

    def limit():
        if file_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    code = "import sys; from eigtrain.export.standalone import main; sys.exit(main(sys.argv[1:]))"
    args = [sys.executable, "-c", code, f"run_dir={run_dir}", f"format={fmt}", f"out={out}"]
    return subprocess.run(args, capture_output=True, text=True, preexec_fn=limit, env=clean_env(), timeout=300)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_file_size_limit_or_a_full_disk_is_one_line_and_leaves_nothing(exported_run, tmp_path, fmt):
    """EFBIG (`ulimit -f`) and ENOSPC (a small tmpfs) while the file is written: one line naming out= and the
    cause, exit 2, no temporary left (torch.jit.save aborted the process with a C++ frame dump before)."""
    pytest.importorskip("onnx") if fmt == "onnx" else None
    out = tmp_path / f"model.{fmt}"
    done = _export_in_child(exported_run, out, fmt, file_limit=16 * 1024)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "file size limit" in lines[0] and str(out) in lines[0], lines
    assert list(tmp_path.iterdir()) == []
    from tests.safety.test_bad_input import _mount

    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount(disk, "size=64k"):
        pytest.skip("no tmpfs to fill (needs root)")
    try:
        done = _export_in_child(exported_run, disk / "model", fmt)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and "the disk is full" in lines[0], done.stderr[-2000:]
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)])
