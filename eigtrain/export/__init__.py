"""Stage 3, export: Rayleigh-Ritz over a trained encoder's embeddings (eigtrain-rr), its files and cuts."""
