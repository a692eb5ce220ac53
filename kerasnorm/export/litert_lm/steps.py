"""A decoder LM as one cached step: `(tokens, positions, caches) -> (logits,
caches)`, written from the model's own layers and weights.

`cached_model(model)` recognises the model once and returns a `CachedModel`:
the shape of each layer's key/value cache and the step. Two kinds:

- a keras-hub `CausalLM`, any text family: its own `call_with_cache`, each
  layer handed its own pair of the file's caches (`hub_step`). Llama
  (Llama3, Mistral, Qwen3), Gemma and GPT-2 keep a step written here from
  their layers (the family row's `step`), over the heads-first cache with no
  transposes or repeated keys (the generic step takes 16-31 % longer per
  decode step, `export/bench_hub_step.py`), where its conditions hold;
- a functional Keras model from token ids to logits: its graph is run again
  node by node (`graph_step`), each layer that attends over earlier tokens
  through one cache pair, each that reads positions at the positions,
  every other call as it is.

The step is written in `keras.ops` and traced by the writer under
TensorFlow; the reference for it is the model's own call without a cache.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from kerasnorm._compat import functional_of
from kerasnorm._compat.decoder_private import attention_projections
from kerasnorm._compat.decoder_private import gemma_rope
from kerasnorm._compat.decoder_private import llama_decoder_parts
from kerasnorm._compat.decoder_private import transformer_decoder_parts
from kerasnorm._core import attention as cached
from kerasnorm.export.litert_lm.cached import CachedModel
from kerasnorm.export.litert_lm.cached import CachePathError
from kerasnorm.export.litert_lm.families import family_of
from kerasnorm.export.litert_lm.graph_step import graph_step
from kerasnorm.export.litert_lm.hub_step import cached_hub_model


def cached_model(model, max_sequence_length=None) -> CachedModel:
    """The `CachedModel` of a keras-hub CausalLM or a functional decoder,
    for caches of `max_sequence_length` positions (None: any)."""
    family = _keras_hub_family(model)
    if family is not None:
        row = family_of(model)
        return _handwritten(model, row, max_sequence_length) or _hub(model, row)
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
    return _hub


def _hub(model, row):
    return cached_hub_model(model, row)


def _handwritten(model, row, max_sequence_length):
    """The hand-written step of `model`'s class (its family `row`'s `step`,
    where the row is the class's own, not a subclass's, which may
    change its call), or None where it has none or its sliding window would
    need a mask it does not write."""
    if row.name != type(model).__name__ or row.step is None:
        return None
    family = _STEPS[row.step]
    if family is _gemma and any(
        layer.use_sliding_window_attention
        for layer in model.backbone.transformer_layers
    ):
        return None
    cached = family(model)
    if cached.window is not None and (
        max_sequence_length is None or max_sequence_length > cached.window
    ):
        return None
    return cached


def _rows(x, last):
    """`x` `(1, T, h)`, or its last row `(1, 1, h)` when `last`: what the
    final norm and the head see (both act on each position alone)."""
    return x[:, -1:] if last else x


def _attend(query, key, value, caches, i, positions, scale, soft_cap=None):
    out, caches[2 * i], caches[2 * i + 1] = cached.cached_attention(
        query, key, value, caches[2 * i], caches[2 * i + 1], positions, scale, soft_cap
    )
    return out


def _llama(model):
    backbone = model.backbone
    layers = [llama_decoder_parts(layer) for layer in backbone.transformer_layers]

    def step(tokens, positions, caches, last=False):
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
        x = backbone.layer_norm(_rows(x, last))
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

    def step(tokens, positions, caches, last=False):
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
        x = backbone.layer_norm(_rows(x, last))
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

    def step(tokens, positions, caches, last=False):
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
        x = backbone.layer_norm(_rows(x, last))
        return backbone.token_embedding(x, reverse=True), caches

    return CachedModel(
        type(model).__name__,
        [(num_heads, head_dim)] * len(layers),
        step,
        backbone.vocabulary_size,
    )


# The steps written here, by the name a family row's `step` gives
# (`families`): faster than the generic step's (export/bench_hub_step.py).
_STEPS = {"llama": _llama, "gemma": _gemma, "gpt2": _gpt2}


# --- functional decoders ---------------------------------------------------


def _functional(model):
    """A functional decoder's step (`graph_step`)."""
    found = graph_step(model)
    return CachedModel(
        model.name, found.cache_shapes, found.step, found.vocabulary_size
    )
