"""Small keras-hub `Gemma4AssistantCausalLM` drafters paired with
`lm_models`' Gemma 4 bases (issue 60 item 3), and their training: the
drafter distilled on the base's own greedy choices, as an MTP drafter is
trained (the embedding of token `p + 1` and the base's hidden state at `p`
in, the base's greedy token at `p + 2` out)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from kerasnorm._compat.hub_cache import empty_cache
from tests.export import lm_models


def gemma4_assistant(
    base, *, seed=0, ordered=False, hidden_dim=16, num_layers=2, draft_steps=3
):
    """A keras-hub `Gemma4AssistantCausalLM` for `base` (a `GEMMA4`
    configuration): its layers' head sizes and key/value heads those of the
    base layers it reads, one sliding then one global; with `ordered`, the
    ordered-embedding head over 4 centroids (2 chosen), its token ordering a
    seeded permutation (keras-hub builds it as zeros; a preset holds one)."""
    import keras_hub

    config = base.backbone.get_config()
    if seed is not None:
        keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.Gemma4Backbone(
        vocabulary_size=config["vocabulary_size"],
        image_size=None,
        num_layers=num_layers,
        num_query_heads=config["num_query_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        hidden_dim=hidden_dim,
        intermediate_dim=2 * hidden_dim,
        head_dim=config["head_dim"],
        global_head_dim=config["global_head_dim"],
        sliding_window_size=config["sliding_window_size"],
        sliding_window_pattern=2,
        num_kv_shared_layers=num_layers,
    )
    assistant = keras_hub.models.Gemma4AssistantCausalLM(
        backbone=backbone,
        backbone_hidden_size=config["hidden_dim"],
        num_centroids=4,
        centroid_intermediate_top_k=2,
        use_ordered_embeddings=ordered,
        num_speculative_tokens=draft_steps,
    )
    if ordered:
        order = np.random.default_rng(seed).permutation(config["vocabulary_size"])
        assistant.token_ordering.assign(order.astype("float32"))
    return assistant


def _sources(base):
    found = {}
    for i, layer in enumerate(base.backbone.transformer_layers):
        if not layer.is_kv_shared_layer:
            kind = "global" if layer.attention.is_global_attention else "sliding"
            found[kind] = i
    return found


def _targets(base, token_ids):
    """The base's hidden states, cache, scaled embeddings and greedy tokens
    over `token_ids` `(B, T)` (its cached call from position 0)."""
    ids = ops.convert_to_tensor(token_ids, "int32")
    cache = empty_cache(base, token_ids.shape[1])
    cache = ops.repeat(cache, token_ids.shape[0], axis=0)
    logits, hidden, cache = base.call_with_cache(ids, cache, 0)
    width = base.backbone.hidden_dim
    embedded = base.backbone.token_embedding(ids) * ops.cast(
        ops.sqrt(width), hidden.dtype
    )
    return hidden, cache, embedded, ops.argmax(logits, axis=-1)


def train_assistant(assistant, base, token_ids, steps=200, batch=32, seed=0):
    """Distil `assistant` on `base`'s greedy tokens over `token_ids`
    `(N, T)`: the drafter at each position `p` (query `p`, keys up to `p`)
    reads the embedding of token `p + 1` and the base's hidden state at
    `p`, and learns the base's greedy token after `p + 1`; and from its
    own projection and the embedding of `p + 2`, the token after. The base runs
    once over `token_ids`; the drafter's steps are one traced function."""
    import tensorflow as tf

    sources = _sources(base)
    hidden, cache, embedded, greedy = _targets(base, token_ids)
    optimizer = keras.optimizers.Adam(1e-2)
    variables = assistant.trainable_variables
    optimizer.build(variables)

    def draft(embedded_rows, hidden_rows, cache_rows):
        return assistant.call_with_cache(
            last_token_embedding=embedded_rows,
            last_hidden_state=hidden_rows,
            target_cache=cache_rows,
            cache_update_index=0,
            target_kv_source_full_idx=sources.get("global"),
            target_kv_source_local_idx=sources.get("sliding"),
        )

    def loss_of(targets, logits):
        return ops.mean(
            keras.losses.sparse_categorical_crossentropy(
                targets, logits, from_logits=True
            )
        )

    @tf.function(autograph=False)
    def step(rows):
        e, c, g = (tf.gather(t, rows) for t in (embedded, cache, greedy))
        with tf.GradientTape() as tape:
            # The first draft from the base's hidden state, the second
            # from the drafter's projection of its own (the engine's loop).
            logits, projected = draft(e[:, 1:], tf.gather(hidden, rows)[:, :-1], c)
            second, _ = draft(e[:, 2:], projected[:, :-1], c)
            loss = loss_of(g[:, 1:], logits) + loss_of(g[:, 2:], second)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    rng = np.random.default_rng(seed)
    for _ in range(steps):
        step(tf.constant(rng.integers(0, len(token_ids), batch), tf.int32))
    return assistant


def chat_token_ids(base, count=256, seed=0):
    """The toy chat task's turns (`lm_models.chat_pairs`) in `base`'s
    preprocessor, as token ids `(count, T)`."""
    pairs = lm_models.chat_pairs(count, seed=seed)
    x, _, _ = base.preprocessor(
        {
            "prompts": [lm_models.gemma4_turns(u) for u, _ in pairs],
            "responses": [f"{r}<turn|>\n" for _, r in pairs],
        }
    )
    return np.asarray(x["token_ids"])
