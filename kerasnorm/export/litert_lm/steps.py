"""A decoder LM as one cached step: `(tokens, positions, caches) -> (logits,
caches)`, written from the model's own layers and weights.

`cached_model(model)` recognises the model once and returns a `CachedModel`:
the shape of each layer's key/value cache and the step. Two kinds:

- a keras-hub `CausalLM`, any text family: its own `call_with_cache`, each
  layer handed its own pair of the file's caches (`hub_step`);
- a functional Keras model from token ids to logits: its graph is run again
  node by node (`graph_step`), each layer that attends over earlier tokens
  through one cache pair, each that reads positions at the positions,
  every other call as it is.

The step is written in `keras.ops` and traced by the writer under
TensorFlow; the reference for it is the model's own call without a cache.
"""

from __future__ import annotations

from kerasnorm._compat import functional_of
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
        return _hub(model, family_of(model))
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


# --- functional decoders ---------------------------------------------------


def _functional(model):
    """A functional decoder's step (`graph_step`)."""
    found = graph_step(model)
    return CachedModel(
        model.name, found.cache_shapes, found.step, found.vocabulary_size
    )
