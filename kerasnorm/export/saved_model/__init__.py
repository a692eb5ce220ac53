"""Stage 2 for SavedModel: the writer (`write`)."""
