"""Exporting models trained under a mixed-precision dtype policy.

TFLite's builtin kernels have no float16 / bfloat16 versions of most ops, and
folding BatchNorm into a float16 kernel rounds the folded weights to float16
where the original applied BN in float32. So a `mixed_float16` or
`mixed_bfloat16` model is exported from a copy of its graph rebuilt from its
config with every half-precision layer under the `float32` policy (a layer
pinned to float32 stays float32) and the same weights: under a mixed policy
the variables are float32 already, so the copy holds the exact trained
values. The user's model and the global dtype policy are left as they were.

The artifact is then checked twice: against the float32 copy with the
float32 tolerances (the conversion is right), and against the original with
those plus `compute_tolerance` (the artifact computes what was trained, up
to the original's own half-precision rounding).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from kerasnorm._compat.keras_lora import lora_layers
from kerasnorm._compat.keras_lora import lora_variables
from kerasnorm._compat.keras_lora import merged_kernel
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.numerics.errors import ExportConversionError

HALF = ("float16", "bfloat16")
# Unit roundoff of each compute dtype: 2^-11 for float16 (10 stored mantissa
# bits), 2^-8 for bfloat16 (7).
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}

# A half-precision model's output differs from its float32 copy by about one
# rounding per layer that computes in half precision (inputs, weights and
# results are rounded; accumulations are float32), so the bound is the unit
# roundoff times a depth factor. Measured on the conv + GroupNorm + LayerNorm
# models of tests/export/test_precision.py, 10 seeds, 64 inputs each:
# max error over max |output| of 0.99 (median) and 3.25 (worst) roundoffs
# per layer under mixed_float16, 1.06 and 3.05 under mixed_bfloat16. 8 per
# layer (at least 4 layers' worth) leaves a factor 2.5 over the worst.
ROUNDOFFS_PER_LAYER = 8
MIN_DEPTH = 4


def half_precision_layers(model):
    """Names of the layers (nested models' included) that compute in float16
    or bfloat16, in model order; nested models and Inputs left out."""
    return list(dict.fromkeys(layer.name for layer in _half_layers(model)))


def computes_in_half(layer):
    """Whether `layer` itself computes in float16 or bfloat16: the one
    half-precision test of the export package (an InputLayer and a nested
    model compute nothing themselves)."""
    return (
        not isinstance(layer, (keras.Model, keras.layers.InputLayer))
        and keras.backend.standardize_dtype(layer.compute_dtype) in HALF
    )


def compute_dtype(model):
    """The widest-roundoff half-precision compute dtype in `model`, or None."""
    return half_dtype(all_layers(model))


def half_dtype(layers):
    """The widest-roundoff half-precision compute dtype among `layers`
    (`all_layers` of a model), or None."""
    return _widest(_in_half(layers))


def compute_tolerance(model):
    """How far `model`'s outputs may lie from its float32 copy's (max error
    over max |output|): `UNIT_ROUNDOFF` times `ROUNDOFFS_PER_LAYER` per
    half-precision layer; 0 for a float32 model."""
    return _tolerance(_half_layers(model))


@dataclasses.dataclass(frozen=True)
class Rebuild:
    """A half-precision model and the copy an exporter exports instead."""

    original: keras.Model
    copy: keras.Model
    policy: str  # the original's mixed policy, e.g. "mixed_float16"
    tolerance: float  # compute_tolerance(original)
    compute_dtype: str | None  # the copy's: None (float32) or "float16"


def rebuild(model, target="float32", *, layers):
    """A `Rebuild` of `model` whose copy computes in `target` ("float32", or
    "float16" for `mixed_float16`), or None when `model` has no layer
    computing in half precision (a `tf_keras` model is passed through too).
    `layers` is `all_layers(model)`, which the caller has derived."""
    if not isinstance(model, keras.Model):
        return None
    layers = _in_half(layers)
    if not layers:
        return None
    # The policy the half-precision layers use, the most common one when
    # they differ.
    names = [layer.dtype_policy.name for layer in layers]
    policy = max(dict.fromkeys(names), key=names.count)
    new = "float32" if target == "float32" else "mixed_float16"
    try:
        copy = _rebuilt(model, new)
    except Exception as err:
        named = ", ".join(repr(n) for n in dict.fromkeys(x.name for x in layers))
        raise ExportConversionError(
            f"Model {model.name!r} computes in half precision (layer(s) "
            f"{named} under {policy!r}) and could not "
            f"be rebuilt from its config under {new!r} to export it "
            f"({type(err).__name__}: {err}). Rebuild it under that policy "
            "yourself and copy the weights "
            "(`copy.set_weights(model.get_weights())`)."
        ) from err
    compute = None if new == "float32" else "float16"
    return Rebuild(model, copy, policy, _tolerance(layers), compute)


def _half_layers(model):
    """The layers of `model` that compute in half precision: one pass."""
    return _in_half(all_layers(model))


def _in_half(layers):
    """Those of `layers` that compute in half precision."""
    return [layer for layer in layers if computes_in_half(layer)]


def _widest(layers):
    dtypes = {keras.backend.standardize_dtype(x.compute_dtype) for x in layers}
    half = [d for d in HALF if d in dtypes]
    return max(half, key=UNIT_ROUNDOFF.get) if half else None


def _tolerance(layers):
    dtype = _widest(layers)
    if dtype is None:
        return 0.0
    depth = max(len(dict.fromkeys(x.name for x in layers)), MIN_DEPTH)
    return UNIT_ROUNDOFF[dtype] * ROUNDOFFS_PER_LAYER * depth


def _rebuilt(model, policy):
    return rebuilt_with_weights(
        model, lambda config: _with_policy(config, policy), policy=policy
    )


def rebuilt_with_weights(model, edit, *, policy=None):
    """`model` rebuilt from its config, edited by `edit(config)`, with its
    weights (each cast to the dtype of the copy's variable): the one rebuild
    of the export package (under another policy, in float64, unrolled).

    `policy` is the global dtype policy while the copy is built: sublayers a
    custom layer creates in its constructor take the global policy.
    """
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)
    config = edit(config)
    saved = keras.config.dtype_policy()
    try:
        if policy is not None:
            keras.config.set_dtype_policy(policy)
        copy = keras.saving.deserialize_keras_object(config)
    finally:
        keras.config.set_dtype_policy(saved)
    for target, value in _weight_values(model, copy):
        if tuple(target.shape) != value.shape:
            raise ValueError(f"the rebuilt weight {target.path} has another shape")
        target.assign(value.astype(keras.backend.standardize_dtype(target.dtype)))
    return copy


def _weight_values(model, copy):
    """`[(copy's weight, the model's value for it)]`: in order, or where
    the copy lacks the model's LoRA adapters (a config that does not carry
    them, as keras-hub backbones'), by path, each adapted kernel merged
    (`_compat.keras_lora`)."""
    sources, targets = model.weights, copy.weights

    def value(weight):
        return keras.ops.convert_to_numpy(weight.value)

    if len(sources) == len(targets):
        return [(t, value(s)) for t, s in zip(targets, sources, strict=True)]
    merged, adapters = {}, set()
    for layer in lora_layers(model):
        kernel, a, b = lora_variables(layer)
        merged[id(kernel)] = merged_kernel(layer)
        adapters.update((id(a), id(b)))
    by_path = {w.path: w for w in sources if id(w) not in adapters}
    if not merged or sorted(by_path) != sorted(t.path for t in targets):
        raise ValueError(
            f"the copy has {len(targets)} weights, the model {len(sources)}"
        )
    pairs = []
    for target in targets:
        source = by_path[target.path]
        pairs.append((target, merged.get(id(source), None)))
        if pairs[-1][1] is None:
            pairs[-1] = (target, value(source))
    return pairs


_HALF_POLICIES = ("mixed_float16", "mixed_bfloat16", "float16", "bfloat16")


def _with_policy(value, policy):
    """A serialized model with every half-precision dtype policy `policy`;
    float32 (and integer) layers keep theirs."""
    if isinstance(value, list):
        return [_with_policy(v, policy) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _with_policy(v, policy) for k, v in value.items()}
    dtype = value.get("dtype")
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
    if name in _HALF_POLICIES:
        out["dtype"] = policy
    return out


def float64_twin(model):
    """`model` rebuilt from its config with every float dtype float64, and
    its weights."""
    return rebuilt_with_weights(model, _float64_config)


def float64_outputs(model, inputs):
    """`model`'s outputs with every float computed in float64 (its
    `float64_twin` on `inputs` cast to float64), flattened, as numpy
    arrays: the reference of the float64 re-checks."""
    twin = float64_twin(model)
    inputs = keras.tree.map_structure(as_float64, inputs)
    return [np.asarray(y) for y in keras.tree.flatten(twin(inputs, training=False))]


def as_float64(x):
    x = np.asarray(x)
    return x.astype("float64") if np.issubdtype(x.dtype, np.floating) else x


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
