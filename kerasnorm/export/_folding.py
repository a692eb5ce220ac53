"""Folding inference-mode BatchNormalization into adjacent linear layers.

The math is SPEC.md §4. At inference BN is the per-channel affine map
x * s + t with s = gamma / sqrt(moving_var + eps), t = beta - moving_mean * s.

- BN after a linear layer: scale the kernel along its output-channel axis by s,
  b' = b * s + t.
- BN before a linear layer: scale the kernel along its input-channel axis by s,
  b' = b + sum over input channels and kernel positions of W * t. Exact for
  Dense and "valid" convolutions; with any other padding (and for transposed
  convolutions, whose border outputs get fewer taps) only when t == 0.

The folded model is a rebuilt copy: every layer is cloned from its config and
gets its own weights, so the original model is never touched.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
from keras.src import tree
from keras.src.layers.convolutional.base_conv import BaseConv
from keras.src.layers.convolutional.base_conv_transpose import BaseConvTranspose
from keras.src.layers.convolutional.base_depthwise_conv import BaseDepthwiseConv
from keras.src.layers.convolutional.base_separable_conv import BaseSeparableConv

_LINEAR = (
    keras.layers.Dense,
    BaseConv,
    BaseConvTranspose,
    BaseDepthwiseConv,
    BaseSeparableConv,
)
_ACTIVATIONS = (
    keras.layers.Activation,
    keras.layers.ReLU,
    keras.layers.LeakyReLU,
    keras.layers.PReLU,
    keras.layers.ELU,
    keras.layers.Softmax,
)


@dataclasses.dataclass(frozen=True)
class FoldedBN:
    """One BatchNormalization merged into a linear layer."""

    batchnorm: str
    into: str
    position: str  # "after" (BN follows the layer) or "before"


@dataclasses.dataclass(frozen=True)
class KeptBN:
    """One BatchNormalization left in place, and why."""

    batchnorm: str
    reason: str


@dataclasses.dataclass
class FoldReport:
    """What `fold_batchnorm` folded and what it left in place.

    Layer names are paths through nested models: `"outer/inner/bn"`.
    """

    folded: list[FoldedBN] = dataclasses.field(default_factory=list)
    kept: list[KeptBN] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"BatchNorm folding: {len(self.folded)} folded, {len(self.kept)} kept"]
        lines += [
            f"  folded {f.batchnorm} -> {f.into} ({f.position})" for f in self.folded
        ]
        lines += [f"  kept   {k.batchnorm}: {k.reason}" for k in self.kept]
        return "\n".join(lines)


def fold_batchnorm(
    model: keras.Model, *, return_report: bool = False
) -> keras.Model | tuple[keras.Model, FoldReport]:
    """A copy of `model` with every foldable BatchNormalization merged away.

    Works on Functional and Sequential models, nested models, several inputs
    and outputs. BNs that cannot be folded exactly (activation in between,
    several consumers, axis not the channel axis, "same" padding with a
    non-zero shift, shared layers, training mode) stay in place and are listed
    in the report with the reason.

    Args:
        model: a built Functional or Sequential Keras model. Never modified.
        return_report: also return the `FoldReport`. Defaults to `False`.

    Returns:
        The folded model, or `(folded_model, report)` with `return_report=True`.

    Example:

    >>> folded, report = fold_batchnorm(model, return_report=True)
    >>> print(report)
    """
    _check_foldable(model)
    report = FoldReport()
    current = model
    while True:
        step = FoldReport()
        current = _fold_model(current, step, prefix="")
        report.folded += step.folded
        report.kept = step.kept
        # A BN next to another BN (BN -> BN -> Dense) becomes foldable once
        # its neighbour is gone: fold again until a pass changes nothing.
        if not step.folded or not step.kept:
            break
    return (current, report) if return_report else current


def _check_foldable(model):
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"fold_batchnorm expects a keras.Model. Received: model={model!r}"
        )
    if not model.built:
        raise ValueError(
            f"Model {model.name!r} is not built: give it an Input (or call "
            "`model.build(input_shape)`) before exporting."
        )
    if _graph(model) is None:
        raise ValueError(
            "fold_batchnorm needs a Functional or Sequential model (a "
            f"subclassed model's graph is not known). Received: {model.name!r} "
            f"of type {type(model).__name__}; export it with fold=False."
        )


def _graph(model):
    """The Functional graph of a model (a Sequential's inner one), or None."""
    if isinstance(model, keras.Sequential):
        return model._functional
    if isinstance(model, keras.src.models.Functional):
        return model
    return None


def _nodes(graph):
    for depth in sorted(graph._nodes_by_depth, reverse=True):
        for node in graph._nodes_by_depth[depth]:
            if node.operation is not None and not node.is_input:
                yield node


def _call_counts(model, counts=None):
    """How many times each layer is called across the whole nested model."""
    counts = {} if counts is None else counts
    for node in _nodes(_graph(model)):
        op = node.operation
        counts[id(op)] = counts.get(id(op), 0) + 1
        if counts[id(op)] == 1 and _graph_or_none(op) is not None:
            _call_counts(op, counts)
    return counts


def _graph_or_none(op):
    return _graph(op) if isinstance(op, keras.Model) else None


def _fold_model(model, report, prefix, counts=None, cache=None):
    """One folding pass over `model`, recording into `report`."""
    counts = _call_counts(model) if counts is None else counts
    cache = {} if cache is None else cache
    graph = _graph(model)
    plans, removed, kept = _plan(graph, counts, prefix)
    report.kept += kept
    for bn, layer, position in removed:
        report.folded.append(FoldedBN(prefix + bn.name, prefix + layer.name, position))

    tensors = {}
    new_inputs = []
    for x in graph.inputs:
        new = keras.Input(batch_shape=x.shape, dtype=x.dtype, name=x.name)
        tensors[id(x)] = new
        new_inputs.append(new)
    removed_ids = {id(bn) for bn, _, _ in removed}
    loaders = []
    for node in _nodes(graph):
        op = node.operation
        args, kwargs = node.arguments.fill_in(tensors)
        if id(op) in removed_ids:
            outputs = args[0]
        else:
            new_op = cache.get(id(op))
            if new_op is None:
                new_op = _clone(op, plans.get(id(op)), report, prefix, counts, cache)
                cache[id(op)] = new_op
                loaders.append((op, new_op))
            outputs = new_op(*args, **kwargs)
        for x, y in zip(node.outputs, tree.flatten(outputs), strict=True):
            tensors[id(x)] = y
    for op, new_op in loaders:
        if isinstance(op, keras.layers.Layer) and _graph_or_none(op) is None:
            _load_weights(op, new_op, plans.get(id(op)))

    if isinstance(model, keras.Sequential):
        layers = [cache[id(layer)] for layer in model.layers if id(layer) in cache]
        x = graph.inputs[0]
        first = keras.Input(batch_shape=x.shape, dtype=x.dtype, name=x.name)
        return keras.Sequential([first, *layers], name=model.name)
    new_outputs = [tensors[id(x)] for x in graph.outputs]
    return keras.Model(
        tree.pack_sequence_as(graph._inputs_struct, new_inputs),
        tree.pack_sequence_as(graph._outputs_struct, new_outputs),
        name=model.name,
    )


def _clone(op, plan, report, prefix, counts, cache):
    if _graph_or_none(op) is not None:
        return _fold_model(op, report, f"{prefix}{op.name}/", counts, cache)
    if not isinstance(op, keras.layers.Layer):
        return op  # a stateless keras.ops operation
    config = op.get_config()
    if plan and "use_bias" in config:
        config["use_bias"] = True
    return op.__class__.from_config(config)


def _load_weights(op, new_op, plan):
    values = {w.name: np.asarray(w.numpy()) for w in op.weights}
    if plan:
        values = _apply_plan(op, values, plan)
    for w in new_op.weights:
        w.assign(values[w.name].astype(w.dtype))


# --- planning -------------------------------------------------------------


def _plan(graph, counts, prefix):
    """Which BNs to fold where: (plans per layer id, removed, kept)."""
    consumers = {}
    for node in _nodes(graph):
        for x in node.input_tensors:
            consumers.setdefault(id(x), []).append(node)
    for x in graph.outputs:
        consumers.setdefault(id(x), []).append(None)
    graph_nodes = set(map(id, _nodes(graph)))

    plans = {}
    removed = []
    kept = []
    for node in _nodes(graph):
        bn = node.operation
        if not isinstance(bn, keras.layers.BatchNormalization):
            continue
        reason = _bn_unfoldable(bn, node, counts)
        if reason is None:
            x = node.input_tensors[0]
            after = _try_after(bn, x, consumers, graph_nodes, counts)
            if isinstance(after, tuple):
                layer, step = after
                plans.setdefault(id(layer), []).append(step)
                removed.append((bn, layer, "after"))
                continue
            before = _try_before(bn, node, consumers, counts)
            if isinstance(before, tuple):
                layer, step = before
                plans.setdefault(id(layer), []).insert(0, step)
                removed.append((bn, layer, "before"))
                continue
            reason = f"{after}; {before}"
        kept.append(KeptBN(prefix + bn.name, reason))
    return plans, removed, kept


def _bn_unfoldable(bn, node, counts):
    if counts.get(id(bn), 0) > 1:
        return "the BatchNormalization layer is shared (called more than once)"
    if node.arguments.kwargs.get("training") is True:
        return "called with training=True"
    return None


def _producer(x):
    op, node_index, _ = x._keras_history
    return op, op._inbound_nodes[node_index]


def _try_after(bn, x, consumers, graph_nodes, counts):
    layer, node = _producer(x)
    where = f"after {layer.name!r}"
    if id(node) not in graph_nodes:
        return f"{where}: input comes from outside this model"
    if isinstance(layer, keras.layers.BatchNormalization):
        return f"{where}: BatchNormalization"
    if isinstance(layer, _ACTIVATIONS):
        return f"{where}: activation in between"
    if not isinstance(layer, _LINEAR):
        return f"{where}: not a foldable linear layer ({type(layer).__name__})"
    if _activation_name(layer) != "linear":
        return f"{where}: activation {_activation_name(layer)!r} in between"
    problem = _layer_unfoldable(layer, counts)
    if problem:
        return f"{where}: {problem}"
    if len(consumers.get(id(x), [])) > 1:
        return f"{where}: its output feeds several consumers"
    if _norm_axis(bn, x) != _channel_axis(layer, x):
        return f"{where}: BN axis is not the channel axis"
    return layer, ("after", bn)


def _try_before(bn, node, consumers, counts):
    y = node.outputs[0]
    users = consumers.get(id(y), [])
    if len(users) != 1 or users[0] is None:
        return "before: its output feeds several consumers or is a model output"
    layer = users[0].operation
    where = f"before {layer.name!r}"
    if isinstance(layer, keras.layers.BatchNormalization):
        return f"{where}: BatchNormalization"
    if not isinstance(layer, _LINEAR):
        return f"{where}: not a foldable linear layer ({type(layer).__name__})"
    problem = _layer_unfoldable(layer, counts)
    if problem:
        return f"{where}: {problem}"
    if _norm_axis(bn, y) != _channel_axis(layer, y):
        return f"{where}: BN axis is not the channel axis"
    shift_free = not np.any(_scale_shift(bn)[1])
    if isinstance(layer, BaseConvTranspose) and not shift_free:
        return (
            f"{where}: a transposed convolution gives border outputs fewer "
            "taps, so a non-zero BN shift does not fold"
        )
    padding = getattr(layer, "padding", "valid")
    if padding != "valid" and not shift_free:
        return (
            f"{where}: padding={padding!r} pads with zeros that BN would have "
            "shifted (exact only for 'valid' padding or a zero shift)"
        )
    return layer, ("before", bn)


def _layer_unfoldable(layer, counts):
    if counts.get(id(layer), 0) > 1:
        return "its weights are shared (layer called more than once)"
    if getattr(layer, "lora_enabled", False):
        return "LoRA is enabled"
    if getattr(layer, "quantization_mode", None):
        return f"quantized ({layer.quantization_mode})"
    return None


def _activation_name(layer):
    activation = getattr(layer, "activation", None)
    if activation is None:
        return "linear"
    return keras.activations.serialize(activation)


def _norm_axis(bn, x):
    return bn.axis % len(x.shape)


def _channel_axis(layer, x):
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        return 1
    return len(x.shape) - 1


# --- the math (SPEC.md §4) ---------------------------------------------------


def _scale_shift(bn):
    """s and t of BN's inference affine map, in float64."""
    mean = np.asarray(bn.moving_mean.numpy(), "float64")
    var = np.asarray(bn.moving_variance.numpy(), "float64")
    gamma = np.asarray(bn.gamma.numpy(), "float64") if bn.scale else 1.0
    beta = np.asarray(bn.beta.numpy(), "float64") if bn.center else 0.0
    s = gamma / np.sqrt(var + bn.epsilon) * np.ones_like(mean)
    t = beta - mean * s
    return s, t


def _apply_plan(layer, values, plan):
    values = {k: np.asarray(v, "float64") for k, v in values.items()}
    for position, bn in plan:
        s, t = _scale_shift(bn)
        if position == "after":
            _fold_after(layer, values, s, t)
        else:
            _fold_before(layer, values, s, t)
    return values


def _fold_after(layer, values, s, t):
    """y' = y * s + t: scale the output-channel axis, shift the bias."""
    bias = values.get("bias", 0.0)
    if isinstance(layer, BaseSeparableConv):
        values["pointwise_kernel"] = values["pointwise_kernel"] * s
    elif isinstance(layer, BaseDepthwiseConv):
        kernel = values["kernel"]
        values["kernel"] = kernel * s.reshape(kernel.shape[-2:])
    elif isinstance(layer, BaseConvTranspose):
        values["kernel"] = values["kernel"] * s[:, None]
    else:
        values["kernel"] = values["kernel"] * s
    values["bias"] = bias * s + t


def _fold_before(layer, values, s, t):
    """y = W(x * s + t) + b: scale the input-channel axis, bias += sum W * t."""
    bias = values.get("bias", 0.0)
    if isinstance(layer, keras.layers.Dense):
        kernel = values["kernel"]
        values["kernel"] = kernel * s[:, None]
        values["bias"] = bias + t @ kernel
    elif isinstance(layer, BaseSeparableConv):
        depthwise = values["depthwise_kernel"]
        pointwise = values["pointwise_kernel"]
        values["depthwise_kernel"] = depthwise * s[:, None]
        spatial = tuple(range(depthwise.ndim - 2))
        shifted = (depthwise * t[:, None]).sum(axis=spatial).reshape(-1)
        values["bias"] = bias + shifted @ pointwise.reshape(-1, pointwise.shape[-1])
    elif isinstance(layer, BaseDepthwiseConv):
        kernel = values["kernel"]
        values["kernel"] = kernel * s[:, None]
        spatial = tuple(range(kernel.ndim - 2))
        values["bias"] = bias + (kernel * t[:, None]).sum(axis=spatial).reshape(-1)
    elif isinstance(layer, BaseConvTranspose):
        values["kernel"] = values["kernel"] * s  # t == 0 here (see _try_before)
        values["bias"] = bias + np.zeros(values["kernel"].shape[-2])
    else:
        kernel = values["kernel"]  # (..., in / groups, out)
        cin_g, cout = kernel.shape[-2:]
        cout_g = cout // layer.groups
        # Input channel of kernel row i for output o: group(o) * cin_g + i.
        index = (np.arange(cout) // cout_g)[None, :] * cin_g + np.arange(cin_g)[:, None]
        values["kernel"] = kernel * s[index]
        spatial = tuple(range(kernel.ndim - 2))
        values["bias"] = bias + (kernel * t[index]).sum(axis=(*spatial, -2))
