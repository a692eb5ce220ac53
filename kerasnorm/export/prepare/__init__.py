"""Stage 1 of an export: the model prepared once (`stage.prepare`)."""
