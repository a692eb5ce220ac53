"""Metrics: how an export is compared with the model it came from.

One place for what every check shares (folding's self-check, the tf_keras
rebuild of QAT, the verifier of every artifact):

- `output_errors`: the error metrics, with one floor and one NaN rule
  (public: `kerasnorm.export.output_errors`);
- the tolerances of the fold's, the rebuild's and the float64 checks (a
  quantize mode's is its `modes.Mode`);
- the float64 re-check's bound (`ROUNDING_FACTOR`; the float64 model is
  `precision.float64_outputs`, `Verification.float64_error`).
"""

from __future__ import annotations

import keras
import numpy as np

# --- the tolerance policy ----------------------------------------------------

# The parity tolerance of each quantize mode is its `modes.Mode`; the
# tolerances below are of the other checks.

# The fold's self-check (`fold_batchnorm`), per compute dtype of the model's
# layers, the least precise counting: 1e-5 for float32 (the fold's contract),
# a few units of rounding for half precision.
FOLD_TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}
# The fold's float64 re-check when no tolerance is given: the fold's own
# contract, whatever precision the model computes in.
FLOAT64_TOLERANCE = 1e-5
# The tf_keras rebuild of a Keras 3 model (`to_tf_keras`, `quantize_aware`):
# the same layers' math in another framework, float32 both.
REBUILD_TOLERANCE = 1e-5
# How many times the Keras model's own float32 rounding an artifact may
# differ from the float64 model by (beyond the tolerance) and still pass: the
# artifact computes the same function in float32 in another order (fused,
# reordered or other kernels), so its rounding is of that size, not equal.
ROUNDING_FACTOR = 4.0


def flat_outputs(model, inputs):
    """`model`'s inference outputs on `inputs`, flattened, as numpy arrays."""
    outputs = model(inputs, training=False)
    return [np.asarray(y) for y in keras.tree.flatten(outputs)]


# --- error metrics -----------------------------------------------------------

# The smallest output scale divided by: guards an all-zero output from a
# division by zero and changes no other figure.
SCALE_FLOOR = float(np.finfo("float32").tiny)


def output_errors(got, expected):
    """`(max_abs, max_rel, rms_rel)`: max absolute, max relative and rms
    relative error, the worst output counting, between two lists of
    outputs (arrays, one per output; `got` is reshaped to `expected`).

    The max relative error is max |got - expected| / max |expected|, the rms
    one rms(got - expected) / rms(expected); each scale is at least
    `SCALE_FLOOR`. Non-finite values: where both hold the same value (NaN
    and NaN, inf and inf) the difference is 0; any other non-finite
    difference is infinite, so it fails every tolerance; the scales leave
    `expected`'s non-finite values out.
    """
    abs_err = max_rel = rms_rel = 0.0
    for g, e in zip(got, expected, strict=True):
        diff, finite = _difference(g, e)
        err = float(np.max(diff, initial=0.0))
        scale = max(float(np.max(np.abs(finite), initial=0.0)), SCALE_FLOOR)
        rms = float(np.sqrt(np.mean(diff**2))) if diff.size else 0.0
        rms_scale = float(np.sqrt(np.mean(finite**2))) if finite.size else 0.0
        abs_err = max(abs_err, err)
        max_rel = max(max_rel, err / scale)
        rms_rel = max(rms_rel, rms / max(rms_scale, SCALE_FLOOR))
    return abs_err, max_rel, rms_rel


def max_rel_over(calls):
    """The max relative error of an artifact run at several shapes:
    `calls` is `[(got, expected)]`, one pair of output lists per shape;
    per output, the largest |got - expected| of any shape over the largest
    |expected| of any shape, the worst output counting (`output_errors`'
    max relative error, the shapes pooled: a second, smaller call's own
    scale does not shrink the denominator)."""
    worst = 0.0
    per_call = [list(zip(got, expected, strict=True)) for got, expected in calls]
    for pairs in zip(*per_call, strict=True):
        err, scale = 0.0, SCALE_FLOOR
        for g, e in pairs:
            diff, finite = _difference(g, e)
            err = max(err, float(np.max(diff, initial=0.0)))
            scale = max(scale, float(np.max(np.abs(finite), initial=0.0)))
        worst = max(worst, err / scale)
    return worst


class StreamedErrors:
    """`output_errors` and `max_rel_over` accumulated over chunks of samples:
    `add(got, expected)` per chunk (lists of arrays, one per output), the
    chunks of any call shapes in any order; nothing but five figures per
    output is kept, so a check over many long outputs holds one chunk at a
    time. `errors()` is `output_errors` of the concatenated chunks (to
    float64 summation order), `max_rel()` `max_rel_over` of them."""

    def __init__(self):
        # Per output: [max |diff|, max |finite expected|, sum diff^2,
        # sum expected^2, count].
        self.sums = None

    def add(self, got, expected):
        if self.sums is None:
            self.sums = [[0.0, 0.0, 0.0, 0.0, 0] for _ in expected]
        for sums, g, e in zip(self.sums, got, expected, strict=True):
            diff, finite = _difference(g, e)
            sums[0] = max(sums[0], float(np.max(diff, initial=0.0)))
            sums[1] = max(sums[1], float(np.max(np.abs(finite), initial=0.0)))
            sums[2] += float(np.sum(diff**2))
            sums[3] += float(np.sum(finite**2))
            sums[4] += diff.size

    def errors(self):
        """`(max_abs, max_rel, rms_rel)`, as `output_errors`."""
        abs_err = max_rel = rms_rel = 0.0
        for err, scale, sq_diff, sq_ref, count in self.sums or []:
            rms = (sq_diff / count) ** 0.5 if count else 0.0
            rms_scale = (sq_ref / count) ** 0.5 if count else 0.0
            abs_err = max(abs_err, err)
            max_rel = max(max_rel, err / max(scale, SCALE_FLOOR))
            rms_rel = max(rms_rel, rms / max(rms_scale, SCALE_FLOOR))
        return abs_err, max_rel, rms_rel

    def max_rel(self):
        """The max relative error, as `max_rel_over` (the shapes pooled)."""
        return self.errors()[1]

    def merge(self, other):
        """Pool `other`'s chunks into these (`max_rel_over` of both)."""
        if other.sums is None:
            return self
        if self.sums is None:
            self.sums = [[0.0, 0.0, 0.0, 0.0, 0] for _ in other.sums]
        for mine, theirs in zip(self.sums, other.sums, strict=True):
            mine[0] = max(mine[0], theirs[0])
            mine[1] = max(mine[1], theirs[1])
            for i in (2, 3, 4):
                mine[i] += theirs[i]
        return self


def _difference(got, expected):
    """`(|got - expected|, expected's finite values)` as float64 arrays, by
    `output_errors`' rule for non-finite values."""
    e = np.asarray(expected, "float64")
    g = np.asarray(got, "float64").reshape(e.shape)
    same = (g == e) | (np.isnan(g) & np.isnan(e))
    with np.errstate(invalid="ignore"):
        diff = np.abs(g - e)
    diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
    return diff, np.where(np.isfinite(e), e, 0.0)


def relative_error(expected, got):
    """max |got - expected| / max |expected| of one output (see `errors`)."""
    return output_errors([got], [expected])[1]
