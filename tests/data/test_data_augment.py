"""Batched augmentation: shapes, ranges, per-sample randomness, determinism from the generator, and the
equivalence of each operation with torchvision's per-image functions."""

import pytest
import torch
import torchvision.transforms.v2.functional as TF

from eigtrain.data import augment as A
from eigtrain.data import augment_draws, augment_ops, build_augment
from eigtrain.data.augment_recipes import NORMALIZATION, PRESETS, ViewRecipe


def images(batch, channels, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, channels, *size), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize(
    "preset,channels,size,out",
    [
        ("cifar", 3, (32, 32), (32, 32)),
        ("imagenet", 3, (40, 48), (32, 32)),
        ("digits", 1, (8, 8), (8, 8)),
        ("grayscale", 1, (28, 28), (28, 28)),
        ("none", 3, (12, 12), (12, 12)),
    ],
)
def test_presets_give_per_sample_different_views_of_the_right_shape_and_range(preset, channels, size, out):
    augment = build_augment(preset, image_size=out)
    same = images(1, channels, size).expand(16, -1, -1, -1).contiguous()  # one image, 16 times
    view1, view2 = augment(same, generator=torch.Generator().manual_seed(0))
    assert view1.shape == view2.shape == (16, channels, *out) and view1.dtype == torch.float32
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in NORMALIZATION[preset])
    for view in (view1, view2):
        assert (view >= (0 - mean) / std - 1e-5).all() and (view <= (1 - mean) / std + 1e-5).all()
    if preset == "none":
        assert torch.equal(view1, view2) and torch.allclose(view1, (same / 255 - mean) / std)
    else:
        assert not torch.allclose(view1, view2)
        distinct = {tuple(v.flatten()[:64].tolist()) for v in view1}
        assert len(distinct) == 16  # each sample drew its own parameters


def test_views_are_a_function_of_the_generator_only():
    augment = build_augment("imagenet", image_size=24)
    batch = images(8, 3, (28, 28))
    global_state = torch.get_rng_state()
    first = augment(batch, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(123)  # the global RNG plays no part
    second = augment(batch, generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    other = augment(batch, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(first[0], other[0])
    torch.set_rng_state(global_state)
    augment(batch, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), global_state)  # and it is not consumed


def test_imagenet_views_are_asymmetric_as_in_vicreg():
    view1, view2 = PRESETS["imagenet"]
    assert (view1.blur_p, view1.solarize_p, view2.blur_p, view2.solarize_p) == (1.0, 0.0, 0.1, 0.2)
    bright = torch.full((64, 3, 16, 16), 250, dtype=torch.uint8)  # solarization turns these dark
    augment = build_augment("imagenet", mean=(0, 0, 0), std=(1, 1, 1))
    v1, v2 = augment(bright, generator=torch.Generator().manual_seed(0))
    assert (v1.mean(dim=(1, 2, 3)) > 0.3).all()  # never solarized
    dark = (v2.mean(dim=(1, 2, 3)) < 0.3).float().mean()
    assert 0.05 < dark < 0.45  # about 20 % of view 2


@pytest.mark.parametrize(
    "op,reference",
    [
        (augment_ops._brightness, TF.adjust_brightness),
        (augment_ops._contrast, TF.adjust_contrast),
        (augment_ops._saturation, TF.adjust_saturation),
        (augment_ops._hue, TF.adjust_hue),
    ],
)
def test_color_ops_equal_torchvision_per_image(op, reference):
    x = images(16, 3, (9, 7)).float() / 255
    lo, hi = (-0.5, 0.5) if op is augment_ops._hue else (0.0, 2.0)
    factors = torch.linspace(lo, hi, 16)
    want = torch.stack([reference(x[i], float(factors[i])) for i in range(16)])
    torch.testing.assert_close(op(x.clone(), factors.view(-1, 1, 1, 1)), want, atol=2e-6, rtol=0)


def test_full_crop_is_the_identity_and_flip_is_a_mirror():
    x = images(4, 3, (10, 14)).float() / 255
    sampler = augment_draws.Sampler(torch.Generator().manual_seed(0), x.device, 4)
    keep = ViewRecipe(crop_scale=(1.0, 1.0), crop_ratio=(14 / 10, 14 / 10), flip_p=0.0)
    torch.testing.assert_close(augment_ops.crop_flip_resize(x, keep, (10, 14), sampler), x, atol=1e-5, rtol=0)
    mirror = ViewRecipe(crop_scale=(1.0, 1.0), crop_ratio=(14 / 10, 14 / 10), flip_p=1.0)
    mirrored = augment_ops.crop_flip_resize(x, mirror, (10, 14), sampler)
    torch.testing.assert_close(mirrored, x.flip(-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("preset", ["imagenet", "digits"])
def test_per_sample_generators_give_each_sample_its_own_views_whatever_its_batch(preset):
    """A list of generators (eigtrain-rr's views): sample i's views are those it gets alone, in any batch."""
    channels = 1 if preset == "digits" else 3
    x = images(6, channels, (12, 12))
    augment = build_augment(preset, image_size=(8, 8))
    gens = lambda idx: [torch.Generator().manual_seed(100 + i) for i in idx]  # noqa: E731
    together = augment(x, generator=gens(range(6)))
    for i in range(6):
        alone = augment(x[i : i + 1], generator=gens([i]))
        for v in range(2):
            torch.testing.assert_close(alone[v][0], together[v][i], atol=1e-6, rtol=0)
    reordered = augment(x.flip(0), generator=gens(reversed(range(6))))
    torch.testing.assert_close(reordered[0].flip(0), together[0], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="5 per-sample generators for a batch of 6"):
        augment(x, generator=gens(range(5)))


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown augmentation preset 'simclr'"):
        build_augment("simclr")
    with pytest.raises(ValueError, match="images have 1 channels but mean/std have 3 values"):
        build_augment("cifar", mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2))(images(2, 1, (8, 8)))
    with pytest.raises(ValueError, match="^images have 1 channel.* preset 'cifar' normalizes 3: use data.augment=gra"):
        build_augment("cifar")(images(2, 1, (8, 8)))  # a preset's own normalization: which preset fits is named
    with pytest.raises(ValueError, match="expected a uint8 batch"):
        build_augment("cifar")(torch.zeros(2, 3, 8, 8))


def test_crops_come_from_each_images_valid_region_of_a_padded_batch():
    """image_fit=whole batches: image i fills the top-left sizes[i] of the canvas (here 1.0 there, 0 padding)."""
    recipe = ViewRecipe(crop_scale=(0.08, 1.0), flip_p=0.5)
    augment = A.BatchAugment((recipe, recipe), (8, 8), (0.0,), (1.0,))
    canvas = torch.zeros(32, 1, 40, 40, dtype=torch.uint8)
    sizes = torch.tensor([[10, 40], [40, 6], [40, 40], [3, 3]] * 8)
    for image, (h, w) in zip(canvas, sizes.tolist()):
        image[:, :h, :w] = 255
    g = torch.Generator().manual_seed(0)
    inside = augment.view(canvas, g, 0, sizes)
    assert inside.mean() > 0.97 and inside.amin(dim=(1, 2, 3)).min() > 0.4  # at most edge blending
    ignored = augment.view(canvas, torch.Generator().manual_seed(0), 0)  # the same draws on the whole canvas
    assert ignored.mean() < 0.7
    center = A.BatchAugment((ViewRecipe(crop_scale=None, flip_p=0.0),) * 2, (8, 8), (0.0,), (1.0,))
    assert center.view(canvas, None, 0, sizes).mean() > 0.97  # no crop: the valid region's center crop


def test_cpu_and_accelerator_paths_make_the_same_per_sample_choices(monkeypatch):
    """The CPU path runs each operation only on the samples that drew it; the accelerator path runs it on the whole
    batch and selects with torch.where. With whole-image crops both must give the same views."""
    recipe = ViewRecipe(
        crop_scale=(1.0, 1.0),
        crop_ratio=(1.0, 1.0),
        flip_p=0.5,
        jitter=(0.4, 0.4, 0.4, 0.1),
        jitter_p=0.8,
        gray_p=0.3,
        blur_p=0.5,
        solarize_p=0.3,
    )
    augment = A.BatchAugment((recipe, recipe), (72, 72), NORMALIZATION["imagenet"][0], NORMALIZATION["imagenet"][1])
    batch = images(24, 3, (72, 72))
    on_cpu = augment.view(batch, torch.Generator().manual_seed(3))
    monkeypatch.setattr(A, "host_reads_are_free", lambda device: False)
    batched = augment.view(batch, torch.Generator().manual_seed(3))
    torch.testing.assert_close(on_cpu, batched, atol=1e-4, rtol=0)


def test_cpu_crops_of_large_outputs_are_whole_pixel_boxes_inside_each_valid_region():
    recipe = ViewRecipe(crop_scale=(0.08, 1.0), flip_p=0.5, interpolation="bicubic")
    augment = A.BatchAugment((recipe, recipe), (72, 72), (0.0,), (1.0,))
    canvas = torch.zeros(16, 1, 200, 200, dtype=torch.uint8)
    sizes = torch.tensor([[90, 200], [200, 70], [200, 200], [80, 80]] * 4)
    for image, (h, w) in zip(canvas, sizes.tolist()):
        image[:, :h, :w] = 255
    views = augment.view(canvas, torch.Generator().manual_seed(0), 0, sizes)
    assert torch.equal(views, torch.ones_like(views))  # no padding pixel enters any crop, not even blended
