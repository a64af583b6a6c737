"""A run directory: checkpoints (written, read safely, verified), its lock, lineage, provenance."""
