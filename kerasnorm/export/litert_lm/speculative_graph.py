"""The graphs of a speculative-decoding bundle (a Gemma 4 base with its
`Gemma4AssistantCausalLM` drafter), each written from the two models' own
layers and weights: docs/guides/generation.md, "Speculative decoding".

LiteRT-LM's engine drafts only through a base that takes embeddings: it
looks the token up in the bundle's EMBEDDER section (and PER_LAYER_EMBEDDER,
Gemma 4's per-layer token embedding) and feeds the vectors to the base's
signatures, to its `verify` signature and, concatenated with the base's
`activations`, to the drafter (`runtime/executor/llm_litert_mtp_drafter.cc`).
So:

- `embedder(base)`: token id `(1, 1)` to the embedding the base's cached
  call computes, `token_embedding(id) * sqrt(hidden_dim)`;
- `per_layer_embedder(base)`: token id to the per-layer embedding
  `(1, 1, layers, width)`, `per_layer_token_embedding(id) * sqrt(width)`;
- `embedded_step(base)`: the base's cached step (`hub_step`, the same
  per-layer caches) with those two in place of the token ids, returning
  the logits, the `activations` (the final norm's output, the hidden state
  keras-hub's `generate()` hands its assistant) and the caches;
- `drafter_step(base, drafter)`: one draft step, as keras-hub's
  `Gemma4AssistantCausalLM.call_with_cache` computes it: the embedding and
  the base's activations concatenated `(1, 1, 2 * hidden_dim)`, projected,
  through the drafter's layers, each reading the base's cache of the last
  layer of its kind that writes one (sliding or global), then the final
  norm, the head (the ordered-embedding head as a dense product masked to
  the chosen centroids' tokens), the base's logit soft cap, and the
  projection back to the base's width (`projected_activations`, the next
  step's activations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from keras import ops

from kerasnorm._compat.hub_cache import cache_ops_replaced
from kerasnorm._compat.hub_cache import call_replaced
from kerasnorm._compat.hub_cache import causal_mask_replaced
from kerasnorm.export.litert_lm.hub_step import cached_hub_model
from kerasnorm.export.litert_lm.hub_views import Pair
from kerasnorm.export.litert_lm.hub_views import causal_mask
from kerasnorm.export.litert_lm.hub_views import einsum
from kerasnorm.export.litert_lm.hub_views import repeat
from kerasnorm.export.litert_lm.hub_views import to_hub

BASE = "Gemma4CausalLM"
DRAFTER = "Gemma4AssistantCausalLM"


def pair_refusal(base, drafter):
    """Why `drafter` cannot draft for `base` in LiteRT-LM's engine, or None."""
    base_name = f"{type(base).__name__} {base.name!r}"
    drafter_name = f"{type(drafter).__name__} {drafter.name!r}"
    if type(drafter).__name__ != DRAFTER:
        return (
            f"to_litert_lm: drafter= takes a keras-hub {DRAFTER} (an MTP "
            f"drafter reading the base's activations and caches); "
            f"{drafter_name} is not one."
        )
    if type(base).__name__ != BASE:
        return (
            f"to_litert_lm: a {DRAFTER} drafts for a {BASE}, whose caches "
            f"and activations it reads; {base_name} is not one."
        )
    backbone = base.backbone
    width = int(backbone.hidden_dim)
    if int(drafter.backbone_hidden_size) != width:
        return (
            f"to_litert_lm: {drafter_name} reads activations of width "
            f"{drafter.backbone_hidden_size} (its backbone_hidden_size); "
            f"{base_name}'s are {width} wide: they are not a pair."
        )
    if drafter.backbone.vocabulary_size != backbone.vocabulary_size:
        return (
            f"to_litert_lm: {drafter_name} has {drafter.backbone.vocabulary_size} "
            f"tokens and {base_name} {backbone.vocabulary_size}: they are not "
            "a pair."
        )
    if not backbone.hidden_size_per_layer_input:
        return (
            f"to_litert_lm: {base_name} has no per-layer inputs "
            "(hidden_size_per_layer_input=0); a drafter is written for the "
            "2B/4B layout its assistant presets pair with (LiteRT-LM 0.18.1's "
            "engine library says 'Speculative decoding is not supported for "
            "model without per layer embedding')."
        )
    if drafter.use_ordered_embeddings:
        order = np.sort(ops.convert_to_numpy(drafter.token_ordering).astype("int64"))
        if not np.array_equal(order, np.arange(len(order))):
            return (
                f"to_litert_lm: {drafter_name}'s token_ordering is not an "
                "ordering of its vocabulary (keras-hub builds it as zeros; a "
                "preset's weights hold it): its ordered-embedding head would "
                "draft from token 0 alone."
            )
    return _layers_refusal(base, drafter, base_name, drafter_name)


def _layers_refusal(base, drafter, base_name, drafter_name):
    """Why a drafter layer has no base cache of its kind and size, or None."""
    backbone = base.backbone
    sources = source_layers(base)
    for i, layer in enumerate(drafter.backbone.transformer_layers):
        kind = _kind(drafter.backbone, i)
        if kind not in sources:
            return (
                f"to_litert_lm: {drafter_name}'s layer {i} is {kind} attention "
                f"and {base_name} has no {kind} layer that writes a cache for "
                "it to read."
            )
        source = backbone.transformer_layers[sources[kind]].attention
        attention = layer.attention
        theirs = (source.effective_num_kv_heads, source.head_dim)
        ours = (attention.effective_num_kv_heads, attention.head_dim)
        if theirs != ours:
            return (
                f"to_litert_lm: {drafter_name}'s layer {i} reads ({kind}) keys "
                f"of {ours[0]} heads of size {ours[1]}; {base_name}'s layer "
                f"{sources[kind]} writes {theirs[0]} of size {theirs[1]}: they "
                "are not a pair."
            )
    return None


def _kind(backbone, i):
    layer = backbone.transformer_layers[i]
    return "global" if layer.attention.is_global_attention else "sliding"


def source_layers(base):
    """`{"global": i, "sliding": j}`: the last layer of each kind that
    writes a cache (keras-hub's `generate()` hands its assistant those)."""
    backbone = base.backbone
    found = {}
    for i, layer in enumerate(backbone.transformer_layers):
        if not layer.is_kv_shared_layer:
            found[_kind(backbone, i)] = i
    return found


def _scale(width, dtype):
    return ops.cast(ops.sqrt(width), dtype)


def embedder(base):
    """Token ids `(1, T)` to the embeddings the base's cached call adds
    up, `(1, T, hidden_dim)`."""
    backbone = base.backbone

    def embed(token_ids):
        x = backbone.token_embedding(token_ids)
        return ops.cast(x * _scale(backbone.hidden_dim, x.dtype), "float32")

    return embed


def per_layer_embedder(base):
    """Token ids `(1, T)` to the per-layer embeddings `(1, T, layers,
    width)`, scaled as the cached call scales them."""
    backbone = base.backbone
    width = int(backbone.hidden_size_per_layer_input)
    layers = len(backbone.transformer_layers)

    def embed(token_ids):
        x = backbone.per_layer_token_embedding(token_ids)
        x = ops.cast(x, base.compute_dtype)
        x = x * ops.cast(float(width) ** 0.5, x.dtype)
        return ops.cast(ops.reshape(x, (1, -1, layers, width)), "float32")

    return embed


@dataclasses.dataclass
class EmbeddedStep:
    """The base's cached step from embeddings: `step(embeddings (1, T, D),
    per_layer (1, T, layers, width), positions (T,), caches)` returns
    `(logits (1, T, vocab), activations (1, T, D), caches)`; `written[j]`
    is the base layer whose cache is the file's `kv_cache_*_<j>`."""

    cache_shapes: list
    written: list
    step: Callable
    vocabulary_size: int
    hidden_dim: int
    per_layer_shape: tuple


def embedded_step(base) -> EmbeddedStep:
    """The base's cached step (`hub_step`) fed embeddings: its token and
    per-layer embedding calls return the inputs (undoing the scale its
    cached call applies next), its final norm's output is kept."""
    cached = cached_hub_model(base, fuse=False)
    backbone = base.backbone
    width = int(backbone.hidden_size_per_layer_input)
    layers = len(backbone.transformer_layers)
    written = [
        i
        for i, layer in enumerate(backbone.transformer_layers)
        if not layer.is_kv_shared_layer
    ]

    def step(embeddings, per_layer, positions, caches):
        length = embeddings.shape[1]
        dtype = base.compute_dtype
        kept = []

        def token_embedding(original, inputs, reverse=False, **kwargs):
            if reverse:
                return original(inputs, reverse=True, **kwargs)
            x = ops.cast(embeddings, dtype)
            return x / _scale(backbone.hidden_dim, dtype)

        def per_layer_embedding(original, inputs, **kwargs):
            x = ops.cast(per_layer, dtype) / ops.cast(float(width) ** 0.5, dtype)
            return ops.reshape(x, (1, length, layers * width))

        def final_norm(original, *args, **kwargs):
            out = original(*args, **kwargs)
            kept.append(out)
            return out

        tokens = ops.zeros((1, length), "int32")
        with (
            call_replaced(backbone.token_embedding, token_embedding),
            call_replaced(backbone.per_layer_token_embedding, per_layer_embedding),
            call_replaced(backbone.layer_norm, final_norm),
        ):
            logits, caches = cached.step(tokens, positions, caches)
        return logits, ops.cast(kept[-1], "float32"), caches

    return EmbeddedStep(
        cached.cache_shapes,
        written,
        step,
        cached.vocabulary_size,
        int(backbone.hidden_dim),
        (layers, width),
    )


@dataclasses.dataclass
class DrafterStep:
    """One draft step: `step(activations (1, 1, 2D), positions (1,),
    caches)` returns `(logits (1, 1, vocab), projected (1, 1, D))`;
    `caches` are the base's file caches `kv_cache_*_<j>` for `j` in
    `sources` (keys then values, in that order)."""

    sources: list
    step: Callable


def drafter_step(base, drafter, written) -> DrafterStep:
    """`drafter`'s draft step over the base's file caches (`written` the
    base layers that write them, `EmbeddedStep.written`)."""
    sources = source_layers(base)
    file_index = {layer: j for j, layer in enumerate(written)}
    reads = sorted({file_index[i] for i in sources.values()})
    backbone = drafter.backbone
    cap = base.final_logit_cap
    dtype = drafter.compute_dtype
    # Read now: the head's constant, not a variable read while traced.
    centroids = centroids_of(drafter) if drafter.use_ordered_embeddings else None

    def step(activations, positions, caches):
        pairs = {
            j: Pair(to_hub(caches[2 * n], dtype), to_hub(caches[2 * n + 1], dtype))
            for n, j in enumerate(reads)
        }
        x = ops.cast(activations, dtype)
        x = drafter.pre_projection(x)
        index = ops.cast(positions[0], "int32")
        with (
            cache_ops_replaced(repeat=repeat, einsum=einsum),
            causal_mask_replaced(causal_mask),
        ):
            for i, layer in enumerate(backbone.transformer_layers):
                shared = pairs[file_index[sources[_kind(backbone, i)]]]
                x, _ = layer(
                    x, cache=shared, cache_update_index=index, shared_kv=shared
                )
        hidden = backbone.layer_norm(x)
        logits = _head(drafter, hidden, centroids)
        if cap is not None:
            cap_ = ops.cast(cap, logits.dtype)
            logits = ops.tanh(logits / cap_) * cap_
        projected = drafter.post_projection(hidden)
        return ops.cast(logits, "float32"), ops.cast(projected, "float32")

    return DrafterStep(reads, step)


def _head(drafter, hidden, centroids):
    """The drafter's logits: the tied embedding's product; with ordered
    embeddings, kept only at the tokens of the `centroid_intermediate_top_k`
    centroids the hidden state scores highest, the others one below the
    smallest kept (keras-hub's gather-and-scatter, as one dense product
    and a mask: the same values)."""
    table = drafter.backbone.token_embedding
    logits = table(hidden, reverse=True)
    if not drafter.use_ordered_embeddings:
        return logits
    chosen = ops.top_k(
        drafter.centroids(hidden), k=drafter.centroid_intermediate_top_k
    )[1]
    kept = ops.any(
        ops.equal(ops.expand_dims(centroids, -1), ops.expand_dims(chosen, -2)),
        axis=-1,
    )
    smallest = ops.min(ops.where(kept, logits, ops.full_like(logits, float("inf"))))
    return ops.where(kept, logits, smallest - ops.cast(1.0, logits.dtype))


def centroids_of(drafter):
    """Each token's centroid under the drafter's `token_ordering` (token
    `order[c * per + k]` is centroid `c`'s), as int32 `(vocabulary,)`."""
    order = np.asarray(ops.convert_to_numpy(drafter.token_ordering)).astype("int64")
    per = len(order) // int(drafter.num_centroids)
    out = np.empty(len(order), np.int32)
    out[order] = np.repeat(np.arange(int(drafter.num_centroids), dtype=np.int32), per)
    return out
