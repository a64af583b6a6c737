"""Single-process CPU training end to end on digits shards: outputs, exact resume (stop at N/2, stop signal,
SIGKILL, kill during a checkpoint write) and the non-finite guard."""

import json
import signal

import pytest
import torch

import eigtrain.train.command as train_module
from eigtrain import dist
from eigtrain.objectives import build_objective
from eigtrain.runs import checkpoint as ckpt
from eigtrain.train.command import compose_config, run
from eigtrain.train.metrics_log import read_metrics
from eigtrain.train.state import NonFiniteError
from tests.support.faulty import faulty_objectives
from tests.support.runs import KILL_WRAPPER, assert_same_final_weights, losses, overrides, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(digits_root, tmp_path_factory):
    """6 uninterrupted steps, checkpoints every 2."""
    run_dir = tmp_path_factory.mktemp("reference")
    result = run(compose_config(overrides(run_dir, digits_root)))
    assert result["step"] == 6
    return run_dir


def test_cpu_run_end_to_end_writes_shards_logs_checkpoints_and_export(tmp_path):
    run_dir, data_root = tmp_path / "run", tmp_path / "digits"  # no shards yet: cpu_debug writes them
    cfg = compose_config(
        [
            "experiment=cpu_debug",
            f"run_dir={run_dir}",
            f"data.root={data_root}",
            "steps=4",
            "checkpoint_every=2",
            "log_every=1",
            "logging.wandb.mode=offline",
            "nesting=joint",
        ]
    )
    result = run(cfg)
    assert result["step"] == 4 and result["skipped_steps"] == 0 and result["checkpoint"].endswith("step-4")
    assert (data_root / "index.json").exists()

    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert {"loss", "lr", "grad_norm", "samples_per_s", "data_wait", "skipped_steps"} <= r.keys()
        assert len(r["eigenvalues"]) == cfg.dim and all(map(lambda v: v is not None, r["eigenvalues"]))
        terms = r.keys() - {
            "step",
            "loss",
            "eigenvalues",
            "lr",
            "grad_norm",
            "samples",
            "samples_per_s",
            "data_wait",
            "skipped_steps",
        }
        assert terms, "each loss term is logged"
    assert records[-1]["samples"] == 4 * cfg.batch_size

    assert [s for s, _ in ckpt.complete_checkpoints(run_dir / "checkpoints")] == [2, 4]
    resolved = (run_dir / "config.yaml").read_text()
    assert f"run_dir: {run_dir}" in resolved and "${" not in resolved
    environment = json.loads((run_dir / "environment.json").read_text())
    assert environment["versions"]["torch"].startswith(torch.__version__.split("+")[0])
    assert len(environment["git_sha"]) == 40 and environment["versions"]["deepspeed"]
    run_id = (run_dir / "wandb_id").read_text()
    assert list((run_dir / "wandb").glob(f"offline-run-*-{run_id}")), "wandb offline run with the stable id"
    assert json.loads((run_dir / "checkpoints/step-4/trainer.json").read_text())["wandb_id"] == run_id

    encoder = ckpt.load_encoder(run_dir)
    assert encoder(torch.rand(5, 1, 8, 8)).shape == (5, cfg.dim)
    from_checkpoint = ckpt.load_encoder(run_dir, run_dir / "checkpoints/step-4")
    assert all(torch.equal(a, b) for a, b in zip(encoder.state_dict().values(), from_checkpoint.state_dict().values()))


def test_stop_and_resume_is_bit_identical(reference, digits_root, tmp_path):
    run_dir = tmp_path / "run"
    first = run(compose_config(overrides(run_dir, digits_root, "stop_after=3")))
    assert first["step"] == 3 and not (run_dir / "model.safetensors").exists()
    second = run(compose_config(overrides(run_dir, digits_root)))
    assert second["step"] == 6
    assert losses(run_dir) == losses(reference)
    assert_same_final_weights(run_dir, reference)


def test_sigkill_and_resume_is_bit_identical(reference, digits_root, tmp_path):
    run_dir = tmp_path / "run"
    killed = run_cli([KILL_WRAPPER, "step", "5", *overrides(run_dir, digits_root)], tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints/step-4"
    run(compose_config(overrides(run_dir, digits_root)))
    assert losses(run_dir) == losses(reference)
    assert_same_final_weights(run_dir, reference)


def test_kill_while_writing_a_checkpoint_leaves_the_previous_one_chosen(reference, digits_root, tmp_path):
    run_dir = tmp_path / "run"
    killed = run_cli([KILL_WRAPPER, "marker", "4", *overrides(run_dir, digits_root)], tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    partial = run_dir / "checkpoints/step-4"
    assert (partial / "rank-0.pt").exists() and not ckpt.is_complete(partial)  # written, never marked
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints/step-2"
    result = run(compose_config(overrides(run_dir, digits_root)))
    assert result["step"] == 6 and ckpt.is_complete(partial)  # re-written from the resumed run
    assert losses(run_dir) == losses(reference)
    assert_same_final_weights(run_dir, reference)


def test_stop_signal_saves_at_the_step_boundary_and_resume_is_exact(reference, digits_root, tmp_path, monkeypatch):
    for name in ("installed", "received", "requeue_signal", "stopped", "requeue"):  # restored after the test
        monkeypatch.setattr(dist._StopState, name, getattr(dist._StopState, name))
    previous = signal.getsignal(signal.SIGUSR1)
    dist.install_stop_handler(requeue_signal=None, stop_signals=(signal.SIGUSR1,))  # what launch/ installs
    faulty_objectives(monkeypatch, signal_calls={3})  # the signal arrives during step 3
    run_dir = tmp_path / "run"
    try:
        result = run(compose_config(overrides(run_dir, digits_root)))
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert result["stopped_on_signal"] and result["step"] == 3
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints/step-3"

    monkeypatch.setattr(dist._StopState, "installed", False)  # the requeued job starts afresh
    monkeypatch.setattr(dist._StopState, "stopped", False)
    monkeypatch.setattr(train_module, "build_objective", build_objective)
    run(compose_config(overrides(run_dir, digits_root)))
    assert losses(run_dir) == losses(reference)
    assert_same_final_weights(run_dir, reference)


def test_nonfinite_loss_and_gradient_are_skipped_then_the_run_stops(digits_root, tmp_path, monkeypatch):
    faulty_objectives(monkeypatch, nan_loss_calls={3}, nan_grad_calls={4})
    run_dir = tmp_path / "tolerated"
    result = run(
        compose_config(overrides(run_dir, digits_root, "steps=4", "checkpoint_every=1", "max_nonfinite_steps=2"))
    )
    assert result["step"] == 4 and result["skipped_steps"] == 2
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert records[3]["loss"] is None and records[4]["loss"] is not None  # NaN is logged as null
    assert [records[s]["skipped_steps"] for s in range(1, 5)] == [0, 0, 1, 2]
    # No periodic checkpoint right after a skipped update (step 3); the final one (step 4) is always written.
    assert [s for s, _ in ckpt.complete_checkpoints(run_dir / "checkpoints")] == [1, 2, 4]
    w1, w2, w4 = (ckpt.model_weights(run_dir / f"checkpoints/step-{s}") for s in (1, 2, 4))
    params = [k for k in w2 if "running_" not in k and "num_batches" not in k]  # BatchNorm statistics move in forward
    assert any(not torch.equal(w1[k], w2[k]) for k in params)  # an applied update changes the weights
    assert all(torch.equal(w2[k], w4[k]) for k in params)  # the skipped ones did not

    faulty_objectives(monkeypatch, nan_loss_calls={3}, nan_grad_calls={4})
    run_dir = tmp_path / "stopped"
    cfg = compose_config(overrides(run_dir, digits_root, "steps=5", "checkpoint_every=1", "max_nonfinite_steps=1"))
    with pytest.raises(
        NonFiniteError, match=r"2 steps had a non-finite loss or gradient, more than max_nonfinite_steps=1"
    ):
        run(cfg)
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints/step-2"  # the last good one
    w_stop = ckpt.model_weights(run_dir / "checkpoints/step-2")
    assert all(torch.equal(w_stop[k], w2[k]) for k in w2)


def test_two_encoders_on_stored_pairs_with_a_vector_context(tmp_path):
    import numpy as np
    from sklearn.datasets import load_digits

    from eigtrain.data.write import main as write_shards_cli

    digits = load_digits()
    x = np.rint(digits.images * 255 / 16).astype(np.uint8)[:, None]
    a = (np.eye(10)[digits.target] + 0.3 * np.random.default_rng(0).standard_normal((len(x), 10))).astype(np.float32)
    np.savez(tmp_path / "pairs.npz", x=x, a=a)
    write_shards_cli(["source=npz", f"path={tmp_path / 'pairs.npz'}", f"out={tmp_path / 'pairs'}", "shard_size=200"])
    run_dir = tmp_path / "run"
    cfg = compose_config(
        [
            "experiment=cpu_debug",
            "data=pairs",
            f"data.root={tmp_path / 'pairs'}",
            "objective=lora",
            "nesting=joint",
            f"run_dir={run_dir}",
            "logging.wandb.mode=disabled",
            "steps=4",
            "model.context={backbone: mlp, width: 32, depth: 2, projector_layers: 0}",
        ]
    )
    result = run(cfg)
    assert result["step"] == 4 and all(r["loss"] is not None for r in read_metrics(run_dir))
    encoder = ckpt.load_encoder(run_dir)
    zx, za = encoder(torch.rand(3, 1, 8, 8), torch.randn(3, 10))
    assert zx.shape == za.shape == (3, cfg.dim)
    assert type(encoder.psi.backbone).__name__ == "MLP" and type(encoder.phi.backbone).__name__ == "TinyCNN"
