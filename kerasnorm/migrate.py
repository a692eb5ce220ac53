"""Moving trained TensorFlow Addons weights into kerasnorm layers.

TensorFlow Addons (end of life, Keras 2 only) saved its layers' weights in
the orders below: what `layer.get_weights()` returned and what its `.h5`
files hold, per layer, in that order.

- `WeightNormalization(layer)`: `g`, the layer's `kernel`, `bias` (if any),
  `initialized` -> `WeightNorm(layer)`.
- `GroupNormalization` / `InstanceNormalization`: `gamma`, `beta` (each if
  enabled) -> `GroupNorm` / `InstanceNorm`.
- `rnn.LayerNormLSTMCell`: `kernel`, `recurrent_kernel`, `bias`, then gamma
  and beta of `kernel_norm`, `recurrent_norm` and `state_norm` ->
  `LayerNormLSTMCell` (or the cell of `LayerNormLSTM`), same order.
- `rnn.LayerNormSimpleRNNCell`: `kernel`, `recurrent_kernel`, `bias` (if
  any), the LN's gamma -> `LayerNormSimpleRNNCell` (or the cell of
  `LayerNormSimpleRNN`); TensorFlow Addons' LN has no beta
  (h = f(gamma * norm(a) + b)), so kerasnorm's LN beta is set to 0.

The layouts and the equations they imply are in the
[Migration guide](../guides/migration.md).
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm.norms import GroupNorm
from kerasnorm.norms import InstanceNorm
from kerasnorm.norms import WeightNorm
from kerasnorm.norms.weight_norm import kernel_norm_axes
from kerasnorm.recurrent import LayerNormLSTM
from kerasnorm.recurrent import LayerNormLSTMCell
from kerasnorm.recurrent import LayerNormSimpleRNN
from kerasnorm.recurrent import LayerNormSimpleRNNCell


def from_tfa_weights(layer: keras.layers.Layer, weights: list) -> None:
    """Set a built kerasnorm `layer` from a TensorFlow Addons layer's weights.

    `weights` is the list the TensorFlow Addons layer's `get_weights()`
    returned (numpy arrays, in that order). `layer` must be built with the
    same configuration (units, filters, groups, ...). For `WeightNorm` around
    a `Conv*DTranspose` or `DepthwiseConv*D`, TensorFlow Addons took the norm
    over every kernel axis but the last, which is not the output-channel axis
    of those kernels; the effective kernel it computed is moved instead
    (`v` = that kernel, `g` = its norm per output channel), so the layer
    computes the same function.
    """
    if not layer.built:
        raise ValueError(
            "`from_tfa_weights` needs a built layer (call it or build it "
            f"first). Received: layer={layer.name!r}, built=False"
        )
    weights = [np.asarray(w) for w in weights]
    if isinstance(layer, WeightNorm):
        weights = _weight_norm_weights(layer, weights)
        targets = _weight_norm_targets(layer)
    elif isinstance(layer, (GroupNorm, InstanceNorm, LayerNormLSTMCell)):
        targets = list(layer.weights)
    elif isinstance(layer, LayerNormLSTM):
        targets = list(layer.cell.weights)
    elif isinstance(layer, (LayerNormSimpleRNNCell, LayerNormSimpleRNN)):
        cell = layer.cell if isinstance(layer, LayerNormSimpleRNN) else layer
        targets = list(cell.weights)
        # TensorFlow Addons' LN has no beta: kerasnorm's is the last weight.
        weights = [*weights, np.zeros(tuple(targets[-1].shape), "float32")]
    else:
        raise ValueError(
            "`from_tfa_weights` moves weights into WeightNorm, GroupNorm, "
            "InstanceNorm, LayerNormLSTMCell, LayerNormLSTM, "
            "LayerNormSimpleRNNCell or LayerNormSimpleRNN. Received: "
            f"layer={layer.name!r} (class {type(layer).__name__})"
        )
    if len(weights) != len(targets):
        raise ValueError(
            f"`{type(layer).__name__}` {layer.name!r} expects "
            f"{len(targets)} TensorFlow Addons weights. Received: "
            f"{len(weights)} arrays"
        )
    for target, value in zip(targets, weights, strict=True):
        if tuple(target.shape) != value.shape:
            raise ValueError(
                f"Weight `{target.path}` has shape {tuple(target.shape)}. "
                f"Received: an array of shape {value.shape}"
            )
    for target, value in zip(targets, weights, strict=True):
        target.assign(value.astype(target.dtype))


def _weight_norm_targets(layer):
    inner = layer.layer
    targets = [layer.g, inner.kernel]
    if inner.bias is not None:
        targets.append(inner.bias)
    if layer.initialized is not None:
        targets.append(layer.initialized)
    return targets


def _weight_norm_weights(layer, weights):
    """TensorFlow Addons' `[g, v, (bias), initialized]` in kerasnorm's order
    and parameterization."""
    if len(weights) < 3:
        raise ValueError(
            "TensorFlow Addons' `WeightNormalization` has at least 3 weights "
            f"(g, kernel, initialized). Received: {len(weights)} arrays"
        )
    g, v, *rest = weights
    initialized = rest.pop()
    rank = v.ndim
    tfa_axes = tuple(range(rank - 1))
    axes = kernel_norm_axes(rank, layer.layer)
    if axes != tfa_axes:
        v = v.astype("float64")
        v = g * v / np.sqrt(np.sum(v**2, axis=tfa_axes, keepdims=True))
        g = np.sqrt(np.sum(v**2, axis=axes)).reshape(layer.g.shape)
    moved = [g, v, *rest]
    if layer.initialized is not None:
        moved.append(np.asarray(initialized, dtype="float32"))
    return moved
