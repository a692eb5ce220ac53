"""Planning the fold of a norm's affine into the next linear layer: for each
norm of one graph whose output reaches only linear layers, the
layers its gain (and offset) merges into (docs/design.md §4).

The norms are kerasnorm's four and Keras' `LayerNormalization`. A norm
computes `n(x) * gamma + beta` with `gamma` and `beta` per channel
(its last axis). When every path from its output ends in a linear layer
(`Dense`, a convolution: `fold_math.LINEAR`) through layers that commute
with that per-channel map, the map folds into each of those layers' input
side exactly as a BatchNorm before it does (`fold_math.fold_before`), and
the norm is replaced by a copy without `gamma` and `beta`. What commutes:

- with any per-channel affine map: dropout and noise layers (the identity
  at inference), `Identity`, `Activation("linear")`, average pooling
  (global or not);
- with one whose gain is >= 0: max pooling (global or not);
- with a gain >= 0 and no offset: the positively homogeneous activations,
  `relu(g * z) = g * relu(z)` for `g >= 0` (`ReLU` without a cap or a
  threshold, `LeakyReLU`, `PReLU`, `Activation("relu")`), the usual
  Conv -> norm -> ReLU -> Conv.

Every layer on the way must be channels-last, called once, and its output
read by nothing else (not a model output); the linear layers must pass the
BatchNorm fold's own rules (`plan.layer_unfoldable`, `plan.border_problem`
for an offset). A norm that does not qualify is left as it is: this fold is
an optimization of float32 `.tflite` files, where it removes the full-size
multiply (and add) of the affine, not a promise.
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm._compat import graph_nodes
from kerasnorm.export.fold import plan as _fold_plan
from kerasnorm.export.fold.fold_math import activation_name
from kerasnorm.export.fold.fold_math import core_layer
from kerasnorm.export.fold.report import FoldedAffine
from kerasnorm.norms.group_norm import GroupNorm
from kerasnorm.norms.instance_norm import InstanceNorm
from kerasnorm.norms.layer_norm import LayerNorm
from kerasnorm.norms.rms_norm import RMSNorm

L = keras.layers

# Exact types: a subclass may compute something else. Keras' own
# `LayerNormalization` too (not with its deprecated `rms_scaling`).
NORMS = (LayerNorm, RMSNorm, GroupNorm, InstanceNorm, L.LayerNormalization)
# Commute with any per-channel affine map (the identity at inference, or an
# average over positions).
_AFFINE = (
    L.Dropout,
    L.SpatialDropout1D,
    L.SpatialDropout2D,
    L.SpatialDropout3D,
    L.GaussianDropout,
    L.GaussianNoise,
    L.AlphaDropout,
    L.Identity,
    L.AveragePooling1D,
    L.AveragePooling2D,
    L.AveragePooling3D,
    L.GlobalAveragePooling1D,
    L.GlobalAveragePooling2D,
    L.GlobalAveragePooling3D,
)
# Commute with an affine map whose gain is >= 0.
_MAX = (
    L.MaxPooling1D,
    L.MaxPooling2D,
    L.MaxPooling3D,
    L.GlobalMaxPooling1D,
    L.GlobalMaxPooling2D,
    L.GlobalMaxPooling3D,
)
# Positively homogeneous: commute with a gain >= 0 and no offset.
_HOMOGENEOUS = (L.LeakyReLU, L.PReLU)
_HOMOGENEOUS_ACTIVATIONS = ("relu", "leaky_relu")


def plan(graph, calls, prefix):
    """The norms of one graph whose affine folds, and into which layers."""
    result = _fold_plan.GraphPlan()
    nodes = graph_nodes(graph)
    wiring = _fold_plan.Wiring.of(nodes, graph.outputs, calls)
    for node in nodes:
        norm = node.operation
        if type(norm) not in NORMS or not _foldable_norm(norm, node, calls):
            continue
        gamma, beta = (
            None if p is None else np.asarray(p.numpy(), "float64")
            for p in (norm.gamma, norm.beta)
        )
        if gamma is None and (beta is None or not np.any(beta)):
            continue  # nothing to fold
        channels = node.outputs[0].shape[-1]
        scale = np.ones(channels) if gamma is None else gamma
        shift = np.zeros(channels) if beta is None else beta
        walk = _Walk(wiring, calls, scale, shift)
        if not walk.reaches_only_linear(node.outputs[0]):
            continue
        for layer in walk.linear:
            _fold_plan.add_step(result, layer, "before", scale, shift)
        result.replaced[id(norm)] = _without_affine(norm)
        result.affines += [
            FoldedAffine(
                prefix + norm.name,
                prefix + layer.name,
                tuple(prefix + name for name in walk.through),
                offset=bool(np.any(shift)),
            )
            for layer in walk.linear
        ]
    return result


def _foldable_norm(norm, node, calls):
    """Called once, not in training mode, its parameters on its input's
    last axis only."""
    if calls[id(norm)] > 1 or node.kwargs.get("training") is True:
        return False
    shape = tuple(node.inputs[0].shape)
    if len(shape) < 2 or shape[-1] is None:
        return False
    if type(norm) is L.LayerNormalization:
        if getattr(norm, "rms_scaling", False):
            return False
        axes = norm.axis if isinstance(norm.axis, (list, tuple)) else [norm.axis]
        return sorted(axis % len(shape) for axis in axes) == [len(shape) - 1]
    return tuple(norm._param_axes(shape)) == (len(shape) - 1,)


def _without_affine(norm):
    """A factory of `norm`'s copy without `gamma` and `beta` (its config
    round-trips: one of kerasnorm's norms, or Keras' `LayerNormalization`)."""
    config = norm.get_config()
    config.update(scale=False, center=False)
    return lambda: type(norm).from_config(config)


class _Walk:
    """The paths from a norm's output to the linear layers that take its
    affine: `linear` (in the order found) and `through` (the layers on the
    way)."""

    def __init__(self, wiring, calls, scale, shift):
        self.wiring = wiring
        self.calls = calls
        self.shift = shift
        self.nonnegative = bool(np.all(scale >= 0))
        self.has_shift = bool(np.any(shift))
        self.linear = []
        self.through = []

    def reaches_only_linear(self, tensor):
        consumers = self.wiring.consumers[id(tensor)]
        return bool(consumers) and all(
            node is not None and self._takes(node, tensor) for node in consumers
        )

    def _takes(self, node, tensor):
        layer = node.operation
        if self.calls[id(layer)] > 1 or len(node.inputs) != 1:
            return False
        if core_layer(layer) is not None:
            problem = _fold_plan.layer_unfoldable(layer, tensor, -1, self.calls)
            if problem is None and self.has_shift:
                problem = _fold_plan.border_problem(layer, self.shift)
            if problem is None:
                self.linear.append(layer)
            return problem is None
        if not self._commutes(layer, node):
            return False
        self.through.append(layer.name)
        return self.reaches_only_linear(node.outputs[0])

    def _commutes(self, layer, node):
        if getattr(layer, "data_format", "channels_last") != "channels_last":
            return False
        kind = type(layer)
        if kind in _AFFINE or (
            kind is L.Activation and activation_name(layer) == "linear"
        ):
            return node.kwargs.get("training") is not True
        if kind in _MAX:
            return self.nonnegative
        if self.has_shift or not self.nonnegative:
            return False
        if kind in _HOMOGENEOUS:
            return True
        if kind is L.ReLU:
            return (
                layer.max_value is None
                and layer.threshold == 0
                and layer.negative_slope >= 0
            )
        if kind is L.Activation:
            return activation_name(layer) in _HOMOGENEOUS_ACTIVATIONS
        return False
