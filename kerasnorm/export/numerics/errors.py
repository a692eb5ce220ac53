"""The errors an export raises (`FoldVerificationError` is the fold's)."""


class ExportVerificationError(RuntimeError):
    """An exported artifact does not reproduce the Keras model closely enough."""


class ExportConversionError(ValueError):
    """The converter could not express the model (TFLite builtins, say).

    The message starts with one sentence naming the op, the layer(s) that
    produce it and what to do; `details` holds the converter's own text
    (an MLIR dump, often kilobytes), or None when there is none.
    """

    def __init__(self, message, details=None):
        super().__init__(message)
        self.details = details
