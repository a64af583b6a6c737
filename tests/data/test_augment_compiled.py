"""The accelerator path of a view as one pure, compilable function of (uint8 images, the view's random block)
(issue 37): one graph without a break (so no host read inside: a data-dependent read breaks the graph), the
compiled graph's views (in the fusable form: gathers and shifted slices) equal the eager ones (grid_sample and
grouped convolutions), each fusable operation equals its reference, the blur with per-sample sigma equals kornia's,
one random draw per view, and a bound on the operations the eager path dispatches (each a kernel launch on a GPU)."""

import functools
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eigtrain.data import build_augment
from eigtrain.data.augment_batched import batched_view
from eigtrain.data.augment_draws import Sampler, draw
from eigtrain.data.augment_fusable import gaussian_blur_shifted, resample_separable
from eigtrain.data.augment_ops import gaussian_blur, resample
from eigtrain.data.augment_recipes import PRESETS

SIZE = (16, 16)


def view_fn(preset: str, index: int, dtype=torch.bfloat16, channels_last=True, fusable=False):
    augment = build_augment(preset, image_size=SIZE)
    fn = functools.partial(
        batched_view, recipe=augment.views[index], size=SIZE, dtype=dtype, channels_last=channels_last, fusable=fusable
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
    whole (fullgraph) in the fusable form the trainer compiles and run through AOTAutograd's decomposed graph, against
    the eager views (grid_sample, convolutions); the output is bf16 channels_last."""
    images, block = inputs()
    for index in (0, 1):
        fn, augment = view_fn("imagenet", index)
        fusable, _ = view_fn("imagenet", index, fusable=True)
        compiled = torch.compile(fusable, backend="aot_eager", fullgraph=True)
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


@pytest.mark.parametrize(("preset", "with_sizes"), [("imagenet", False), ("imagenet", True), ("cifar", True)])
def test_every_view_in_the_fusable_form_equals_the_reference_form_in_float32(preset, with_sizes):
    """The whole view (crop, jitter, grayscale, blur, solarization, normalization) in fp32: float rounding apart."""
    images, block = inputs()
    sizes = torch.tensor([[24, 20], [12, 20], [24, 9], [5, 7]] * 2) if with_sizes else None
    for index in (0, 1):
        fn, augment = view_fn(preset, index, dtype=torch.float32, channels_last=False)
        fusable, _ = view_fn(preset, index, dtype=torch.float32, channels_last=False, fusable=True)
        want, got = (f(images, block, sizes, augment.mean, augment.std) for f in (fn, fusable))
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_the_fusable_crop_equals_grid_sample(mode):
    """Crop boxes (flipped or not, smaller and larger than the output, inside a padded canvas) sampled by per-axis
    taps gathered from the uint8 images == grid_sample of the float images, border padding, to float rounding."""
    recipe = PRESETS["imagenet"][0]
    g = torch.Generator().manual_seed(1)
    for shape, size, sizes in [((6, 3, 40, 30), (16, 16), None), ((6, 3, 24, 24), (32, 28), [[24, 10], [7, 24]] * 3)]:
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
        sizes = None if sizes is None else torch.tensor(sizes)
        draws = draw(recipe, Sampler.from_block(torch.rand(shape[0], Sampler.BLOCK, generator=g)), shape, size, sizes)
        assert draws.flip.any() and not draws.flip.all()
        want = resample(images.float().div(255), replace(recipe, interpolation=mode), draws, size, sizes)
        got = resample_separable(images, draws.boxes, draws.flip, size, mode).clamp(0, 1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_the_fusable_blur_equals_the_grouped_convolution():
    x, sigma = torch.rand(5, 3, 20, 17, dtype=torch.float64), torch.linspace(0.1, 2.0, 5, dtype=torch.float64)
    torch.testing.assert_close(gaussian_blur_shifted(x, sigma, 6), gaussian_blur(x, sigma, 6), rtol=0, atol=1e-12)
    x, sigma = x.float(), sigma.float()
    torch.testing.assert_close(gaussian_blur_shifted(x, sigma, 6), gaussian_blur(x, sigma, 6), rtol=0, atol=1e-6)


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
