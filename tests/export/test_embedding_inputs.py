"""eigtrain-rr embeddings=: files it cannot use are refused in one line naming them (issue 52: truncated files,
macOS's AppleDouble `._*` companions and complex, text or date arrays were tracebacks or converted silently)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from eigtrain.export.command import main as rr_main
from tests.safety.test_bad_input import _last_line, _redirect_stderr


def pairs(n: int = 64, d: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal((n, d))
    return shared + 0.3 * rng.standard_normal((n, d)), shared + 0.3 * rng.standard_normal((n, d))


def rr(tmp_path, source) -> tuple[int, str]:
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = rr_main([f"embeddings={source}", f"out={tmp_path / 'rr'}", "folds=0"])
    return code, _last_line(stderr.getvalue())


def test_hidden_companions_beside_the_chunks_are_not_chunks(tmp_path):
    chunks = tmp_path / "chunks"
    chunks.mkdir()
    z1, z2 = pairs()
    np.savez(chunks / "part-000.npz", z1=z1, z2=z2)
    (chunks / "._part-000.npz").write_bytes(b"\x00\x05\x16\x07AppleDouble resource fork")
    assert rr(tmp_path, chunks)[0] == 0


@pytest.mark.parametrize("kind", ["npz", "npy", "safetensors"])
def test_a_truncated_chunk_is_one_line_naming_it(tmp_path, kind):
    chunks = tmp_path / "chunks"
    chunks.mkdir()
    z1, z2 = pairs()
    if kind == "npz":
        np.savez(chunks / "part-000.npz", z1=z1, z2=z2)
        name = "part-000.npz"
    elif kind == "npy":
        np.save(chunks / "part-000.z1.npy", z1)
        np.save(chunks / "part-000.z2.npy", z2)
        name = "part-000.z2.npy"
    else:
        save_file({"z1": torch.from_numpy(z1), "z2": torch.from_numpy(z2)}, str(chunks / "part-000.safetensors"))
        name = "part-000.safetensors"
    data = (chunks / name).read_bytes()
    (chunks / name).write_bytes(data[: len(data) // 2])
    code, line = rr(tmp_path, chunks)
    assert code != 0 and name in line and "Traceback" not in line, line


@pytest.mark.parametrize(
    "z1", [np.ones((64, 4), dtype=complex), np.full((64, 4), "abc"), np.zeros((64, 4), dtype="datetime64[s]")]
)
def test_arrays_of_other_kinds_than_real_numbers_are_refused(tmp_path, z1):
    np.savez(tmp_path / "pairs.npz", z1=z1, z2=pairs()[1])
    code, line = rr(tmp_path, tmp_path / "pairs.npz")
    assert code != 0 and "pairs.npz: z1 holds" in line and "not real numbers" in line, line
