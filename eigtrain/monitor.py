"""Online monitor: kNN accuracy on the validation split at each prefix size, every ``monitor.every`` steps.

Rank 0 embeds (un-augmented, eval mode, no graph) up to ``max_train_samples`` of the labelled bank split and up
to ``max_val_samples`` of the validation split with the current encoder, and scores the weighted cosine kNN of
`eigtrain.evaluate.knn_accuracy` on the first k coordinates for k in {4, 8, ..., dim}. The encoder returns to
train mode and every RNG to its state afterwards, so a monitored run trains exactly like an unmonitored one.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import torch
from torch import nn

from eigtrain import checkpoint as ckpt
from eigtrain.data import ShardStream, build_augment
from eigtrain.data.augment import NORMALIZATION
from eigtrain.evaluate import dims_for, knn_accuracy

log = logging.getLogger("eigtrain.monitor")
DEFAULTS = {"every": 0, "train_split": "train", "val_split": "val", "max_train_samples": 10000,
            "max_val_samples": 5000, "k": 20, "batch_size": 256}


class KNNMonitor:
    def __init__(self, cfg: Mapping[str, Any], data: Mapping[str, Any], *, dim: int, seed: int, device: torch.device,
                 autocast, pairs: bool):
        self.cfg = {**DEFAULTS, **{k: v for k, v in dict(cfg or {}).items() if v is not None}}
        if data.get("shards"):
            raise ValueError("monitor.every > 0 needs data.root (an eigtrain shard index with labelled splits); "
                             "it cannot read data.shards")
        self.data, self.dim, self.seed, self.device, self.autocast, self.pairs = data, dim, seed, device, autocast, pairs
        self.every = int(self.cfg["every"])
        mean, std = NORMALIZATION[data["augment"]]
        self.normalize = build_augment("none", image_size=data.get("view_size"), mean=tuple(data.get("mean") or mean),
                                       std=tuple(data.get("std") or std)).to(device)

    def due(self, step: int, end: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == end)

    @torch.no_grad()
    def _embed(self, encoder: nn.Module, split: str, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = self.data
        stream = ShardStream(data["root"], split=split, batch_size=int(self.cfg["batch_size"]), num_workers=0,
                             seed=self.seed, mode=data["mode"], image_size=data.get("image_size"), one_pass=True,
                             shuffle_block=0, max_corrupt=data.get("max_corrupt", 10))
        zs, labels, seen = [], [], 0
        for batch in stream:
            images = batch["x"] if self.pairs else batch["image"]
            x = self.normalize.view(images.to(self.device, non_blocking=True), None, 0)
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
        was_training, rng = model.training, ckpt.rng_state()
        model.eval()
        try:
            train_z, train_y = self._embed(encoder, self.cfg["train_split"], int(self.cfg["max_train_samples"]))
            val_z, val_y = self._embed(encoder, self.cfg["val_split"], int(self.cfg["max_val_samples"]))
        finally:
            model.train(was_training)
            ckpt.set_rng_state(rng)
        k = int(self.cfg["k"])
        return {f"knn/{d}": knn_accuracy(train_z[:, :d], train_y, val_z[:, :d], val_y, k=k) for d in dims_for(self.dim)}


def build_monitor(cfg, *, device: torch.device, autocast) -> KNNMonitor | None:
    """The monitor of a training config, or None when ``monitor.every`` is 0 / null / absent."""
    monitor_cfg = cfg.get("monitor") or {}
    if not monitor_cfg.get("every"):
        return None
    if cfg.engine.name == "deepspeed" and cfg.engine.get("zero_stage") == 3:
        raise ValueError("monitor.every > 0 is not available with engine.zero_stage=3 (rank 0 holds only its "
                         "partition of the weights); use zero_stage 1 or 2, or evaluate checkpoints afterwards")
    return KNNMonitor(monitor_cfg, cfg.data, dim=cfg.dim, seed=cfg.seed, device=device, autocast=autocast,
                      pairs=cfg.data.mode == "pairs")
