"""Stage 4, evaluation: the adaptive-dimension table, probes and retrieval (eigtrain-eval)."""
