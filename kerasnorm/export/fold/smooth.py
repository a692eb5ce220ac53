"""Norm-aware smoothing for int8 (docs/design.md, "Smoothing a norm's
output"): per-channel scale moved from a norm's output into the linear
layers reading it, folded into the norm's gain.

A norm `y = g * n(x) + b` read only by linear layers `z = y W + c` becomes
`y' = (g / s) * n(x) + b / s` with row `j` of every reader's kernel (its
input-channel axis) scaled by `s_j`: `y' W' = y W`, the same function in
exact arithmetic, while the int8 tensor `y'` no longer carries the few
channels a trained model makes tens of times larger than the rest (its
per-tensor scale was set by them, rounding every other channel to a few
levels). `s_j = max|y_j|^a / max|W_j|^(1 - a)` (SmoothQuant's migration
strength `a`), `max|y_j|` from the calibration data; the strength is
searched per norm (`STRENGTHS`) on a simulated int8 product unless given.

The sites: kerasnorm's norms and Keras' `LayerNormalization` in a
functional graph whose output reaches only linear layers (the affine
fold's walk, `fold.affine`), and the norms of keras-hub's decoder blocks
(`_compat.keras_hub_blocks`: Gemma's `1 + scale` gain, Llama's, Mistral's,
Qwen3's, Phi3's, GPT-2's `LayerNormalization`). The weights change in
place and are checked against the model's float output before they are
used; the export puts them back.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm._compat import replace_method
from kerasnorm._compat import restore_method
from kerasnorm._compat import sublayers
from kerasnorm._compat.keras_hub_blocks import decoder_norm_readers
from kerasnorm._compat.keras_hub_blocks import gain_offset
from kerasnorm._compat.keras_hub_blocks import gated_readers
from kerasnorm.export.fold import affine
from kerasnorm.export.fold import plan as _fold_plan
from kerasnorm.export.fold.rewrite import _call_counts
from kerasnorm.export.fold.self_check import self_check

L = keras.layers
# Migration strengths tried per norm (`smooth=True`); no smoothing (s = 1)
# is always a candidate too.
STRENGTHS = (0.25, 0.5, 0.75, 0.85)
# How the simulated product quantizes its input (`smooth`'s `activations`):
# int8 per tensor, asymmetric (a calibrated int8 file); int8 per row,
# asymmetric (a dynamic-range product: XNNPACK's, per token); not at all
# (int8 weights dequantized, float arithmetic).
PER_TENSOR, PER_ROW, FLOAT = "per_tensor", "per_row", "float"
# The strengths searched for a per-row or float product: weights-only
# smoothing (strength 0, every channel's weights brought to one range) is
# the one that helps a float product; a dynamic one weighs both.
ROW_STRENGTHS = (0.0, 0.2, 0.35, 0.5, 0.65, 0.8)
# Rows of calibration activations the strength search simulates per norm.
SEARCH_ROWS = 4096
_INT8 = 127.0


@dataclasses.dataclass(frozen=True)
class Smoothed:
    """One smoothed norm: its name, its readers' names, the strength used
    and the ratio of its output's largest channel maximum to the median
    channel maximum before and after."""

    norm: str
    readers: tuple
    strength: float
    spread_before: float
    spread_after: float


def smoothing_sites(model):
    """`[(norm, [readers])]`: every norm of `model` that smoothing can
    rescale, and the linear layers (`Dense`, `EinsumDense`, a convolution)
    that read its output, only they."""
    sites = []
    graph = functional_of(model)
    if graph is not None:
        calls = _call_counts(model)
        nodes = graph_nodes(graph)
        wiring = _fold_plan.Wiring.of(nodes, graph.outputs, calls)
        for node in nodes:
            norm = node.operation
            if type(norm) not in affine.NORMS or norm.gamma is None:
                continue
            if not affine._foldable_norm(norm, node, calls):
                continue
            channels = node.outputs[0].shape[-1]
            walk = affine._Walk(wiring, calls, np.ones(channels), np.zeros(channels))
            if walk.reaches_only_linear(node.outputs[0]) and all(
                _input_axis(r) is not None for r in walk.linear
            ):
                sites.append((norm, list(walk.linear)))
    for layer in sublayers(model, recursive=True):
        sites += [
            (norm, readers)
            for norm, readers in decoder_norm_readers(layer)
            if _gain(norm) is not None
            and all(_input_axis(r) is not None for r in readers)
        ]
    return sites


def gated_sites(model):
    """`[(up, [down])]`: each keras-hub gated feed-forward whose product
    `act(gate(x)) * up(x)` is read by `down` alone (`gated_readers`), the
    `up` product's output channels scaled instead of a norm's gain."""
    return [
        (up, [down])
        for layer in sublayers(model, recursive=True)
        for up, down in gated_readers(layer)
        if _output_axis(up) is not None and _input_axis(down) is not None
    ]


def smooth(model, data, strength=None, activations=PER_TENSOR, gated=False):
    """Smooth every site of `model` in place; returns the `Smoothed` list
    and a function that puts the weights back exactly. `data` (inputs in
    the model's structure) calibrates the channel maxima. `strength`: a
    float in [0, 1] for every norm, or None to search `STRENGTHS` per norm
    (`ROW_STRENGTHS` for `activations` other than `PER_TENSOR`).
    `activations`: how the products quantize their inputs (`PER_TENSOR`,
    `PER_ROW`, `FLOAT`), which the search simulates. `gated`: smooth the
    gated feed-forwards' down products too (`gated_sites`).
    Raises ValueError (the weights put back) when the smoothed model
    computes something else than before, beyond float32 rounding.

    In place, not on a copy: a model rebuilt from its config can lose what
    ties its layers (keras-hub's token embedding reused as the head)."""
    sites = smoothing_sites(model) + (gated_sites(model) if gated else [])
    if not sites:
        return [], lambda: None
    before = keras.tree.flatten(model(data, training=False))
    outputs = _site_inputs(model, sites, data)
    saved = [
        (v, v.numpy())
        for norm, readers in sites
        for v in (*_gain_variables(norm), *(r.kernel for r in readers))
    ]

    def restore():
        for variable, value in saved:
            variable.assign(value)

    done = []
    for (norm, readers), y in zip(sites, outputs, strict=True):
        kernels = [_kernel_rows(r) for r in readers]
        chosen, scale = _choose(y, kernels, strength, activations)
        if scale is None:
            continue
        _rescale(norm, readers, scale)
        act = np.abs(y).max(axis=0)
        done.append(
            Smoothed(
                norm.name,
                tuple(r.name for r in readers),
                chosen,
                _spread(act),
                _spread(act / scale),
            )
        )
    try:
        self_check(model, before, data)
    except ValueError:
        restore()
        raise
    return done, restore


def _gain_variables(norm):
    if _output_axis(norm) is not None:
        bias = getattr(norm, "bias", None)
        return (norm.kernel,) if bias is None else (norm.kernel, bias)
    gain, _, bias = _gain(norm)
    return (gain,) if bias is None else (gain, bias)


def _spread(channel_max):
    return float(channel_max.max() / max(np.median(channel_max), 1e-12))


def _gain(norm):
    """`(gain variable, offset, bias variable or None)`: the norm computes
    `n(x) * (gain + offset) + bias` per channel."""
    if type(norm) in affine.NORMS:
        return (norm.gamma, 0.0, norm.beta) if norm.gamma is not None else None
    scale = getattr(norm, "scale", None)
    if isinstance(scale, keras.Variable) and len(scale.shape) == 1:
        return scale, gain_offset(norm), None
    return None


def _input_axis(layer):
    """The kernel axis indexed by the input's last axis, else None."""
    if isinstance(layer, L.EinsumDense):
        left = layer.equation.split("->")[0].split(",")
        if len(left) != 2 or left[0][-1] not in left[1]:
            return None
        return left[1].index(left[0][-1])
    if type(layer) in (L.Dense, L.Conv1D, L.Conv2D, L.Conv3D) and getattr(
        layer, "groups", 1
    ) in (1, None):
        return layer.kernel.ndim - 2 if type(layer) is not L.Dense else 0
    return None


def _output_axis(layer):
    """The kernel axis indexing the output's last axis of a `Dense` or
    `EinsumDense`, else None."""
    if isinstance(layer, L.EinsumDense):
        left, out = layer.equation.split("->")
        kernel = left.split(",")
        if len(kernel) != 2 or out[-1] not in kernel[1] or out[-1] in kernel[0]:
            return None
        return kernel[1].index(out[-1])
    if type(layer) is L.Dense:
        return 1
    return None


def _kernel_rows(layer):
    """The reader's kernel as `[input channels, everything else]`."""
    kernel = np.asarray(layer.kernel.numpy(), "float64")
    return np.moveaxis(kernel, _input_axis(layer), 0).reshape(
        kernel.shape[_input_axis(layer)], -1
    )


def _choose(
    y,
    kernels,
    strength,
    activations=PER_TENSOR,
    simulated=None,
    min_cut=1.0,
    maxima=None,
):
    """`(strength, s)`: the scale of the strength given, or of the one
    whose simulated int8 product errs least, and at most `min_cut` times
    as much as none (`(0, None)`: none does). The scale is the kernels'
    (every input row's largest weight, or `maxima` where the caller has
    them: a head's table is too large to pass whole); the search simulates
    `simulated` (a sample of their columns; default the kernels)."""
    act = np.maximum(np.abs(y).max(axis=0), 1e-8)
    if maxima is None:
        maxima = np.max([np.abs(k).max(axis=1) for k in kernels], axis=0)
    weight = np.maximum(maxima, 1e-8)

    def scale_of(a):
        s = act**a / weight ** (1.0 - a)
        return s / np.exp(np.mean(np.log(s)))  # keep the gain's magnitude

    if strength is not None:
        return float(strength), scale_of(strength)
    rows = y[:SEARCH_ROWS]
    simulated = kernels if simulated is None else simulated
    best = (0.0, None)
    best_error = min_cut * _product_error(rows, simulated, None, activations)
    for a in STRENGTHS if activations == PER_TENSOR else ROW_STRENGTHS:
        s = scale_of(a)
        error = _product_error(rows, simulated, s, activations)
        if error < best_error:
            best, best_error = (a, s), error
    return best


def _product_error(y, kernels, s, activations=PER_TENSOR):
    """Squared error of the int8 product `q(y / s) q(s W)` against `y W`:
    activations per tensor or per row, asymmetric, or float
    (`activations`), per-output-channel weights, as the converter and the
    generative weights pass quantize a `FULLY_CONNECTED`."""
    ys = y if s is None else y / s
    if activations == FLOAT:
        yq = ys
    else:
        axis = None if activations == PER_TENSOR else -1
        low = np.minimum(ys.min(axis=axis, keepdims=True), 0.0)
        high = np.maximum(ys.max(axis=axis, keepdims=True), 0.0)
        step = np.maximum(high - low, 1e-12) / 255.0
        yq = np.round((ys - low) / step) * step + low
    error = 0.0
    for k in kernels:
        ks = k if s is None else k * s[:, None]
        wstep = np.maximum(np.abs(ks).max(axis=0), 1e-12) / _INT8
        kq = np.round(ks / wstep) * wstep
        error += float(np.sum((yq @ kq - y @ k) ** 2))
    return error


def _rescale(norm, readers, s):
    axis = _output_axis(norm)
    if axis is not None:
        # A linear product's output channels (a gated feed-forward's up).
        kernel = np.asarray(norm.kernel.numpy(), "float64")
        shape = [1] * kernel.ndim
        shape[axis] = -1
        norm.kernel.assign((kernel / s.reshape(shape)).astype(norm.kernel.dtype))
        bias = getattr(norm, "bias", None)
        if bias is not None:
            bias.assign((np.asarray(bias.numpy(), "float64") / s).astype(bias.dtype))
    else:
        _rescale_gain(norm, s)
    for layer in readers:
        axis = _input_axis(layer)
        kernel = np.asarray(layer.kernel.numpy(), "float64")
        shape = [1] * kernel.ndim
        shape[axis] = -1
        layer.kernel.assign((kernel * s.reshape(shape)).astype(layer.kernel.dtype))


def _rescale_gain(norm, s):
    gain, offset, bias = _gain(norm)
    g = np.asarray(gain.numpy(), "float64") + offset
    gain.assign((g / s - offset).astype(gain.dtype))
    if bias is not None:
        bias.assign((np.asarray(bias.numpy(), "float64") / s).astype(bias.dtype))


def _site_inputs(model, sites, data):
    """What each site's readers read on `data`, `[rows, channels]`
    float64: a norm's output, a gated product's input (its first reader's
    input, recorded)."""
    norms = [n for n, _ in sites if _output_axis(n) is None]
    downs = [readers[0] for n, readers in sites if _output_axis(n) is not None]
    seen = dict(zip(map(id, norms), _norm_outputs(model, norms, data), strict=True))
    seen.update(zip(map(id, downs), _layer_inputs(model, downs, data), strict=True))
    return [
        seen[id(n) if _output_axis(n) is None else id(readers[0])]
        for n, readers in sites
    ]


def _layer_inputs(model, layers, data):
    """Each of `layers`' input on `data`, as `[rows, channels]` float64."""
    seen = {id(layer): [] for layer in layers}
    saved = {}

    def recorder(layer, call):
        def recorded(inputs, *args, **kwargs):
            seen[id(layer)].append(np.asarray(keras.ops.convert_to_numpy(inputs)))
            return call(inputs, *args, **kwargs)

        return recorded

    for layer in layers:
        saved[id(layer)] = layer.__dict__.get("call")
        replace_method(layer, "call", recorder(layer, layer.call))
    try:
        model(data, training=False)
    finally:
        for layer in layers:
            restore_method(layer, "call", saved[id(layer)])
    return [
        np.concatenate([o.reshape(-1, o.shape[-1]) for o in seen[id(x)]]).astype(
            "float64"
        )
        for x in layers
    ]


def _norm_outputs(model, norms, data):
    """Each norm's output on `data`, as `[rows, channels]` float64."""
    seen = {id(n): [] for n in norms}
    saved = {}

    def recorder(norm, call):
        def recorded(*args, **kwargs):
            out = call(*args, **kwargs)
            seen[id(norm)].append(np.asarray(keras.ops.convert_to_numpy(out)))
            return out

        return recorded

    for norm in norms:
        saved[id(norm)] = norm.__dict__.get("call")
        replace_method(norm, "call", recorder(norm, norm.call))
    try:
        model(data, training=False)
    finally:
        for norm in norms:
            restore_method(norm, "call", saved[id(norm)])
    return [
        np.concatenate([o.reshape(-1, o.shape[-1]) for o in seen[id(n)]]).astype(
            "float64"
        )
        for n in norms
    ]
