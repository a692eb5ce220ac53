"""The export pipeline, one function per format: prepare (`prepare`), write
(`tflite`, `saved_model`), verify (`verify`); `ExportResult` (`result`)."""
