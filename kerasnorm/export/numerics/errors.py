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


def with_sentence(err, sentence):
    """A new error of `err`'s type whose message has `sentence` after its
    first sentence (the one saying what failed; for a parity check, the one
    ending "above the tolerance ..."), or at its end when it has one
    sentence."""
    text = str(err)
    anchor = max(text.find("above the tolerance"), 0)
    cut = text.find(". ", anchor) + 2
    if cut < 2:
        return type(err)(f"{text.rstrip()} {sentence}")
    return type(err)(f"{text[:cut]}{sentence} {text[cut:]}".strip())
