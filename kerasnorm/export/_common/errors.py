"""The errors an export raises (`FoldVerificationError` is the fold's)."""


class ExportVerificationError(RuntimeError):
    """An exported artifact does not reproduce the Keras model closely enough."""


class ExportConversionError(ValueError):
    """The converter could not express the model (TFLite builtins, say)."""
