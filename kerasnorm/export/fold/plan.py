"""Planning a fold: for each BatchNormalization of one graph, the linear
layer it merges into (after it or before it) or the reason it stays.

The never-fold rules (docs/design.md §4): a shared BN or layer, training
mode, an activation in between, several consumers, a BN axis other than the
channel axis, a shift that zero padding or a transposed convolution's border
would not see, LoRA, quantized layers.
"""

from __future__ import annotations

import collections
import dataclasses

import keras
import numpy as np

from kerasnorm._compat import graph_nodes
from kerasnorm.export.fold.fold_math import ACTIVATIONS
from kerasnorm.export.fold.fold_math import TRANSPOSED
from kerasnorm.export.fold.fold_math import activation_name
from kerasnorm.export.fold.fold_math import core_layer
from kerasnorm.export.fold.fold_math import is_wrapped
from kerasnorm.export.fold.fold_math import scale_shift
from kerasnorm.export.fold.report import FoldedBN
from kerasnorm.export.fold.report import KeptBN

L = keras.layers


@dataclasses.dataclass
class GraphPlan:
    """What one pass does in one graph."""

    # id(layer) -> [(position, scale, shift)]: the per-channel maps folded
    # into the layer, "before" (on its input) or "after" (on its output).
    steps: dict = dataclasses.field(default_factory=dict)
    removed: set = dataclasses.field(default_factory=set)  # id(BN)
    # id(layer) -> a zero-argument factory of its stand-in (a norm without
    # the affine that folded away).
    replaced: dict = dataclasses.field(default_factory=dict)
    folded: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)
    affines: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Attempt:
    """A way to fold one BN: the layer it merges into, or why there is none."""

    layer: keras.layers.Layer | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Wiring:
    """Who produces and who consumes each tensor of one graph."""

    producers: dict  # id(tensor) -> GraphNode
    consumers: dict  # id(tensor) -> [GraphNode or None for a model output]
    calls: collections.Counter

    @classmethod
    def of(cls, nodes, outputs, calls):
        producers, consumers = {}, collections.defaultdict(list)
        for node in nodes:
            producers.update((id(y), node) for y in node.outputs)
            for x in node.inputs:
                consumers[id(x)].append(node)
        for y in outputs:
            consumers[id(y)].append(None)
        return cls(producers, consumers, calls)


def plan(graph, calls, prefix):
    """Which BNs of one graph fold into which layer, and why the others stay."""
    plan = GraphPlan()
    nodes = graph_nodes(graph)
    wiring = Wiring.of(nodes, graph.outputs, calls)
    for node in nodes:
        bn = node.operation
        if type(bn) is not L.BatchNormalization:
            continue
        reason = _bn_unfoldable(bn, node, calls)
        if reason is None:
            after = _try_after(bn, node, wiring)
            before = None if after.layer else _try_before(bn, node, wiring)
            chosen = after if after.layer else before
            if chosen.layer is not None:
                position = "after" if chosen is after else "before"
                add_step(plan, chosen.layer, position, *scale_shift(bn))
                plan.removed.add(id(bn))
                plan.folded.append(
                    FoldedBN(prefix + bn.name, prefix + chosen.layer.name, position)
                )
                continue
            reason = f"{after.reason}; {before.reason}"
        plan.kept.append(KeptBN(prefix + bn.name, reason))
    return plan


def add_step(plan, layer, position, scale, shift):
    """Plan `x * scale + shift` (per channel) folded into `layer`, "after"
    it (on its output) or "before" it (on its input)."""
    steps = plan.steps.setdefault(id(layer), [])
    # A fold before acts on the layer's input, so it goes first.
    steps.insert(len(steps) if position == "after" else 0, (position, scale, shift))


def _bn_unfoldable(bn, node, calls):
    if calls[id(bn)] > 1:
        return "the BatchNormalization layer is shared (called more than once)"
    if node.kwargs.get("training") is True:
        return "called with training=True"
    return None


def _try_after(bn, node, wiring):
    x = node.inputs[0]
    producer = wiring.producers.get(id(x))
    if producer is None:
        return _Attempt(reason="after: its input is an input of this model")
    layer = producer.operation
    where = f"after {layer.name!r}"
    if isinstance(layer, L.BatchNormalization):
        return _Attempt(reason=f"{where}: BatchNormalization")
    if isinstance(layer, ACTIVATIONS):
        return _Attempt(reason=f"{where}: activation in between")
    problem = layer_unfoldable(layer, x, bn.axis, wiring.calls)
    if problem is None and activation_name(core_layer(layer)) != "linear":
        problem = f"activation {activation_name(core_layer(layer))!r} in between"
    if problem is None and len(wiring.consumers[id(x)]) > 1:
        problem = "its output feeds several consumers"
    if problem:
        return _Attempt(reason=f"{where}: {problem}")
    return _Attempt(layer)


def _try_before(bn, node, wiring):
    y = node.outputs[0]
    users = wiring.consumers[id(y)]
    if len(users) != 1 or users[0] is None:
        return _Attempt(
            reason="before: its output feeds several consumers or is a model output"
        )
    layer = users[0].operation
    where = f"before {layer.name!r}"
    if isinstance(layer, L.BatchNormalization):
        return _Attempt(reason=f"{where}: BatchNormalization")
    problem = layer_unfoldable(layer, y, bn.axis, wiring.calls) or border_problem(
        layer, scale_shift(bn)[1]
    )
    if problem:
        return _Attempt(reason=f"{where}: {problem}")
    return _Attempt(layer)


def layer_unfoldable(layer, x, axis, calls):
    """Why a per-channel map over `axis` of `x` (the input or output of
    `layer`) does not fold into `layer`'s weights, or None."""
    core = core_layer(layer)
    if core is None:
        return f"not a foldable linear layer ({type(layer).__name__})"
    if calls[id(layer)] > 1:
        return "its weights are shared (layer called more than once)"
    if getattr(core, "lora_enabled", False):
        return "LoRA is enabled"
    if getattr(core, "quantization_mode", None):
        return f"quantized ({core.quantization_mode})"
    if axis % len(x.shape) != _channel_axis(layer, x):
        return "BN axis is not the channel axis"
    return None


def _channel_axis(layer, x):
    """The channel axis of `x`, the input or output of linear `layer`."""
    if getattr(core_layer(layer), "data_format", "channels_last") == "channels_first":
        return 2 if is_wrapped(layer) else 1
    return len(x.shape) - 1


def border_problem(layer, shift):
    """Why a per-channel `shift` of its input (a BN's, a norm's offset) does
    not fold into `layer`, if it does not."""
    if not np.any(shift):
        return None
    core = core_layer(layer)
    if isinstance(core, TRANSPOSED):
        return (
            "a transposed convolution gives border outputs fewer taps, so a "
            "non-zero BN shift does not fold"
        )
    padding = getattr(core, "padding", "valid")
    if padding != "valid":
        return (
            f"padding={padding!r} pads with zeros that BN would have shifted "
            "(exact only for 'valid' padding or a zero shift)"
        )
    return None
