"""Stage 2, training: the eigtrain-train command, its loop's state, metrics and monitor."""
