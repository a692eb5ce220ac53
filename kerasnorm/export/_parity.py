"""Parity: how an export is compared with the model it came from.

One place for what every check shares (folding's self-check, the tf_keras
rebuild of QAT, the SavedModel and TFLite parity checks, `verify`, the
streaming step check):

- `sample_inputs`: the inputs a check runs on when none are given;
- `errors`: the error metrics, with one floor and one NaN rule;
- the tolerance policy: what is bounded, and how tightly, per export mode
  and per compute dtype;
- the float64 re-check that tells float rounding from a wrong computation
  (`float64_outputs`, `ROUNDING_FACTOR`, `Verification.float64_error`).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from kerasnorm.export._model import all_layers
from kerasnorm.export._model import input_structure

L = keras.layers

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

_HALF = ("float16", "bfloat16")


def fold_tolerance(model):
    """The fold self-check's default tolerance for `model`: `FOLD_TOLERANCE`
    of the least precise compute dtype among its layers."""
    dtypes = {
        keras.backend.standardize_dtype(layer.compute_dtype)
        for layer in all_layers(model)
    }
    default = FOLD_TOLERANCE["float32"]
    return max((FOLD_TOLERANCE.get(d, default) for d in dtypes), default=default)


def half_precision(model):
    """Whether a layer of `model` computes in float16 or bfloat16."""
    return any(
        keras.backend.standardize_dtype(layer.compute_dtype) in _HALF
        for layer in all_layers(model)
    )


# --- sample inputs -----------------------------------------------------------

# Sizes tried, in turn, for an input dimension the model leaves undefined: a
# model may bound it (a position embedding of 16 positions).
SAMPLE_DIMS = (32, 16, 8, 4, 2, 1)


def sample_inputs(model, batch, seed=0, sizes=SAMPLE_DIMS):
    """Random inputs the model runs on, in `model.inputs` order: what every
    check runs on when it is given no inputs.

    Floats are standard normal; integers lie below the smallest
    `Embedding.input_dim` in the model (so that every embedding accepts
    them), or in {0, 1} without one. An undefined dimension is the first of
    `sizes` the model runs on; when none works the error names the input and
    the dimension.
    """
    specs = keras.tree.flatten(input_structure(model))
    high = min(
        (layer.input_dim for layer in all_layers(model) if type(layer) is L.Embedding),
        default=2,
    )
    undefined = [
        (x.name, axis)
        for x in specs
        for axis, d in enumerate(x.shape)
        if d is None and axis > 0
    ]

    def sample(size):
        rng = np.random.default_rng(seed)
        arrays = []
        for x in specs:
            shape = (batch, *(size if d is None else d for d in x.shape[1:]))
            dtype = keras.backend.standardize_dtype(x.dtype)
            if "float" in dtype:
                arrays.append(rng.standard_normal(shape).astype(dtype))
            elif "int" in dtype or dtype == "bool":
                arrays.append(rng.integers(0, high, shape).astype(dtype))
            else:
                raise ValueError(
                    f"Cannot make a random sample for input {x.name!r} of "
                    f"dtype {dtype}; pass verify_inputs= with valid inputs."
                )
        return arrays

    if not undefined:
        return sample(None)
    failures = []
    for size in sizes:
        arrays = sample(size)
        try:
            flat_outputs(
                model, keras.tree.pack_sequence_as(input_structure(model), arrays)
            )
        except Exception as err:
            failures.append(err)
            continue
        return arrays
    where = ", ".join(f"input {name!r} dimension {axis}" for name, axis in undefined)
    raise ValueError(
        f"Cannot invent inputs that model {model.name!r} runs on: {where} is "
        f"undefined, and the model failed at every size tried "
        f"({', '.join(map(str, sizes))}); pass verify_inputs= with "
        f"valid inputs. At size {sizes[-1]} it raised: {failures[-1]}"
    ) from failures[-1]


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


# --- the float64 re-check ----------------------------------------------------


@dataclasses.dataclass
class Verification:
    """How an exported artifact compares with the Keras model it came from.

    Errors are over all samples, the worst output counting:
    `max_rel_error` is max |artifact - keras| divided by max |keras|, and
    `rms_rel_error` is the root mean square of the difference divided by
    that of the Keras output (the inverse square root of the signal to
    quantization noise ratio). `criterion` says which one `tolerance` bounds:
    `"max"` for float exports, `"rms"` for int8 (see `DEFAULT_TOLERANCE`).

    When the max error exceeds `tolerance`, the model is run again in
    float64 (rebuilt with the same weights): `float64_error` is the
    artifact's max relative error against that, `float32_rounding` the Keras
    model's own (float32 against float64). The artifact then passes if
    `float64_error` is within `tolerance` plus `ROUNDING_FACTOR` times
    `float32_rounding`: a deep network whose float32 rounding alone exceeds
    the tolerance is not refused, an artifact that computes something else
    is. Both are None when no re-check ran.
    """

    artifact: str
    kind: str  # "saved_model" or "tflite"
    size_bytes: int
    ops: dict[str, int]
    max_abs_error: float
    max_rel_error: float
    rms_rel_error: float
    tolerance: float
    criterion: str  # "max" or "rms"
    latency_ms: float
    samples: int
    float64_error: float | None = None
    float32_rounding: float | None = None

    @property
    def checked_error(self) -> float:
        """The error `tolerance` bounds: `max_rel_error` or `rms_rel_error`."""
        return self.max_rel_error if self.criterion == "max" else self.rms_rel_error

    @property
    def passed(self) -> bool:
        """Whether the artifact is within `tolerance` of the model.

        Either `checked_error` is within it, or (for the `max` criterion)
        the artifact is within it plus `ROUNDING_FACTOR` times Keras' own
        float32 rounding of the float64 model: float32 rounding, not a
        wrong export.
        """
        if self.checked_error <= self.tolerance:
            return True
        if self.float64_error is None or self.criterion != "max":
            return False
        bound = self.tolerance + ROUNDING_FACTOR * self.float32_rounding
        return bool(self.float64_error <= bound)

    def __str__(self) -> str:
        status = "ok" if self.passed else "FAILED"
        return (
            f"{self.artifact}: {self.kind}, {self.size_bytes / 1024:.1f} KiB, "
            f"{sum(self.ops.values())} ops, {self.samples} samples, max abs "
            f"error {self.max_abs_error:.2e}, max rel error "
            f"{self.max_rel_error:.2e}, rms rel error {self.rms_rel_error:.2e} "
            f"({self.criterion} tolerance {self.tolerance:.3g}, {status}), "
            f"{self.latency_ms:.3f} ms/call"
            + (
                ""
                if self.float64_error is None
                else f"; against float64 Keras {self.float64_error:.2e}, Keras' "
                f"own float32 rounding {self.float32_rounding:.2e}"
            )
        )


def float64_recheck(result, model, inputs, got, expected):
    """Fill in `float64_error` and `float32_rounding` of `result` (see
    `Verification`) from `model` run on `inputs` (the structure it takes);
    leave them None when the model cannot be rebuilt in float64."""
    try:
        exact = float64_outputs(model, inputs)
    except Exception:
        return
    exact = [np.asarray(y, "float64") for y in exact]
    result.float64_error = errors(got, exact)[1]
    result.float32_rounding = errors(expected, exact)[1]


def as_float64(x):
    x = np.asarray(x)
    return x.astype("float64") if np.issubdtype(x.dtype, np.floating) else x


def float64_twin(model):
    """`model` rebuilt from its config with every float dtype float64, and
    its weights."""
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)
    twin = keras.saving.deserialize_keras_object(_float64_config(config))
    for target, source in zip(twin.weights, model.weights, strict=True):
        value = np.asarray(source.numpy())
        if tuple(target.shape) != value.shape:
            raise ValueError(f"the rebuilt weight {target.path} has another shape")
        target.assign(value.astype(keras.backend.standardize_dtype(target.dtype)))
    return twin


def float64_outputs(model, inputs):
    """`model`'s outputs with every float computed in float64, flattened."""
    twin = float64_twin(model)
    return flat_outputs(twin, keras.tree.map_structure(as_float64, inputs))


_FLOAT_NAMES = {"float16", "bfloat16", "float32", "mixed_float16", "mixed_bfloat16"}


def _float64_config(value):
    """A serialized model with every float dtype and dtype policy float64."""
    if isinstance(value, list):
        return [_float64_config(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _float64_config(v) for k, v in value.items()}
    dtype = value.get("dtype")
    if isinstance(dtype, str) and dtype in _FLOAT_NAMES:
        out["dtype"] = "float64"
    elif (
        isinstance(dtype, dict) and dtype.get("config", {}).get("name") in _FLOAT_NAMES
    ):
        out["dtype"] = "float64"
    return out
