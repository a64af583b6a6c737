"""engine.compile=true (torch.compile of the encoder) trains the tiny CNN on CPU like eager mode."""

import shutil

import pytest

from eigtrain.train.command import compose_config, run
from tests.support.runs import losses, overrides


@pytest.mark.slow
def test_compiled_encoder_matches_eager(digits_root, tmp_path, monkeypatch):
    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        pytest.skip("no C++ compiler on PATH (torch.compile's inductor backend builds C++ kernels on CPU)")
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor, "compile_threads", 1)  # no worker pool to start: faster for one tiny graph
    common = overrides(tmp_path / "eager", digits_root, "steps=3", "checkpoint_every=3")
    eager = run(compose_config(common))
    try:
        compiled = run(
            compose_config(
                overrides(tmp_path / "compiled", digits_root, "steps=3", "checkpoint_every=3", "engine.compile=true")
            )
        )
    except Exception as exn:  # noqa: BLE001
        if "CppCompileError" in type(exn).__name__ or "InductorError" in type(exn).__name__:
            pytest.skip(f"inductor cannot build C++ kernels on this machine: {exn}")
        raise
    assert compiled["step"] == eager["step"] == 3
    got, want = losses(tmp_path / "compiled"), losses(tmp_path / "eager")
    assert [s for s, _ in got] == [1, 2, 3]
    for (_, a), (_, b) in zip(got, want):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
