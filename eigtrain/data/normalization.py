"""Which mean/std normalize a run's images: one rule (`decide`) for eigtrain-train, -rr, -eval, -embed and -export.

In order: data.mean/data.std when the user gives them (a warning when pretrained weights state other values); else
the mean/std the pretrained weights state (timm's pretrained_cfg, a weights file's metadata); else the augmentation
preset's. Values that do not fit the images' channels are refused in one line, except a one-value preset on
images of more channels: its value serves each, with a warning (``none`` is channel-neutral: no warning). The trainer records the decision in the
run (model.json); the commands that read a run use that record (`as_trained`), so they normalize as training did.
Torch-free: checked before torch is imported where a command can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from eigtrain.data.augment_recipes import NORMALIZATION

Values = Sequence[float]


class NormalizationError(ValueError):
    """The normalization does not fit the images: one line naming the key to set."""


@dataclass(frozen=True)
class Normalization:
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str  # where the values come from: "data.mean/data.std", "the weights (...)", "preset NAME"

    def kwargs(self) -> dict:
        """build_augment's mean= and std=."""
        return {"mean": self.mean, "std": self.std}

    def record(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std), "source": self.source}


class Stated(NamedTuple):
    """The mean/std pretrained weights state, and where they state it (e.g. "timm's pretrained_cfg of resnet18");
    eigtrain.models.pretrained reads them as a plain tuple of these three."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    where: str


def decide(
    augment: str, mean: Values | None, std: Values | None, channels: int, weights: Stated | None = None
) -> tuple[Normalization, str | None]:
    """(the normalization of images with `channels` channels, a warning or None); NormalizationError when the
    values do not fit. `weights`: what pretrained weights state (None: not pretrained, or they say nothing)."""
    if (mean is None) != (std is None):
        raise NormalizationError("give data.mean and data.std together (or neither)")
    if mean is not None and std is not None:
        given = Normalization(_floats(mean), _floats(std), "data.mean/data.std")
        _check(given, channels, "data.mean/data.std", broadcast=True)
        differs = weights is not None and not _same(weights, given, channels)
        warning = (
            f"data.mean/data.std {list(given.mean)}/{list(given.std)} differ from what the pretrained weights state "
            f"({weights.where}: {list(weights.mean)}/{list(weights.std)}); using data.mean/data.std"
            if differs and weights is not None
            else None
        )
        return given, warning
    if weights is not None:
        stated = Normalization(weights.mean, weights.std, f"the weights ({weights.where})")
        if len(set(stated.mean)) == len(set(stated.std)) == 1 and channels != len(stated.mean):
            stated = Normalization(stated.mean[:1], stated.std[:1], stated.source)  # equal per channel: any count
        _check(stated, channels, f"the pretrained weights ({weights.where})", broadcast=False)
        return stated, None
    if augment not in NORMALIZATION:
        raise NormalizationError(f"data.augment={augment!r} is unknown; allowed: {', '.join(NORMALIZATION)}")
    preset_mean, preset_std = NORMALIZATION[augment]
    preset = Normalization(_floats(preset_mean), _floats(preset_std), f"preset {augment}")
    _check(preset, channels, f"augmentation preset {augment!r}", broadcast=True)
    if len(preset.mean) == 1 and channels > 1 and augment != "none":  # as before, but never silently
        fits = " or ".join(name for name, (m, _) in NORMALIZATION.items() if len(m) == channels)
        return preset, (
            f"augmentation preset {augment!r} normalizes one channel and the images have {channels}: its value is "
            f"used for each (set data.augment={fits}, or data.mean and data.std, to normalize them as their own)"
        )
    return preset, None


def as_trained(record: Mapping | None, augment: str, mean: Values | None, std: Values | None) -> Normalization:
    """A run's normalization: the record its trainer wrote (model.json's ``normalization``); a run trained before
    there was one normalized with data.mean/std, else its preset's values, whatever its channels."""
    if record:
        return Normalization(_floats(record["mean"]), _floats(record["std"]), str(record.get("source", "the run")))
    default_mean, default_std = NORMALIZATION[augment]
    return Normalization(_floats(mean or default_mean), _floats(std or default_std), "the run's config")


def _check(norm: Normalization, channels: int, what: str, broadcast: bool) -> None:
    if len(norm.mean) != len(norm.std):
        raise NormalizationError(f"{what}: mean has {len(norm.mean)} values but std has {len(norm.std)}")
    if min(norm.std) <= 0:
        raise NormalizationError(f"{what}: std must be positive, got {list(norm.std)}")
    values = len(norm.mean)
    if values == channels or (broadcast and values == 1):
        return
    fits = [name for name, (m, _) in NORMALIZATION.items() if len(m) == channels and name != "digits"] + ["none"]
    hint = f"use data.augment={' or '.join(dict.fromkeys(fits))} or " if what.startswith("augmentation") else ""
    raise NormalizationError(
        f"the images have {channels} channel(s) but {what} normalizes {values}: {hint}"
        f"give data.mean and data.std with {channels} value(s) each"
    )


def _same(weights: Stated, given: Normalization, channels: int) -> bool:
    spread = lambda values: values * channels if len(values) == 1 else values  # noqa: E731
    pairs = zip(spread(weights.mean) + spread(weights.std), spread(given.mean) + spread(given.std))
    return all(abs(a - b) <= 1e-4 for a, b in pairs)


def _floats(values: Values) -> tuple[float, ...]:
    return tuple(float(v) for v in values)
