"""The cached step of a functional decoder: its graph run again node by node
at `positions`, each layer that attends over earlier tokens through one
key/value cache pair (`(1, g, L, d)`, the file's layout), each layer that
reads positions at `positions`, every other call as it is.

What a node may be:

- **acts on each position alone** (run as it is): the layers of
  `_positionwise()` (Dense, EinsumDense, Embedding, norms, Add, Dropout,
  ...), and the `keras.ops` calls Keras records in a graph for operators
  and functions on its tensors (`x + y`, `x * s`, `ops.multiply`,
  activations, casts: `_ELEMENTWISE`), reductions and softmax over the
  last (feature) axis only (`_LAST_AXIS`);
- **reads positions**: keras-hub's `PositionEmbedding`,
  `TokenAndPositionEmbedding` and `RotaryEmbedding`, called with
  `positions=`; a user's layer with `cached_step(x, positions)`;
- **attends over earlier tokens**, one cache pair each: kerasnorm's
  `TransformerDecoderBlock` and any layer with `cached_step(x, key_cache,
  value_cache, positions)` (the protocol, `docs/guides/generation.md`,
  "Your own decoder"); keras-hub's `TransformerDecoder` (decoder-only)
  through its own sub-layers; Keras' `MultiHeadAttention` called on
  one sequence with `use_causal_mask=True`, its own projections around
  `kerasnorm._core.attention.cached_attention`.

Anything else is refused naming the layer (`CachePathError`).
"""

from __future__ import annotations

import dataclasses
import inspect

import keras

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.blocks import TransformerDecoderBlock
from kerasnorm.blocks import TransformerEncoderBlock
from kerasnorm.export.litert_lm.cached import CachePathError
from kerasnorm.export.litert_lm.graph_attention import attention_step
from kerasnorm.export.litert_lm.graph_attention import hub_decoder_step
from kerasnorm.export.litert_lm.graph_attention import protocol_cache_shape
from kerasnorm.norms import LayerNorm
from kerasnorm.norms import RMSNorm

# keras.ops calls (their class names in a graph) that compute each element
# from the elements at the same place: a position's output reads that
# position alone.
_ELEMENTWISE = frozenset(
    {
        # arithmetic and comparisons
        "Add", "Subtract", "Multiply", "Divide", "TrueDivide", "FloorDivide",
        "Mod", "Power", "Negative", "Absolute", "Abs", "Square", "Sqrt",
        "Rsqrt", "Exp", "Expm1", "Log", "Log1p", "Reciprocal", "Sign",
        "Maximum", "Minimum", "Clip", "Round", "Floor", "Ceil", "Erf",
        "Sin", "Cos", "Tanh", "Sinh", "Cosh", "Arctan", "Greater",
        "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual",
        "Cast", "Where",
        # activations
        "Relu", "Relu6", "ReLU", "Sigmoid", "HardSigmoid", "Silu", "Swish",
        "HardSilu", "Gelu", "Elu", "Selu", "Softplus", "Softsign", "Mish",
        "LeakyRelu", "LeakyReLU", "Celu", "Glu", "Sparsemax", "Linear",
        "Identity",
    }
)  # fmt: skip
# Reductions and normalizations: per position where their axis is the last.
_LAST_AXIS = frozenset(
    {"Softmax", "LogSoftmax", "Mean", "Sum", "Max", "Min", "Var", "Std", "Norm"}
)

PROTOCOL = (
    "a layer that attends over earlier tokens defines "
    "`cached_step(x, key_cache, value_cache, positions)` returning "
    "`(y, (key_cache, value_cache))` (caches `(batch, g, L, d)`, its cache "
    "shape `(g, d)` in a `cache_shape` attribute, or read from its "
    "`num_heads` / `key_dim` or its one MultiHeadAttention); a layer that "
    "reads positions only defines `cached_step(x, positions)`"
)


@dataclasses.dataclass
class GraphStep:
    """`step(tokens, positions, caches)` of a functional decoder and the
    `(g, d)` of each of its caches, in graph order."""

    step: object
    cache_shapes: list
    vocabulary_size: int


def _keras_hub_layers():
    try:
        import keras_hub
    except ImportError:
        return None
    return keras_hub.layers


def _positionwise():
    """Layer classes that act on each position alone: run as they are."""
    classes = [
        keras.layers.Dense,
        keras.layers.EinsumDense,
        keras.layers.Embedding,
        keras.layers.Add,
        keras.layers.Multiply,
        keras.layers.Subtract,
        keras.layers.Maximum,
        keras.layers.Minimum,
        keras.layers.Average,
        keras.layers.Activation,
        keras.layers.ReLU,
        keras.layers.Dropout,
        keras.layers.LayerNormalization,
        keras.layers.Rescaling,
        keras.layers.Identity,
        LayerNorm,
        RMSNorm,
    ]
    for name in ("RMSNormalization",):
        if hasattr(keras.layers, name):
            classes.append(getattr(keras.layers, name))
    hub = _keras_hub_layers()
    if hub is not None:
        classes.append(hub.ReversibleEmbedding)
    return tuple(classes)


def _position_layers():
    """keras-hub layers whose call takes `positions=` (the rows' positions)."""
    hub = _keras_hub_layers()
    if hub is None:
        return ()
    return (hub.PositionEmbedding, hub.TokenAndPositionEmbedding, hub.RotaryEmbedding)


def _hub_decoder():
    hub = _keras_hub_layers()
    return () if hub is None else (hub.TransformerDecoder,)


def _protocol_arity(op):
    """4 for `cached_step(x, key_cache, value_cache, positions)`, 2 for
    `cached_step(x, positions)`, else None (no such method)."""
    method = getattr(op, "cached_step", None)
    if not callable(method):
        return None
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return None
    required = [
        p
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) if len(required) in (2, 4) else None


def _refuse(op, model, why):
    raise CachePathError(
        f"to_litert_lm: layer {op.name!r} ({type(op).__name__}) of {model.name!r} {why}"
    )


def _kind(node, model):
    """What the node is to the cached step: "cache" (one cache pair),
    "positions", "mha", "hub_decoder" or "as_is"; refused otherwise."""
    op = node.operation
    arity = _protocol_arity(op)
    if isinstance(op, TransformerDecoderBlock) or arity == 4:
        return "cache"
    if arity == 2:
        return "positions"
    if isinstance(op, _hub_decoder()):
        _check_hub_decoder(node, model)
        return "hub_decoder"
    if isinstance(op, keras.layers.MultiHeadAttention):
        _check_attention(node, model)
        return "mha"
    if isinstance(op, _position_layers()):
        return "positions"
    if isinstance(op, TransformerEncoderBlock):
        _refuse(
            op,
            model,
            "attends without a causal mask: the model is not a causal "
            "decoder. Use kerasnorm.TransformerDecoderBlock.",
        )
    if isinstance(op, _positionwise()) or _positionwise_op(node):
        return "as_is"
    if isinstance(op, keras.layers.Layer):
        _refuse(
            op,
            model,
            "has no cached path. A layer may act on each position alone "
            "(Dense, EinsumDense, Embedding, norms, Add, Activation, "
            "Dropout, keras operators and keras.ops calls per position), "
            "read positions (keras-hub PositionEmbedding, "
            "TokenAndPositionEmbedding, RotaryEmbedding) or attend causally "
            "(kerasnorm TransformerDecoderBlock, keras-hub "
            "TransformerDecoder, keras.layers.MultiHeadAttention with "
            "use_causal_mask=True). A layer of your own that mixes "
            f"positions needs the cached-step protocol: {PROTOCOL}.",
        )
    _refuse(
        op,
        model,
        "mixes positions (a keras.ops call over the time axis): the cached "
        "step runs one new token at a time. Keep such computations inside a "
        f"layer with the cached-step protocol: {PROTOCOL}.",
    )


def _positionwise_op(node):
    """Whether a `keras.ops` call in the graph acts on each position alone."""
    op = node.operation
    if isinstance(op, keras.layers.Layer) or not isinstance(op, keras.Operation):
        return False
    name = type(op).__name__
    if name in _ELEMENTWISE:
        return True
    if name not in _LAST_AXIS or not node.inputs:
        return False
    axis = getattr(op, "axis", None)
    rank = len(node.inputs[0].shape)
    axes = axis if isinstance(axis, list | tuple) else [axis]
    return axis is not None and all(a in (-1, rank - 1) for a in axes)


def _check_attention(node, model):
    op = node.operation
    kwargs = node.kwargs
    args = list(node.args) + [kwargs.get(k) for k in ("value", "key")]
    query = args[0]
    others = [a for a in args[1:] if a is not None]
    config = op.get_config()
    problems = []
    if not kwargs.get("use_causal_mask", False):
        problems.append("is called without use_causal_mask=True")
    if any(a is not query for a in others):
        problems.append("attends to another sequence than its query's")
    if any(
        kwargs.get(k) is not None
        for k in ("attention_mask", "query_mask", "value_mask", "key_mask")
    ) or kwargs.get("return_attention_scores"):
        problems.append("takes a mask or returns its scores")
    if config.get("use_gate") or config.get("sliding_window"):
        problems.append("has a gate or a sliding window")
    if (config.get("value_dim") or op.key_dim) != op.key_dim:
        problems.append("has value_dim != key_dim (one cache size per layer)")
    if problems:
        _refuse(
            op,
            model,
            " and ".join(problems)
            + ": a cached step writes causal self-attention only "
            "(`attention(x, x, use_causal_mask=True)`, value_dim == key_dim).",
        )


def _check_hub_decoder(node, model):
    op = node.operation
    given = [k for k, v in node.kwargs.items() if v is not None and "mask" in k]
    if len(node.args) > 1 or node.kwargs.get("encoder_sequence") is not None:
        given.append("encoder_sequence")
    if node.kwargs.get("use_causal_mask") is False:
        given.append("use_causal_mask=False")
    if given:
        _refuse(
            op,
            model,
            f"is called with {', '.join(sorted(given))}: a cached step writes "
            "the decoder-only, causal TransformerDecoder "
            "(`decoder(x)`) only.",
        )


def _cache_shape(op, model):
    """`(g, d)` of a protocol layer's cache."""
    shape = protocol_cache_shape(op)
    if shape is None:
        _refuse(
            op,
            model,
            "has `cached_step` but no cache shape: give it `cache_shape = (g, "
            "d)`, the key/value heads and head size of its cache.",
        )
    return shape


def _decoder_nodes(model):
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise CachePathError(
            f"to_litert_lm: {model.name!r} has {len(model.inputs)} inputs and "
            f"{len(model.outputs)} outputs; a decoder LM takes token ids "
            "(batch, time) and returns logits (batch, time, vocab): build "
            "keras.Model(tokens, logits) for export."
        )
    nodes = graph_nodes(functional_of(model))
    kinds = [_kind(node, model) for node in nodes]
    if not any(k in ("cache", "mha", "hub_decoder") for k in kinds):
        raise CachePathError(
            f"to_litert_lm: {model.name!r} has no layer that attends over "
            "earlier tokens (TransformerDecoderBlock, keras-hub "
            "TransformerDecoder, MultiHeadAttention with use_causal_mask=True "
            "or a layer with `cached_step`): nothing in it is a decoder."
        )
    return nodes, kinds


def _cache_index(nodes, kinds, model):
    """`({id(layer): i}, [(g, d) of cache i])` over the layers that attend,
    in graph order; a layer called twice is refused."""
    shapes, index = [], {}
    for node, kind in zip(nodes, kinds, strict=True):
        op = node.operation
        if kind not in ("cache", "mha", "hub_decoder"):
            continue
        if id(op) in index:
            _refuse(op, model, "is called twice; each call needs its own cache.")
        index[id(op)] = len(shapes)
        if kind == "mha":
            shapes.append((op.num_heads, op.key_dim))
        elif kind == "hub_decoder":
            width = node.inputs[0].shape[-1]
            shapes.append((op.num_heads, width // op.num_heads))
        else:
            shapes.append(_cache_shape(op, model))
    return index, shapes


def _run_node(node, kind, args, kwargs, positions, caches, index):
    """One call of the graph at `positions`, the caches updated in place."""
    op = node.operation
    if kind == "as_is":
        return op(*args, **kwargs)
    if kind == "positions":
        if _protocol_arity(op) == 2:
            return op.cached_step(args[0], positions)
        return op(args[0], positions=positions)
    i = index[id(op)]
    pair = caches[2 * i], caches[2 * i + 1]
    if kind == "mha":
        y, pair = attention_step(op, args[0], *pair, positions)
    elif kind == "hub_decoder":
        y, pair = hub_decoder_step(op, args[0], *pair, positions)
    else:
        y, pair = op.cached_step(args[0], *pair, positions)
    caches[2 * i], caches[2 * i + 1] = pair
    return y


# The kinds of call that attend over earlier tokens through a cache pair.
_ATTENDS = ("cache", "hub_decoder", "mha")


def graph_step(model) -> GraphStep:
    """The `GraphStep` of a functional decoder (refused naming the first
    layer it cannot run over a cache)."""
    nodes, kinds = _decoder_nodes(model)
    index, shapes = _cache_index(nodes, kinds, model)
    input_tensor = model.inputs[0]
    output_tensor = model.outputs[0]

    attending = [i for i, kind in enumerate(kinds) if kind in _ATTENDS]
    last_attending = attending[-1] if attending else -1

    def step(tokens, positions, caches, last=False):
        caches = list(caches)
        values = {id(input_tensor): tokens}

        def get(x):
            return values[id(x)] if isinstance(x, keras.KerasTensor) else x

        for i, (node, kind) in enumerate(zip(nodes, kinds, strict=True)):
            args = keras.tree.map_structure(get, node.args)
            kwargs = {
                k: keras.tree.map_structure(get, v)
                for k, v in node.kwargs.items()
                if k != "training"
            }
            y = _run_node(node, kind, args, kwargs, positions, caches, index)
            for tensor, value in zip(node.outputs, keras.tree.flatten(y), strict=True):
                values[id(tensor)] = value
            if last and i == last_attending:
                # Every later call acts on each position alone (or reads
                # positions): from here on, only the last row, so a
                # prefill's final norm and head cost one row.
                values = {k: v[:, -1:] for k, v in values.items()}
                positions = positions[-1:]
        return values[id(output_tensor)], caches

    return GraphStep(step, shapes, output_tensor.shape[-1])
