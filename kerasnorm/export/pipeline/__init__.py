"""The export pipeline every format runs (`run.run_export`: refuse, prepare,
staged write, verify) and what it returns (`result.ExportResult`)."""
