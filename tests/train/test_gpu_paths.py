"""The CUDA code paths, checked on the CPU where a check can fail there: the nvJPEG start-up probe, PNG batches
copied to the device at once, TF32 flags that stay readable, the guarded optimizer step's launch count, the
folded colour jitter, the Rayleigh-Ritz job's process-group backend."""

import copy
import json

import numpy as np
import pytest
import torch
import torchvision
import torchvision.io
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from eigtrain import dist as edist
from eigtrain.data import augment_draws, augment_ops, decode_ahead, gpu_decode
from eigtrain.data.augment_recipes import PRESETS, ViewRecipe
from eigtrain.data.write import main as write_shards_cli
from eigtrain.engine.base import enable_cuda_fast_paths, guarded_step
from eigtrain.objectives.moments import full_fp32_matmul
from tests.support.runs import REPO, overrides, run_cli
from tests.support.streams import open_stream

# ---------------------------------------------------------------------------------------------- nvJPEG probe


def test_nvjpeg_probe_decodes_a_jpeg_instead_of_trusting_the_import(monkeypatch):
    """A torchvision without nvJPEG imports decode_jpeg and fails on every image: `auto` must fall back to the
    workers and `cuda` must say why, instead of marking every sample corrupt."""
    real = torchvision.io.decode_jpeg

    def without_nvjpeg(data, *args, device="cpu", **kwargs):
        if torch.device(device).type == "cuda":
            raise RuntimeError("torchvision not compiled with nvJPEG support")
        return real(data, *args, device=device, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torchvision.io, "decode_jpeg", without_nvjpeg)
    gpu_decode.nvjpeg_problem.cache_clear()
    try:
        assert gpu_decode.choose_jpeg_device("auto", "cuda") is None
        with pytest.raises(ValueError, match="data.decode=cuda needs .*not compiled with nvJPEG support"):
            gpu_decode.choose_jpeg_device("cuda", "cuda")
        assert gpu_decode.nvjpeg_problem("cpu") is None  # the probe itself decodes (here on the CPU)
    finally:
        gpu_decode.nvjpeg_problem.cache_clear()


# ---------------------------------------------------------------------------------------------- PNG batches


@pytest.fixture(scope="module")
def png_root(tmp_path_factory):
    """RGB PNG shards (the npz source writes PNG)."""
    tmp = tmp_path_factory.mktemp("png")
    images = np.random.default_rng(0).integers(0, 256, size=(64, 3, 12, 10), dtype=np.uint8)
    np.savez(tmp / "rgb.npz", x=images, y=np.arange(64) % 4)
    write_shards_cli(
        ["source=npz", f"path={tmp / 'rgb.npz'}", f"out={tmp / 'shards'}", "shard_size=16", "val_fraction=0.1"]
    )
    return tmp / "shards"


def test_png_batches_are_one_copy_to_the_device(png_root, monkeypatch):
    """With batched JPEG decoding on, PNG images come from the workers stacked: one copy per batch, not one per
    image (each a wait for the GPU queue), and the same batches as decoding in the workers."""
    common = dict(batch_size=8, num_workers=0, image_size=(12, 10), image_fit="whole", shuffle_block=0)
    reference = [b for _, b in zip(range(3), open_stream(png_root, **common))]
    copies = []
    to = torch.Tensor.to

    def counting(self, *args, **kwargs):
        copies.append(kwargs.get("non_blocking", False))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting)
    batches = [b for _, b in zip(range(3), open_stream(png_root, jpeg_device="cpu", **common))]
    # one non-blocking copy per batch (the batches finished ahead of the 3 taken included), not one per image
    assert set(copies) == {True} and 3 <= len(copies) <= 3 + decode_ahead.AHEAD + 1
    for ref, got in zip(reference, batches):
        assert ref["key"] == got["key"] and torch.equal(ref["label"], got["label"])
        assert torch.equal(ref["image"], got["image"]) and torch.equal(ref["size"], got["size"])


# ---------------------------------------------------------------------------------------------- TF32


def test_tf32_flags_stay_readable_for_inductor():
    """The new fp32_precision API makes later reads of the legacy flags raise (Inductor reads them when it
    compiles a matmul); set_float32_matmul_precision keeps both consistent."""
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    try:
        enable_cuda_fast_paths()
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        with full_fp32_matmul("cuda"):  # the objective's moments stay IEEE fp32
            assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.benchmark = saved[1]


def test_deterministic_turns_autotuning_off_and_back_on(monkeypatch):
    """engine.deterministic=true: a resumed process must pick the same kernels as the uninterrupted one (with
    autotuning an H200 resumed fp32 losses 1.8e-5 off); the flag reaches the trainer's CUDA set-up."""
    from eigtrain.train.command import compose_config

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        enable_cuda_fast_paths(deterministic=True)
        assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        enable_cuda_fast_paths()
        assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[1], saved[2]
        torch.use_deterministic_algorithms(saved[3], warn_only=saved[4])
    assert compose_config(["experiment=cpu_debug", "run_dir=x"]).engine.deterministic is False
    assert compose_config(["experiment=cpu_debug", "run_dir=x", "engine.deterministic=true"]).engine.deterministic


# ---------------------------------------------------------------------------------------------- guarded step


def _model(layers: int) -> nn.Module:
    torch.manual_seed(0)
    convs = [nn.Conv2d(3, 3, 3, padding=1) for _ in range(layers)]
    return nn.Sequential(*convs).to(memory_format=torch.channels_last)  # dense but not contiguous


def _optimizers(model):
    return [
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True),
        torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, foreach=True),
    ]


def _backward(model, scale=1.0):
    model.zero_grad(set_to_none=True)
    (model(torch.ones(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)).square().mean() * scale).backward()


def _state(model, optimizer):
    return (
        [p.detach().clone() for p in model.parameters()],
        [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters() if p in optimizer.state],
    )


def _equal(a, b) -> bool:
    params_a, state_a = a
    params_b, state_b = b
    return (
        all(torch.equal(x, y) for x, y in zip(params_a, params_b))
        and len(state_a) == len(state_b)
        and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(state_a, state_b))
    )


@pytest.mark.parametrize("which", [0, 1], ids=["sgd", "adamw"])
def test_guarded_step_is_the_step_or_exactly_nothing(which):
    model = _model(3)
    twin = copy.deepcopy(model)
    opt, twin_opt = _optimizers(model)[which], _optimizers(twin)[which]
    _backward(model, float("nan"))  # first step not applied: no state, nothing moved
    before = _state(model, opt)
    guarded_step(opt, torch.tensor(False))
    assert all(torch.equal(p, q) for p, q in zip(before[0], _state(model, opt)[0]))
    assert all(v.eq(0).all() for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.ndim)
    opt.state.clear()  # (the reset state equals none; start the comparison from none)
    for _ in range(2):  # applied steps: bit-identical to the plain optimizer
        _backward(model), _backward(twin)
        guarded_step(opt, torch.tensor(True))
        twin_opt.step()
        assert _equal(_state(model, opt), _state(twin, twin_opt))
    _backward(model, float("inf"))
    before = _state(model, opt)
    guarded_step(opt, torch.tensor(False))
    assert _equal(before, _state(model, opt))


class _CountKernels(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view  # views launch nothing
        return func(*args, **(kwargs or {}))


def _guard_kernels(layers: int, which: int) -> int:
    model = _model(layers)
    opt = _optimizers(model)[which]
    _backward(model)
    guarded_step(opt, torch.tensor(True))  # the first step creates the state
    _backward(model)
    with _CountKernels() as guarded:
        guarded_step(opt, torch.tensor(True))
    _backward(model)
    with _CountKernels() as plain:
        opt.step()
    return guarded.count - plain.count  # the guard's own ops


@pytest.mark.parametrize("which", [0, 1], ids=["sgd", "adamw"])
def test_guarded_step_launches_do_not_grow_with_the_parameter_count(which):
    """A clone and a where per parameter and state tensor made small models launch-bound on a GPU; the guard
    now works on one flat buffer per (device, dtype): a handful of ops whatever the number of tensors."""
    assert _guard_kernels(16, which) == _guard_kernels(2, which)


# ---------------------------------------------------------------------------------------------- colour jitter


def _jitter_reference(x, recipe, draws):
    """The accelerator path's colour jitter before folding: each operation on the whole batch, kept by `where`."""
    factors, order, apply = draws.jitter
    b, c, s, h = recipe.jitter
    active = [b > 0, c > 0, s > 0 and x.shape[1] == 3, h > 0 and x.shape[1] == 3]
    for step in range(4):
        for op in range(4):
            if active[op]:
                chosen = apply & (order[:, step] == op)
                x = augment_ops.where(x, chosen, augment_ops._COLOUR_OPS[op], factors[op].view(-1, 1, 1, 1))
    return x


class _CountFullSize(TorchDispatchMode):
    """Whole-batch tensors written (the memory traffic that dominates on a GPU)."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.count += sum(
                t.numel() >= self.numel for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
            )
        return out


@pytest.mark.parametrize("preset,channels", [("cifar", 3), ("imagenet", 3), ("cifar", 1)])
def test_folded_colour_jitter_equals_each_operation_applied_in_turn(preset, channels):
    recipe = PRESETS[preset][0]
    recipe = ViewRecipe(jitter=recipe.jitter, jitter_p=recipe.jitter_p)  # jitter only
    x = torch.rand(64, channels, 12, 12, generator=torch.Generator().manual_seed(1))
    draws = augment_draws.draw(
        recipe, augment_draws.Sampler(torch.Generator().manual_seed(2), x.device, 64), x.shape, (12, 12), None
    )
    with _CountFullSize(x.numel()) as reference_traffic:
        expected = _jitter_reference(x.clone(), recipe, draws)
    with _CountFullSize(x.numel()) as folded_traffic:
        folded = augment_ops.colour_blur_solarize(x.clone(), recipe, draws, augment_ops.where)
    assert torch.equal(folded, expected)
    assert folded_traffic.count < 0.75 * reference_traffic.count, (folded_traffic.count, reference_traffic.count)


# ---------------------------------------------------------------------------------------------- DeepSpeed


DEEPSPEED_WITHOUT_OVERFLOW_CHECK = """
import json, sys
import torch
import deepspeed.runtime.zero.stage_1_and_2 as zero
import eigtrain.train.command as train_module
from eigtrain.runs import checkpoint as ckpt
from tests.support.faulty import Faulty
# A DeepSpeed whose fp32 ZeRO optimizer does not look for inf/NaN gradients (the check is version-dependent).
zero.DeepSpeedZeroOptimizer.check_overflow = lambda self, *a, **k: setattr(self, "overflow", False)
zero.is_invalid_grad_norm = lambda norm: False
build = train_module.build_objective
train_module.build_objective = lambda *a, **k: Faulty(build(*a, **k), nan_loss_calls={3})
result = train_module.run(train_module.compose_config(sys.argv[2:]))
w2, w3 = (ckpt.model_weights(f"{sys.argv[1]}/checkpoints/step-{s}") for s in (2, 3))
same = all(torch.equal(w2[k], w3[k]) for k in w2 if "running_" not in k and "num_batches" not in k)
print("RESULT", json.dumps({"skipped": result["skipped_steps"], "params_unchanged": same}))
"""


@pytest.mark.slow
def test_deepspeed_skips_a_nonfinite_loss_whatever_its_overflow_check(digits_root, tmp_path):
    run_dir = tmp_path / "run"
    args = overrides(run_dir, digits_root, "engine=deepspeed", "steps=3", "checkpoint_every=1")
    out = run_cli(["-c", DEEPSPEED_WITHOUT_OVERFLOW_CHECK, str(run_dir), *args], REPO)  # DeepSpeed keeps its group
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.split("RESULT", 1)[1]) == {"skipped": 1, "params_unchanged": True}


# ---------------------------------------------------------------------------------------------- eigtrain-rr


def test_rr_with_several_ranks_takes_its_backend_from_the_device():
    """A CUDA device gets CPU accumulators over gloo beside NCCL; embeddings= on 2 ranks where CUDA is visible runs
    over gloo: tests/export/test_rr_ground_truth.py::test_two_ranks_export_what_one_rank_exports."""
    assert edist.backend_for(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"


# ---------------------------------------------------------------------------------------------- channels_last


def test_channels_last_is_on_by_default_for_convolutional_backbones_on_cuda():
    from eigtrain.engine.base import use_channels_last
    from eigtrain.train.command import compose_config

    assert compose_config(["experiment=cpu_debug", "run_dir=x"]).engine.channels_last is None  # the default: auto
    resnet = torchvision.models.resnet18()
    vit_like = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.Flatten(), nn.Linear(8, 8))  # one patch embedding
    mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    assert use_channels_last(None, resnet, torch.device("cuda", 0))
    assert not use_channels_last(None, resnet, torch.device("cpu"))
    assert not use_channels_last(None, vit_like, "cuda") and not use_channels_last(None, mlp, "cuda")
    assert use_channels_last(True, mlp, "cpu") and not use_channels_last(False, resnet, "cuda")


# ---------------------------------------------------------------------------------------------- on a GPU


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (tools/gpu_check.sh)")


def _jpegs(n: int = 16) -> list[bytes]:
    g = torch.Generator().manual_seed(0)
    return [
        bytes(
            torchvision.io.encode_jpeg(
                torch.randint(0, 256, (3, 64 + 8 * i, 48), dtype=torch.uint8, generator=g), quality=90
            ).numpy()
        )
        for i in range(n)
    ]


@needs_cuda
def test_nvjpeg_decode_never_writes_memory_the_training_stream_still_reads():
    """Freed blocks whose reads are still queued on the training stream, then a decode: those reads must see
    their own values (torchvision's decoder writes from a stream that does not wait for the caller's)."""
    data, decoder = _jpegs(), gpu_decode.JpegDecoder(torch.device("cuda"))
    for _ in range(20):
        busy = [torch.full((1 << 20,), float(i), device="cuda") for i in range(8)]
        slow = torch.randn(4096, 4096, device="cuda")
        slow @ slow  # keeps the training stream busy while the reads below wait in its queue
        sums = [b.sum() for b in busy]
        del busy  # their blocks go back to the training stream's pool, reads still queued
        decoder(data, 3)
        assert [s.item() for s in sums] == [float(i * (1 << 20)) for i in range(8)]


@needs_cuda
def test_nvjpeg_decode_is_bit_identical_to_the_workers():
    """What data.decode=cpu stays the default for until it passes on the GPU machine."""
    from eigtrain.data.decode import decode_image_bytes

    data = _jpegs()
    on_gpu = gpu_decode.JpegDecoder(torch.device("cuda"))(data, 3)
    diffs = [(g.cpu().int() - decode_image_bytes(d, 3, None).int()).abs().max().item() for g, d in zip(on_gpu, data)]
    assert max(diffs) == 0, f"nvJPEG differs from the workers' decode by up to {max(diffs)} levels"
