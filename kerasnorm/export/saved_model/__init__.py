"""The SavedModel format: its public door (`export.to_saved_model`) and its
writer (`write`)."""
