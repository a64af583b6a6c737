"""Online monitor: kNN accuracy on the validation split at each prefix size, every ``monitor.every`` steps.

Rank 0 embeds (un-augmented, eval mode, no graph) up to ``max_train_samples`` of the labelled bank split and up
to ``max_val_samples`` of the validation split with the current encoder, and scores the weighted cosine kNN of
`eigtrain.evaluate.probes.knn_accuracy` on the first k coordinates for k in {4, 8, ..., dim}. The encoder returns to
train mode and every RNG to its state afterwards, so a monitored run trains exactly like an unmonitored one.
The splits are those of data.root's index, or, for a run on data.shards, data.shards (split train) and
data.val_shards (split val): a monitor on data.shards without data.val_shards is a config error, never a kNN
scored on the training shards.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from eigtrain.data import build_augment
from eigtrain.data.from_config import build_stream, check_splits
from eigtrain.schema import DataConfig, MonitorConfig, TrainConfig
from eigtrain.train import random_state
from eigtrain.train.knn import dims_for, knn_accuracy

log = logging.getLogger("eigtrain.train.monitor")


class MonitorSchedule:
    """When the monitor scores: every ``every`` steps and at the last step; never when ``every`` is 0. Every rank
    holds one (a scored step is a logging step, at which every rank reads the skip counter); rank 0 scores."""

    def __init__(self, every: int):
        self.every = int(every or 0)

    def due(self, step: int, last_step: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == last_step)


class KNNMonitor(MonitorSchedule):
    def __init__(
        self,
        cfg: MonitorConfig,
        data: DataConfig,
        normalization: Mapping,
        *,
        dim: int,
        seed: int,
        device: torch.device,
        autocast,
        pairs: bool,
        cache_dir: Path | None = None,
    ):
        self.cfg = cfg
        check_splits(data, (self.cfg.train_split, self.cfg.val_split))
        self.data, self.dim, self.seed, self.device, self.autocast, self.pairs = (
            data,
            dim,
            seed,
            device,
            autocast,
            pairs,
        )
        self.cache_dir = cache_dir  # sample counts of shards without an index (as the training stream's)
        super().__init__(self.cfg.every)
        mean, std = tuple(normalization["mean"]), tuple(normalization["std"])  # the run's (model.json)
        self.normalize = build_augment("none", image_size=data.view_size, mean=mean, std=std).to(device)

    @torch.no_grad()
    def _embed(self, encoder: nn.Module, split: str, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        stream = build_stream(
            self.data,
            batch_size=self.cfg.batch_size,
            rank=0,
            world_size=1,
            seed=self.seed,
            device=self.device,
            cache_dir=self.cache_dir,
            split=split,
            num_workers=0,
            one_pass=True,
        )
        zs, labels, seen = [], [], 0
        for batch in stream:
            images = batch["x"] if self.pairs else batch["image"]
            x = self.normalize.view(images.to(self.device, non_blocking=True), None, 0, batch.get("size"))
            with self.autocast():
                zs.append(encoder(x).float().cpu())
            labels.append(batch["label"])
            seen += len(x)
            if seen >= limit:
                break
        return torch.cat(zs)[:limit], torch.cat(labels)[:limit]

    def __call__(self, model: nn.Module) -> dict[str, float]:
        """{"knn/k": accuracy} for each prefix size k, with the current weights of ``model`` (the plain module)."""
        encoder = model.phi if self.pairs else model
        assert isinstance(encoder, nn.Module)
        was_training, rng = model.training, random_state.rng_state()
        model.eval()
        try:
            train_z, train_y = self._embed(encoder, self.cfg.train_split, self.cfg.max_train_samples)
            val_z, val_y = self._embed(encoder, self.cfg.val_split, self.cfg.max_val_samples)
        finally:
            model.train(was_training)
            random_state.set_rng_state(rng)
        k = self.cfg.k
        return {f"knn/{d}": knn_accuracy(train_z[:, :d], train_y, val_z[:, :d], val_y, k=k) for d in dims_for(self.dim)}


def build_monitor(
    cfg: TrainConfig, normalization: Mapping, *, device: torch.device, autocast, scores: bool = True
) -> MonitorSchedule:
    """The monitor of a training config (`normalization`: the run's mean/std, as model.json records them): a `KNNMonitor` on the rank that ``scores`` (rank 0), its schedule alone on
    the others, and a schedule that never falls due when ``monitor.every`` is 0."""
    monitor_cfg = cfg.monitor
    if not monitor_cfg.every:
        return MonitorSchedule(0)
    if cfg.engine.name == "deepspeed" and cfg.engine.zero_stage == 3:
        raise ValueError(
            "monitor.every > 0 is not available with engine.zero_stage=3 (rank 0 holds only its "
            "partition of the weights); use zero_stage 1 or 2, or evaluate checkpoints afterwards"
        )
    if not scores:
        return MonitorSchedule(monitor_cfg.every)
    return KNNMonitor(
        monitor_cfg,
        cfg.data,
        normalization,
        dim=cfg.dim,
        seed=cfg.seed,
        device=device,
        autocast=autocast,
        pairs=cfg.data.mode == "pairs",
        cache_dir=Path(cfg.run_dir) / "data",
    )
