"""The accelerator path of a view as one pure, compilable function of (uint8 images, the view's random block)
(issue 37): one graph without a break (so no host read inside: a data-dependent read breaks the graph), the
compiled graph's views equal the eager ones, the blur with per-sample sigma equals kornia's, one random draw per
view, and a bound on the operations the eager path dispatches (each a kernel launch on a GPU)."""

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eigtrain.data import build_augment
from eigtrain.data.augment_batched import batched_view
from eigtrain.data.augment_draws import Sampler
from eigtrain.data.augment_ops import gaussian_blur

SIZE = (16, 16)


def view_fn(preset: str, index: int, dtype=torch.bfloat16, channels_last=True):
    augment = build_augment(preset, image_size=SIZE)
    fn = functools.partial(
        batched_view, recipe=augment.views[index], size=SIZE, dtype=dtype, channels_last=channels_last
    )
    return fn, augment


def inputs(channels=3, batch=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, channels, 24, 20), dtype=torch.uint8, generator=g)
    return images, torch.rand(batch, Sampler.BLOCK, generator=g)


@pytest.mark.parametrize(
    ("preset", "channels", "with_sizes"), [("cifar", 3, True), ("digits", 1, False), ("none", 3, False)]
)
def test_a_view_traces_into_one_graph_without_a_break(preset, channels, with_sizes):
    fn, augment = view_fn(preset, 0)
    images, block = inputs(channels)
    sizes = torch.tensor([[24, 20], [12, 20]] * 4) if with_sizes else None  # data.image_fit=whole
    explained = torch._dynamo.explain(fn)(images, block, sizes, augment.mean, augment.std)
    torch._dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_the_compiled_graph_of_every_imagenet_view_equals_the_eager_views():
    """Both views of the preset with every operation (crop, bicubic, jitter, grayscale, blur, solarization), traced
    whole (fullgraph) and run through AOTAutograd's decomposed graph; the output is bf16 channels_last."""
    images, block = inputs()
    for index in (0, 1):
        fn, augment = view_fn("imagenet", index)
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        got, want = (
            compiled(images, block, None, augment.mean, augment.std),
            fn(images, block, None, augment.mean, augment.std),
        )
        assert got.dtype == torch.bfloat16 and got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=1e-2)  # bf16: a rounding apart at most
    torch._dynamo.reset()


def test_the_module_hands_the_same_views_to_the_compiled_path(monkeypatch):
    """BatchAugment.batched with compile=True calls the compiled function with the same block and options."""
    from eigtrain.data import augment as augment_module

    seen = {}

    def fake_compiled(recipe, size, dtype, channels_last):
        seen.update(recipe=recipe, size=size, dtype=dtype, channels_last=channels_last)
        return functools.partial(batched_view, recipe=recipe, size=size, dtype=dtype, channels_last=channels_last)

    monkeypatch.setattr(augment_module, "compiled_view", fake_compiled)
    images, block = inputs()
    eager = build_augment("cifar", image_size=SIZE)
    compiled = build_augment("cifar", image_size=SIZE, compile=True, dtype=torch.bfloat16, channels_last=True)
    got = compiled.batched(images, block, 1)
    assert seen == dict(recipe=eager.views[1], size=SIZE, dtype=torch.bfloat16, channels_last=True)
    torch.testing.assert_close(got.float(), eager.batched(images, block, 1).bfloat16().float())


def test_blur_with_per_sample_sigma_equals_kornia():
    kornia = pytest.importorskip("kornia")
    x, sigma = torch.rand(5, 3, 20, 17), torch.linspace(0.1, 2.0, 5)
    want = kornia.filters.gaussian_blur2d(x, 13, sigma.view(-1, 1).expand(-1, 2).contiguous())
    torch.testing.assert_close(gaussian_blur(x, sigma, 6), want, rtol=0, atol=1e-6)


class CountOps(TorchDispatchMode):
    """Operations dispatched to kernels (after autograd and composite decompositions): launches on a GPU."""

    def __init__(self):
        super().__init__()
        self.count, self.rand = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.rand += "rand" in func.__name__
        return func(*args, **(kwargs or {}))


def test_one_random_draw_per_view_and_a_bound_on_the_eager_launches(monkeypatch):
    """The accelerator path (forced on the CPU) of both imagenet views: one torch.rand per view (the block) and at
    most 1,000 operations for both (issue 37 counted 680-810 per step before; compiled they fuse into a few kernels,
    counted on the GPU by tools/bench_gpu.py's presets mode)."""
    from eigtrain.data import augment as augment_module

    monkeypatch.setattr(augment_module, "host_reads_are_free", lambda device: False)
    augment = build_augment("imagenet", image_size=SIZE)
    images, _ = inputs()
    with CountOps() as ops:
        augment(images, generator=torch.Generator().manual_seed(0))
    assert ops.rand == 2
    assert ops.count <= 1000, ops.count


def test_the_trainer_compiles_bf16_channels_last_views_on_cuda_only():
    from types import SimpleNamespace

    from eigtrain.train.step_inputs import view_options

    data = SimpleNamespace(augment_compile=None)
    cuda = SimpleNamespace(device=torch.device("cuda"), autocast_dtype=torch.bfloat16, channels_last=True)
    cpu = SimpleNamespace(device=torch.device("cpu"), autocast_dtype=None, channels_last=False)
    assert view_options(data, cuda) == {"compile": True, "dtype": torch.bfloat16, "channels_last": True}
    assert view_options(data, cpu) == {"compile": False}  # fp32, eager: the documented CPU views
    assert view_options(SimpleNamespace(augment_compile=False), cuda)["compile"] is False
