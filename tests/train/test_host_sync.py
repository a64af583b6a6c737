"""At most one host synchronisation per training step outside logging/checkpoint steps.

On CPU there is no device to wait for, so the test counts the calls that would block on a GPU: reading a tensor
back to Python (`.item()`, `float()`, `int()`, `bool()`, `.tolist()`, `.numpy()`, `.cpu()`), data-dependent
shapes (`nonzero`), and blocking copies from the host (`new_tensor`, `torch.tensor(..., device=)`, `.to(device)`
without ``non_blocking=True``), attributed to the step during which they happen.
"""

import signal
import sys

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist

from eigtrain import dist
from eigtrain.data import augment as augment_module
from eigtrain.data.write import main as write_shards_cli
from eigtrain.train.command import compose_config, run
from eigtrain.train.metrics_log import Throughput
from tests.support.runs import overrides

STEPS = 8
SYNCING = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu", "nonzero")


@pytest.fixture
def counted_syncs(monkeypatch):
    """{step: [names of syncing calls]}; the step advances when the trainer has its next batch."""
    counts: dict[int, list[str]] = {}
    step = [0]

    def counting(name, original):
        def wrapper(*args, **kwargs):
            counts.setdefault(step[0], []).append(name)
            return original(*args, **kwargs)

        return wrapper

    for name in SYNCING:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch, "nonzero", counting("torch.nonzero", torch.nonzero))
    monkeypatch.setattr(torch.Tensor, "new_tensor", counting("new_tensor", torch.Tensor.new_tensor))
    tensor, to = torch.tensor, torch.Tensor.to

    def ours() -> bool:  # called from eigtrain's code (torch's internals move tensors within one device)
        return "/eigtrain/" in sys._getframe(2).f_code.co_filename

    def host_tensor(*args, **kwargs):  # a host-to-device copy when a device is named
        if kwargs.get("device") is not None and ours():
            counts.setdefault(step[0], []).append("torch.tensor(device=)")
        return tensor(*args, **kwargs)

    def blocking_to(self, *args, **kwargs):  # a copy to a device that waits for it, unless non_blocking
        if (
            ours()
            and not kwargs.get("non_blocking")
            and (kwargs.get("device") is not None or any(isinstance(a, (torch.device, str)) for a in args))
        ):
            counts.setdefault(step[0], []).append("to(device)")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch, "tensor", host_tensor)
    monkeypatch.setattr(torch.Tensor, "to", blocking_to)
    # Augmentation on the CPU reads its random draws back on purpose (free there); check the accelerator path.
    monkeypatch.setattr(augment_module, "host_reads_are_free", lambda device: False)
    add = Throughput.add

    def next_step(self, *args, **kwargs):
        step[0] += 1
        return add(self, *args, **kwargs)

    monkeypatch.setattr(Throughput, "add", next_step)
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["micro_batch_size=16", "data.augment=cifar"]], ids=["plain", "accumulation"])
def test_at_most_one_host_sync_per_step(counted_syncs, digits_root, tmp_path, extra):
    # Logging and checkpoints only at the last step; cifar's augmentation has colour jitter (per-sample choices).
    cfg = compose_config(
        overrides(
            tmp_path / "run", digits_root, f"steps={STEPS}", f"log_every={STEPS}", f"checkpoint_every={STEPS}", *extra
        )
    )
    if "data.augment=cifar" in extra:
        cfg.data.mean, cfg.data.std = [0.5], [0.5]  # one channel
    result = run(cfg)
    assert result["step"] == STEPS
    # Step STEPS logs and saves (reads allowed there); on CPU the others need none at all.
    per_step = {s: counted_syncs.get(s, []) for s in range(1, STEPS)}
    assert all(len(calls) <= 1 for calls in per_step.values()), per_step
    assert counted_syncs.get(STEPS), "the counter sees the logging step's reads (it is not blind)"


@pytest.fixture(scope="module")
def rgb_root(tmp_path_factory):
    """RGB PNG shards of 12x10 images (the digits are grayscale: no hue jitter there)."""
    tmp = tmp_path_factory.mktemp("rgb")
    images = np.random.default_rng(0).integers(0, 256, size=(256, 3, 12, 10), dtype=np.uint8)
    np.savez(tmp / "rgb.npz", x=images, y=np.arange(256) % 4)
    write_shards_cli(["source=npz", f"path={tmp / 'rgb.npz'}", f"out={tmp / 'shards'}", "shard_size=64"])
    return tmp / "shards"


@pytest.fixture
def one_rank_group(tmp_path):
    """A real (one-process) gloo group: the collectives a multi-rank job makes run, and are counted."""
    torch_dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    yield
    torch_dist.destroy_process_group()


@pytest.mark.slow
def test_hue_jitter_whole_images_and_save_on_signal_add_no_host_sync(
    counted_syncs, rgb_root, tmp_path, one_rank_group, monkeypatch
):
    """cifar's colour jitter with hue on RGB images padded whole (valid sizes travel with the batch), with the
    save-on-signal handler installed in a process group: the syncs the digits preset cannot show."""
    monkeypatch.setattr(dist._StopState, "installed", False)
    dist.install_stop_handler(requeue_signal=None, stop_signals=(signal.SIGUSR1,))
    previous = signal.getsignal(signal.SIGUSR1)
    cfg = compose_config(
        overrides(
            tmp_path / "run",
            rgb_root,
            f"steps={STEPS}",
            f"log_every={STEPS}",
            f"checkpoint_every={STEPS}",
            "data.augment=cifar",
            "data.image_size=[12,10]",
            "data.image_fit=whole",
            "data.view_size=[8,8]",
        )
    )
    try:
        result = run(cfg)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        monkeypatch.setattr(dist._StopState, "installed", False)
    assert result["step"] == STEPS
    per_step = {s: counted_syncs.get(s, []) for s in range(1, STEPS)}
    assert all(len(calls) <= 1 for calls in per_step.values()), per_step


def test_ranks_agree_on_a_stop_signal_at_the_next_check(digits_root, tmp_path, one_rank_group, monkeypatch):
    """In a process group the stop flag is all-reduced every signal_check_every steps: a signal during step 3
    with checks every 4 steps saves at step 4 and stops there."""
    from tests.support.faulty import faulty_objectives

    for name in ("installed", "received", "requeue_signal", "stopped", "requeue"):  # restored after the test
        monkeypatch.setattr(dist._StopState, name, getattr(dist._StopState, name))
    previous = signal.getsignal(signal.SIGUSR1)
    dist.install_stop_handler(requeue_signal=None, stop_signals=(signal.SIGUSR1,))
    faulty_objectives(monkeypatch, signal_calls={3})
    try:
        result = run(compose_config(overrides(tmp_path / "run", digits_root, "signal_check_every=4")))
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert result["stopped_on_signal"] and result["step"] == 4
