"""Files a user names are data, never code (issue 51 §1, the inputs beyond a run directory): a pickle planted as
pretrained weights (model.pretrained=), an external encoder's checkpoint (eigtrain-rr encoder.checkpoint=), stored
features (eigtrain-eval features=) or embedding pairs (eigtrain-rr embeddings=, .npz and .npy) never runs: each is
refused in one line naming the file. (Run, step and export directories: test_run_dir_safety.py; DCP metadata:
test_metadata_pickle.py; CIFAR batches: tests/data/test_data_write.py.)"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.safety.test_bad_input import _last_line, _redirect_stderr


class Planted:
    """Unpickling it creates `path`."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _object_array(marker: Path) -> np.ndarray:
    planted = np.empty(2, dtype=object)
    planted[:] = [Planted(marker), Planted(marker)]
    return planted


def _run(main, argv) -> tuple[int, str]:
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = main(argv)
    return code, _last_line(stderr.getvalue())


def test_planted_pickles_in_named_input_files_never_run(tmp_path):
    from eigtrain.evaluate.command import main as eval_main
    from eigtrain.export.command import main as rr_main
    from eigtrain.models.encoder import build_encoder
    from eigtrain.models.pretrained import PretrainedWeightsError, load_pretrained
    from eigtrain.schema.groups import ModelConfig

    marker = tmp_path / "PWNED"
    weights = tmp_path / "weights.pth"
    weights.write_bytes(pickle.dumps({"state_dict": Planted(marker)}))
    cfg = ModelConfig(backbone="timm:resnet18", pretrained=str(weights))
    with pytest.raises(PretrainedWeightsError, match="weights.pth cannot be read"):
        load_pretrained(build_encoder(cfg, 8, (3, 32, 32)), cfg)

    code, line = _run(
        rr_main,
        ["encoder=timm:resnet18", f"encoder.checkpoint={weights}", "data.root=/nonexistent", f"out={tmp_path / 'rr'}"],
    )
    assert code != 0 and "\n" not in line

    features = tmp_path / "features.npz"
    np.savez(features, train_z=_object_array(marker), train_y=np.zeros(2), test_z=np.zeros((2, 2)), test_y=np.zeros(2))
    code, line = _run(eval_main, [f"features={features}", f"out={tmp_path / 'ev'}"])
    assert code != 0 and "features.npz" in line, line

    pairs = tmp_path / "pairs.npz"
    np.savez(pairs, z1=_object_array(marker), z2=np.zeros((2, 2)))
    code, line = _run(rr_main, [f"embeddings={pairs}", f"out={tmp_path / 'rr2'}"])
    assert code != 0 and "pairs.npz" in line, line

    chunks = tmp_path / "chunks"
    chunks.mkdir()
    np.save(chunks / "part-0.z1.npy", _object_array(marker), allow_pickle=True)
    np.save(chunks / "part-0.z2.npy", _object_array(marker), allow_pickle=True)
    code, line = _run(rr_main, [f"embeddings={chunks}", f"out={tmp_path / 'rr3'}"])
    assert code != 0 and "part-0" in line, line
    assert not marker.exists(), "a planted pickle ran"
