"""The check smoothing runs on the model it rescaled (`fold.smooth`,
`fold.smooth_head`): the same outputs on the calibration data as before,
within float32 rounding, or the caller puts the weights back and says
why."""

from __future__ import annotations

import keras
import numpy as np

# max |copy - model| / max |model| the copy must meet in float32: it only
# multiplies and divides weights by the same factors.
SELF_CHECK = 1e-4
# Values compared at a time in float64 (`relative_difference`).
CHUNK = 1 << 20


def self_check(model, expected, data):
    """Raises ValueError where `model`'s outputs on `data` differ from
    `expected` (its flattened outputs before) by more than `SELF_CHECK`
    of their range."""
    got = keras.tree.flatten(model(data, training=False))
    for e, g in zip(expected, got, strict=True):
        error = relative_difference(np.asarray(e), np.asarray(g))
        if error > SELF_CHECK:
            raise ValueError(
                f"Smoothing model {model.name!r} changed its float output by "
                f"{error:.2g} of its range (more than {SELF_CHECK:g}): a norm "
                "this smoothing rescales feeds something other than its "
                "linear readers. Export with smooth=None and report the model."
            )


def relative_difference(expected, got):
    """`max |got - expected| / max |expected|`, in float64 a chunk of
    `CHUNK` values at a time: a large vocabulary's logits are a gigabyte
    in float64 (Gemma 3's 262,144 entries on 512 tokens), and whole copies
    of them were most of the smoothing's memory."""
    expected, got = np.ravel(expected), np.ravel(got)
    if expected.shape != got.shape:
        raise ValueError(f"shapes differ: {expected.shape} and {got.shape}")
    difference = largest = 0.0
    for start in range(0, expected.size, CHUNK):
        e = expected[start : start + CHUNK].astype("float64")
        g = got[start : start + CHUNK].astype("float64")
        difference = max(difference, float(np.abs(e - g).max()))
        largest = max(largest, float(np.abs(e).max()))
    return difference / max(largest, 1e-12)
