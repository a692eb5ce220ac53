"""Metrics: how an export is compared with the model it came from.

One place for what every check shares (folding's self-check, the tf_keras
rebuild of QAT, the verifier of every artifact):

- `errors`: the error metrics, with one floor and one NaN rule;
- the tolerance policy: what is bounded, and how tightly, per export mode
  and per compute dtype;
- the float64 re-check that tells float rounding from a wrong computation
  (`float64_outputs`, `ROUNDING_FACTOR`; `Verification.float64_error`).
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm.export._common.precision import compute_dtype
from kerasnorm.export._common.precision import float64_twin

# --- the tolerance policy ----------------------------------------------------

# What the parity check bounds per quantize mode, and how tightly.
# float32 must match to 1e-4 of the output scale in the worst sample.
# float16 files round weights only (relative steps of 2^-11), activations
# stay float: the error is small and bounded, so the worst sample is checked
# (1e-2).
# int8 rounds every activation to one of 256 levels of its calibrated range
# and clips what falls outside it. The worst error over n samples keeps
# growing with n (0.04 to 0.17 of the output scale over 360 test digits for
# the same network trained with three seeds, so a bound on it fails or not
# by which samples are drawn), while the root mean square of the error
# against that of the output settles as n grows (0.021 to 0.031 there, the
# same on 32 samples). int8 is checked on that: 0.1, a signal-to-noise ratio
# of 20 dB, which a working int8 file stays well under; an output int8
# cannot resolve (an untrained 1000-way softmax, all near 1/1000) gives 1.
# Dynamic-range files round weights to 1/254 of each weight's range; through
# a recurrent layer that error compounds over the steps, and its worst sample
# is again a tail (LayerNormLSTM(32), 8 steps, trained one epoch on random
# data, three seeds: max 0.033 to 0.095, rms 0.018 to 0.020). dynamic is
# checked on the rms, at 0.05: perturbing the LSTM's input-gate kernel by 5%
# of its largest entry gives 0.070 to 0.089, by 10% 0.128 to 0.168.
# int16x8 (int16 activations, int8 weights) on the same models: rms 0.015 to
# 0.021 correct, 0.066 to 0.099 and 0.138 to 0.142 perturbed: 0.05 too.
CRITERION = {
    None: "max",
    "float16": "max",
    "dynamic": "rms",
    "int8": "rms",
    "int16x8": "rms",
}
DEFAULT_TOLERANCE = {
    None: 1e-4,
    "float16": 1e-2,
    "dynamic": 0.05,
    "int8": 0.1,
    "int16x8": 0.05,
}

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


def fold_tolerance(model):
    """The fold self-check's default tolerance for `model`: `FOLD_TOLERANCE`
    of the least precise compute dtype among its layers."""
    return FOLD_TOLERANCE[compute_dtype(model) or "float32"]


def flat_outputs(model, inputs):
    """`model`'s inference outputs on `inputs`, flattened, as numpy arrays."""
    outputs = model(inputs, training=False)
    return [np.asarray(y) for y in keras.tree.flatten(outputs)]


# --- error metrics -----------------------------------------------------------

# The smallest output scale divided by: guards an all-zero output from a
# division by zero and changes no other figure.
SCALE_FLOOR = float(np.finfo("float32").tiny)


def errors(got, expected):
    """Max absolute, max relative and rms relative error, the worst output
    counting, between two lists of outputs.

    The max relative error is max |got - expected| / max |expected|, the rms
    one rms(got - expected) / rms(expected); each scale is at least
    `SCALE_FLOOR`. Non-finite values: where both hold the same value (NaN
    and NaN, inf and inf) the difference is 0; any other non-finite
    difference is infinite, so it fails every tolerance; the scales leave
    `expected`'s non-finite values out.
    """
    abs_err = max_rel = rms_rel = 0.0
    for g, e in zip(got, expected, strict=True):
        e = np.asarray(e, "float64")
        g = np.asarray(g, "float64").reshape(e.shape)
        same = (g == e) | (np.isnan(g) & np.isnan(e))
        with np.errstate(invalid="ignore"):
            diff = np.abs(g - e)
        diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
        finite = np.where(np.isfinite(e), e, 0.0)
        err = float(np.max(diff, initial=0.0))
        scale = max(float(np.max(np.abs(finite), initial=0.0)), SCALE_FLOOR)
        rms = float(np.sqrt(np.mean(diff**2))) if diff.size else 0.0
        rms_scale = float(np.sqrt(np.mean(finite**2))) if finite.size else 0.0
        abs_err = max(abs_err, err)
        max_rel = max(max_rel, err / scale)
        rms_rel = max(rms_rel, rms / max(rms_scale, SCALE_FLOOR))
    return abs_err, max_rel, rms_rel


def relative_error(expected, got):
    """max |got - expected| / max |expected| of one output (see `errors`)."""
    return errors([got], [expected])[1]


# --- float64 ---------------------------------------------------------------


def as_float64(x):
    x = np.asarray(x)
    return x.astype("float64") if np.issubdtype(x.dtype, np.floating) else x


def float64_outputs(model, inputs):
    """`model`'s outputs with every float computed in float64, flattened."""
    twin = float64_twin(model)
    return flat_outputs(twin, keras.tree.map_structure(as_float64, inputs))
