"""Stage 1 of an export: the model prepared once (`prepared.prepare`)."""
