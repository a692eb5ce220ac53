"""A decoder LM as one cached step: `(tokens, positions, caches) -> (logits,
caches)`, written from the model's own layers and weights.

`cached_model(model)` recognises the model once and returns a `CachedModel`:
the shape of each layer's key/value cache and the step. Two kinds:

- a keras-hub `CausalLM` (GPT-2, Gemma, Llama): its backbone's layers, each
  attention recomputed over one cache pair per layer
  (`kerasnorm._core.attention`), in place of `call_with_cache`, which stacks
  every layer's cache into one tensor and repeats grouped keys;
- a functional Keras model from token ids to logits: its graph is run again
  node by node, each `TransformerDecoderBlock` through its `cached_step`, a
  keras-hub `PositionEmbedding` gathered at the positions, every other layer
  as it is (they act on each position alone; `_POSITIONWISE` lists them).

The step is written in `keras.ops` and traced by the writer under
TensorFlow; the reference for it is the model's own call without a cache.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import keras
from keras import ops

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm._compat.decoder_private import attention_projections
from kerasnorm._compat.decoder_private import gemma_rope
from kerasnorm._compat.decoder_private import llama_decoder_parts
from kerasnorm._compat.decoder_private import transformer_decoder_parts
from kerasnorm._core import attention as cached
from kerasnorm.blocks import TransformerDecoderBlock
from kerasnorm.blocks import TransformerEncoderBlock
from kerasnorm.norms import LayerNorm
from kerasnorm.norms import RMSNorm


@dataclasses.dataclass
class CachedModel:
    """What the writer and the runner need of a decoder LM.

    `cache_shapes[i]` is `(g, d)` of layer `i` (the cache is `(1, g, L, d)`);
    `step(tokens (1, T), positions (T,), caches)` returns
    `(logits (1, T, vocab), caches)`, `caches` a list `[k_0, v_0, k_1, ...]`.
    """

    name: str
    cache_shapes: list[tuple[int, int]]
    step: Callable
    vocabulary_size: int
    # The longest context each query may see (sliding-window attention), or
    # None: a cache longer than that would need the window's mask.
    window: int | None = None


class CachePathError(ValueError):
    """The model has a layer a cached step cannot be written through."""


def cached_model(model) -> CachedModel:
    """The `CachedModel` of a keras-hub CausalLM or a functional decoder."""
    family = _keras_hub_family(model)
    if family is not None:
        return family(model)
    if functional_of(model) is None:
        raise CachePathError(
            f"to_litert_lm: {type(model).__name__} {model.name!r} is neither a "
            "keras-hub CausalLM nor a functional Keras model from token ids to "
            "logits; build the decoder functionally (keras.Input of int32 "
            "token ids, Embedding, TransformerDecoderBlock, norm, Dense head)."
        )
    return _functional(model)


# --- keras-hub CausalLMs ---------------------------------------------------


def _keras_hub_family(model):
    try:
        import keras_hub
    except ImportError:
        return None
    models = keras_hub.models
    if isinstance(model, models.Backbone):
        raise CachePathError(
            f"to_litert_lm: {type(model).__name__} {model.name!r} is a backbone, "
            "which returns hidden states, not next-token logits: pass its "
            f"CausalLM (e.g. keras_hub.models.{type(model).__name__[:-8]}CausalLM"
            "(backbone=...))."
        )
    if not isinstance(model, models.CausalLM):
        if isinstance(model, keras_hub.models.Task):
            raise CachePathError(
                f"to_litert_lm: {type(model).__name__} {model.name!r} is not a "
                "causal language model: only a CausalLM generates text."
            )
        return None
    for cls_name, family in (
        ("GemmaCausalLM", _gemma),
        ("LlamaCausalLM", _llama),
        ("Llama3CausalLM", _llama),
        ("MistralCausalLM", _llama),
        ("Qwen3CausalLM", _llama),
        ("GPT2CausalLM", _gpt2),
    ):
        cls = getattr(models, cls_name, None)
        if cls is not None and type(model) is cls:
            return family
    raise CachePathError(
        f"to_litert_lm: no cached step is written for {type(model).__name__} "
        f"{model.name!r} yet; supported: GPT2CausalLM, GemmaCausalLM, "
        "LlamaCausalLM, MistralCausalLM, Qwen3CausalLM, and functional "
        "models of kerasnorm "
        "TransformerDecoderBlocks."
    )


def _attend(query, key, value, caches, i, positions, scale, soft_cap=None):
    out, caches[2 * i], caches[2 * i + 1] = cached.cached_attention(
        query, key, value, caches[2 * i], caches[2 * i + 1], positions, scale, soft_cap
    )
    return out


def _llama(model):
    backbone = model.backbone
    layers = [llama_decoder_parts(layer) for layer in backbone.transformer_layers]

    def step(tokens, positions, caches):
        caches = list(caches)
        x = backbone.token_embedding(tokens)
        for i, p in enumerate(layers):
            h = p.attention_norm(x)
            q, k, v = p.query(h), p.key(h), p.value(h)
            if p.query_norm is not None:
                q, k = p.query_norm(q), p.key_norm(k)
            rotary = p.attention.rotary_embedding_layer
            q = rotary(q, positions=positions)
            k = rotary(k, positions=positions)
            x = x + p.out(_attend(q, k, v, caches, i, positions, p.scale))
            h = p.ffn_norm(x)
            gate = p.activation(p.gate(h))
            x = x + p.output(p.intermediate(h) * gate)
        x = backbone.layer_norm(x)
        return backbone.token_embedding(x, reverse=True), caches

    return CachedModel(
        type(model).__name__,
        [tuple(p.key.kernel.shape[-2:]) for p in layers],
        step,
        backbone.vocabulary_size,
        window=layers[0].window,
    )


def _gemma(model):
    backbone = model.backbone
    for layer in backbone.transformer_layers:
        if layer.use_sliding_window_attention:
            raise CachePathError(
                f"to_litert_lm: layer {layer.name!r} of {model.name!r} uses "
                "sliding-window attention, which the cached step does not "
                "write; build the backbone with use_sliding_window_attention=False."
            )

    def step(tokens, positions, caches):
        caches = list(caches)
        x = backbone.token_embedding(tokens)
        x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
        for i, layer in enumerate(backbone.transformer_layers):
            a = layer.attention
            h = layer.pre_attention_norm(x)
            q = gemma_rope(a, a.query_dense(h), positions)
            k = gemma_rope(a, a.key_dense(h), positions)
            v = a.value_dense(h)
            size = (
                a.head_dim
                if a.query_head_dim_normalize
                else (a.hidden_dim // a.num_query_heads)
            )
            y = _attend(
                q, k, v, caches, i, positions, 1 / math.sqrt(size), a.logit_soft_cap
            )
            y = a.output_dense(y)
            if layer.use_post_attention_norm:
                y = layer.post_attention_norm(y)
            x = x + y
            h = layer.pre_ffw_norm(x)
            gate = keras.activations.gelu(layer.gating_ffw(h), approximate=True)
            y = layer.ffw_linear(gate * layer.gating_ffw_2(h))
            if layer.use_post_ffw_norm:
                y = layer.post_ffw_norm(y)
            x = x + y
        x = backbone.layer_norm(x)
        return backbone.token_embedding(x, reverse=True), caches

    shape = (backbone.num_key_value_heads, backbone.head_dim)
    return CachedModel(
        type(model).__name__,
        [shape] * backbone.num_layers,
        step,
        backbone.vocabulary_size,
    )


def _gpt2(model):
    backbone = model.backbone
    layers = [transformer_decoder_parts(layer) for layer in backbone.transformer_layers]
    num_heads = backbone.num_heads
    head_dim = backbone.hidden_dim // num_heads

    def residual(x, p, norm, function):
        y = function(norm(x) if p.normalize_first else x)
        return x + y if p.normalize_first else norm(x + y)

    def step(tokens, positions, caches):
        caches = list(caches)
        table = backbone.position_embedding.position_embeddings
        x = backbone.token_embedding(tokens) + ops.take(table, positions, axis=0)[None]
        for i, p in enumerate(layers):
            query, key, value, out = attention_projections(p.attention)

            def attention(h, i=i, query=query, key=key, value=value, out=out):
                y = _attend(
                    query(h),
                    key(h),
                    value(h),
                    caches,
                    i,
                    positions,
                    1 / math.sqrt(head_dim),
                )
                return out(y)

            x = residual(x, p, p.attention_norm, attention)
            x = residual(x, p, p.ffn_norm, lambda h, p=p: p.output(p.intermediate(h)))
        x = backbone.layer_norm(x)
        return backbone.token_embedding(x, reverse=True), caches

    return CachedModel(
        type(model).__name__,
        [(num_heads, head_dim)] * len(layers),
        step,
        backbone.vocabulary_size,
    )


# --- functional decoders ---------------------------------------------------


def _positionwise():
    """Layer classes that act on each position alone: run as they are."""
    classes = [
        keras.layers.Dense,
        keras.layers.EinsumDense,
        keras.layers.Embedding,
        keras.layers.Add,
        keras.layers.Multiply,
        keras.layers.Subtract,
        keras.layers.Activation,
        keras.layers.Dropout,
        keras.layers.LayerNormalization,
        keras.layers.Rescaling,
        LayerNorm,
        RMSNorm,
    ]
    for name in ("RMSNormalization",):
        if hasattr(keras.layers, name):
            classes.append(getattr(keras.layers, name))
    try:
        import keras_hub

        classes.append(keras_hub.layers.ReversibleEmbedding)
    except ImportError:
        pass
    return tuple(classes)


def _position_embedding():
    try:
        import keras_hub
    except ImportError:
        return ()
    return (keras_hub.layers.PositionEmbedding,)


def _check_layer(op, model, allowed):
    """Refuse a layer the cached step cannot run, naming it."""
    if isinstance(op, TransformerEncoderBlock | keras.layers.MultiHeadAttention):
        raise CachePathError(
            f"to_litert_lm: layer {op.name!r} ({type(op).__name__}) of "
            f"{model.name!r} attends without a causal mask: the model is "
            "not a causal decoder. Use kerasnorm.TransformerDecoderBlock."
        )
    if not isinstance(op, allowed):
        raise CachePathError(
            f"to_litert_lm: layer {op.name!r} ({type(op).__name__}) of "
            f"{model.name!r} has no cached path: only "
            "TransformerDecoderBlock mixes positions, position embeddings "
            "are keras-hub PositionEmbedding or rotary "
            "(TransformerDecoderBlock(rope_max_wavelength=...)), and every "
            "other layer must act on each position alone (Dense, norms, "
            "Embedding, Add, Activation, Dropout)."
        )


def _decoder_blocks(model, nodes):
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise CachePathError(
            f"to_litert_lm: {model.name!r} has {len(model.inputs)} inputs and "
            f"{len(model.outputs)} outputs; a decoder LM takes token ids "
            "(batch, time) and returns logits (batch, time, vocab)."
        )
    allowed = (TransformerDecoderBlock, *_positionwise(), *_position_embedding())
    for node in nodes:
        _check_layer(node.operation, model, allowed)
    blocks = [
        n.operation for n in nodes if isinstance(n.operation, TransformerDecoderBlock)
    ]
    if not blocks:
        raise CachePathError(
            f"to_litert_lm: {model.name!r} has no TransformerDecoderBlock: "
            "nothing in it attends over earlier tokens."
        )
    return blocks


def _run_node(node, args, positions, caches, index):
    """One call of the graph at `positions`, the caches updated in place."""
    op = node.operation
    if isinstance(op, TransformerDecoderBlock):
        i = index[id(op)]
        y, (caches[2 * i], caches[2 * i + 1]) = op.cached_step(
            args[0], caches[2 * i], caches[2 * i + 1], positions
        )
        return y
    if isinstance(op, _position_embedding()):
        return ops.take(op.position_embeddings, positions, axis=0)[None]
    kwargs = {k: v for k, v in node.kwargs.items() if k != "training"}
    return op(*args, **kwargs)


def _functional(model):
    nodes = graph_nodes(functional_of(model))
    blocks = _decoder_blocks(model, nodes)
    index = {id(block): i for i, block in enumerate(blocks)}
    input_tensor = model.inputs[0]
    output_tensor = model.outputs[0]

    def step(tokens, positions, caches):
        caches = list(caches)
        values = {id(input_tensor): tokens}

        def get(x):
            return values[id(x)] if isinstance(x, keras.KerasTensor) else x

        for node in nodes:
            args = keras.tree.map_structure(get, node.args)
            y = _run_node(node, args, positions, caches, index)
            for tensor, value in zip(node.outputs, keras.tree.flatten(y), strict=True):
                values[id(tensor)] = value
        return values[id(output_tensor)], caches

    shapes = [(b.num_heads, b.key_dim) for b in blocks]
    return CachedModel(model.name, shapes, step, output_tensor.shape[-1])
