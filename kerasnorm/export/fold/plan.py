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

    steps: dict = dataclasses.field(default_factory=dict)  # id(layer) -> steps
    removed: set = dataclasses.field(default_factory=set)  # id(BN)
    folded: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Attempt:
    """A way to fold one BN: the layer it merges into, or why there is none."""

    layer: keras.layers.Layer | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class _Wiring:
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
    wiring = _Wiring.of(nodes, graph.outputs, calls)
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
                steps = plan.steps.setdefault(id(chosen.layer), [])
                # BN-before acts on the layer's input, so it goes first.
                steps.insert(len(steps) if position == "after" else 0, (position, bn))
                plan.removed.add(id(bn))
                plan.folded.append(
                    FoldedBN(prefix + bn.name, prefix + chosen.layer.name, position)
                )
                continue
            reason = f"{after.reason}; {before.reason}"
        plan.kept.append(KeptBN(prefix + bn.name, reason))
    return plan


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
    problem = _layer_unfoldable(layer, x, bn, wiring.calls)
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
    problem = _layer_unfoldable(layer, y, bn, wiring.calls) or border_problem(layer, bn)
    if problem:
        return _Attempt(reason=f"{where}: {problem}")
    return _Attempt(layer)


def _layer_unfoldable(layer, x, bn, calls):
    core = core_layer(layer)
    if core is None:
        return f"not a foldable linear layer ({type(layer).__name__})"
    if calls[id(layer)] > 1:
        return "its weights are shared (layer called more than once)"
    if getattr(core, "lora_enabled", False):
        return "LoRA is enabled"
    if getattr(core, "quantization_mode", None):
        return f"quantized ({core.quantization_mode})"
    if bn.axis % len(x.shape) != _channel_axis(layer, x):
        return "BN axis is not the channel axis"
    return None


def _channel_axis(layer, x):
    """The channel axis of `x`, the input or output of linear `layer`."""
    if getattr(core_layer(layer), "data_format", "channels_last") == "channels_first":
        return 2 if is_wrapped(layer) else 1
    return len(x.shape) - 1


def border_problem(layer, bn):
    """Why a BN shift does not fold into `layer`'s input, if it does not."""
    if not np.any(scale_shift(bn)[1]):
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
