"""Hydra configs of eigtrain-train, shipped as package data (eigtrain.configs); see configs/train.yaml."""
