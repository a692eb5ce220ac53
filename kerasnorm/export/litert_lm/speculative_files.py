"""The four `.tflite` files of a speculative-decoding bundle, traced from
`speculative_graph` and converted (float32, builtin ops):

- the base: `prefill` / `prefill_<T>`, `decode` and `verify`, each taking
  `embeddings` `(1, T, D)`, `per_layer_embeddings` `(1, T, layers, width)`,
  `input_pos` `(T,)` and the caches `kv_cache_k_<j>` / `kv_cache_v_<j>`
  `(1, g, L, d)` (`hub_step`'s, one per layer that writes one); `decode`
  and `verify` return `logits` `(1, T, vocab)` and `activations` `(1, T,
  D)` with the caches, the prefills the caches alone. `verify` takes `T =
  draft_steps + 1` tokens: the engine reads its draft length there;
- the embedder and the per-layer embedder: token id `(1, 1)` in,
  `embeddings` `(1, 1, D)` / `per_layer_embeddings` `(1, 1, layers,
  width)` out (the engine looks each token up alone);
- the drafter, signature `mtp_drafter`: `activations` `(1, 1, 2D)` (the
  embedding of the last token and the base's activations), `input_pos`
  `(1,)` and the base's caches it reads, under the base's names; `logits`
  `(1, 1, vocab)` and `projected_activations` `(1, 1, D)` out.

No input is named `mask`: each graph makes its causal and sliding-window
masks from `input_pos`, and LiteRT-LM's engine fills a mask only where a
signature has one.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile

import tensorflow as tf

from kerasnorm.export.litert.convert import stderr_captured
from kerasnorm.export.litert_lm.speculative_graph import drafter_step
from kerasnorm.export.litert_lm.speculative_graph import embedded_step
from kerasnorm.export.litert_lm.speculative_graph import embedder
from kerasnorm.export.litert_lm.speculative_graph import per_layer_embedder
from kerasnorm.export.litert_lm.write import cache_names
from kerasnorm.export.litert_lm.write import lowered
from kerasnorm.export.litert_lm.write import signature_keys
from kerasnorm.export.litert_lm.write import variables_module
from kerasnorm.export.prepare.weights import merged_lora

VERIFY = "verify"
DRAFTER_SIGNATURE = "mtp_drafter"
EMBEDDER_SIGNATURE = "embedder"
PER_LAYER_EMBEDDER_SIGNATURE = "per_layer_embedder"


@dataclasses.dataclass
class SpeculativeFiles:
    """The flatbuffers, and the steps they were traced from."""

    base: bytes
    embedder: bytes
    per_layer_embedder: bytes
    drafter: bytes
    signatures: dict  # the base's: key -> tokens
    draft_steps: int
    drafter_caches: list  # the file caches the drafter reads, by index
    cache_shapes: list
    # The caches' length: the context, and room for a `verify` from its
    # last position (the engine verifies `draft_steps + 1` tokens there).
    cache_length: int


def _cache_specs(shapes, length, names):
    specs = []
    for i, (g, d) in enumerate(shapes):
        shape = (1, g, length, d)
        specs += [
            tf.TensorSpec(shape, tf.float32, name=names[2 * i]),
            tf.TensorSpec(shape, tf.float32, name=names[2 * i + 1]),
        ]
    return specs


def _base_function(step, tokens, length, outputs):
    layers, width = step.per_layer_shape
    names = cache_names(len(step.cache_shapes))
    specs = [
        tf.TensorSpec((1, tokens, step.hidden_dim), tf.float32, name="embeddings"),
        tf.TensorSpec(
            (1, tokens, layers, width), tf.float32, name="per_layer_embeddings"
        ),
        tf.TensorSpec((tokens,), tf.int32, name="input_pos"),
        *_cache_specs(step.cache_shapes, length, names),
    ]

    def call(embeddings, per_layer_embeddings, input_pos, *caches):
        logits, activations, caches = step.step(
            embeddings, per_layer_embeddings, input_pos, list(caches)
        )
        out = dict(zip(names, caches, strict=True))
        if outputs:
            out["logits"] = tf.cast(logits, tf.float32)
            out["activations"] = activations
        return out

    return _traced(call, specs)


def _lookup_function(embed, name):
    def call(token_ids):
        return {name: embed(token_ids)}

    return _traced(call, [tf.TensorSpec((1, 1), tf.int32, name="token_ids")])


def _drafter_function(step, shapes, length, width):
    all_names = cache_names(len(shapes))
    names, read = [], []
    for j in step.sources:
        names += all_names[2 * j : 2 * j + 2]
        read.append(shapes[j])
    specs = [
        tf.TensorSpec((1, 1, 2 * width), tf.float32, name="activations"),
        tf.TensorSpec((1,), tf.int32, name="input_pos"),
        *_cache_specs(read, length, names),
    ]

    def call(activations, input_pos, *caches):
        logits, projected = step.step(activations, input_pos, list(caches))
        return {"logits": logits, "projected_activations": projected}

    return _traced(call, specs)


def _traced(call, specs):
    with lowered():
        return tf.function(
            call, input_signature=specs, autograph=False
        ).get_concrete_function()


def _converted(functions, verbose):
    """One `.tflite` with a signature per entry of `functions`."""
    module = variables_module(functions.values())
    saved = tempfile.mkdtemp(prefix="kerasnorm-speculative-")
    try:
        with stderr_captured(not verbose):
            tf.saved_model.save(module, saved, signatures=functions)
            gc.collect()
            converter = tf.lite.TFLiteConverter.from_saved_model(
                saved, signature_keys=list(functions)
            )
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            converter.exclude_conversion_metadata = True
            return converter.convert()
    finally:
        shutil.rmtree(saved, ignore_errors=True)


def write_speculative(
    base, drafter, *, max_sequence_length, prefill_lengths, draft_steps, verbose=False
) -> SpeculativeFiles:
    """The base, its two embedders and the drafter, converted; a base's LoRA
    adapters merged into its kernels while it is traced."""
    with merged_lora(base):
        return _written(
            base, drafter, max_sequence_length, prefill_lengths, draft_steps, verbose
        )


def _written(base, drafter, max_sequence_length, prefill_lengths, draft_steps, verbose):
    step = embedded_step(base)
    length = max_sequence_length + draft_steps + 1
    keys = signature_keys(prefill_lengths)
    base_functions = {
        key: _base_function(step, t, length, outputs=key == "decode")
        for key, t in keys.items()
    }
    base_functions[VERIFY] = _base_function(step, draft_steps + 1, length, outputs=True)
    # `decode` first: the file's main graph, as `write_generative` orders it.
    base_functions = {"decode": base_functions.pop("decode"), **base_functions}
    draft = drafter_step(base, drafter, step.written)
    return SpeculativeFiles(
        base=_converted(base_functions, verbose),
        embedder=_converted(
            {EMBEDDER_SIGNATURE: _lookup_function(embedder(base), "embeddings")},
            verbose,
        ),
        per_layer_embedder=_converted(
            {
                PER_LAYER_EMBEDDER_SIGNATURE: _lookup_function(
                    per_layer_embedder(base), "per_layer_embeddings"
                )
            },
            verbose,
        ),
        drafter=_converted(
            {
                DRAFTER_SIGNATURE: _drafter_function(
                    draft, step.cache_shapes, length, step.hidden_dim
                )
            },
            verbose,
        ),
        signatures={**{k: t for k, t in keys.items()}, VERIFY: draft_steps + 1},
        draft_steps=draft_steps,
        drafter_caches=list(draft.sources),
        cache_shapes=list(step.cache_shapes),
        cache_length=length,
    )
