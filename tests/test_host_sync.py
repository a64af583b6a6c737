"""At most one host synchronisation per training step outside logging/checkpoint steps.

On CPU there is no device to wait for, so the test counts the calls that would block on a GPU: reading a tensor
back to Python (`.item()`, `float()`, `int()`, `bool()`, `.tolist()`, `.numpy()`, `.cpu()`) and data-dependent
shapes (`nonzero`), attributed to the step during which they happen.
"""

import pytest
import torch

from eigtrain.data import augment as augment_module
from eigtrain.metrics_log import Throughput
from eigtrain.train import compose_config, run
from tests.test_train_support import digits_root, overrides  # noqa: F401

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
def test_at_most_one_host_sync_per_step(counted_syncs, digits_root, tmp_path, extra):  # noqa: F811
    # Logging and checkpoints only at the last step; cifar's augmentation has colour jitter (per-sample choices).
    cfg = compose_config(overrides(tmp_path / "run", digits_root, f"steps={STEPS}", f"log_every={STEPS}",
                                   f"checkpoint_every={STEPS}", *extra))
    if "data.augment=cifar" in extra:
        cfg.data.mean, cfg.data.std = [0.5], [0.5]  # one channel
    result = run(cfg)
    assert result["step"] == STEPS
    # Step STEPS logs and saves (reads allowed there); on CPU the others need none at all.
    per_step = {s: counted_syncs.get(s, []) for s in range(1, STEPS)}
    assert all(len(calls) <= 1 for calls in per_step.values()), per_step
    assert counted_syncs.get(STEPS), "the counter sees the logging step's reads (it is not blind)"
