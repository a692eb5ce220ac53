"""The generative `.tflite`: one signature per prefill length and `decode`.

Each signature takes `tokens` int32 `(1, T)`, `input_pos` int32 `(T,)` and
`kv_cache_k_<i>`, `kv_cache_v_<i>` `(1, g, L, d)` per layer, and returns
`logits` `(1, T, vocab)` and the caches under the same names: the names
litert-torch writes and LiteRT-LM's engine reads, in the heads-first layout
the engine reads the context length from (its dimension 2).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile

import tensorflow as tf

from kerasnorm._compat import convert_variables_to_constants
from kerasnorm._compat import matmul_as_one_product
from kerasnorm.export.litert.convert import stderr_captured
from kerasnorm.export.litert.lowering import decoder_graph

DECODE = "decode"


def cache_names(num_layers):
    names = []
    for i in range(num_layers):
        names += [f"kv_cache_k_{i}", f"kv_cache_v_{i}"]
    return names


def signature_keys(prefill_lengths):
    """`prefill` for one length, `prefill_<T>` for several, then `decode`."""
    lengths = list(prefill_lengths)
    if len(lengths) == 1:
        prefills = {"prefill": lengths[0]}
    else:
        prefills = {f"prefill_{t}": t for t in lengths}
    return {**prefills, DECODE: 1}


def _function(cached, length, max_sequence_length):
    names = cache_names(len(cached.cache_shapes))
    specs = [
        tf.TensorSpec((1, length), tf.int32, name="tokens"),
        tf.TensorSpec((length,), tf.int32, name="input_pos"),
    ]
    for i, (g, d) in enumerate(cached.cache_shapes):
        shape = (1, g, max_sequence_length, d)
        specs += [
            tf.TensorSpec(shape, tf.float32, name=names[2 * i]),
            tf.TensorSpec(shape, tf.float32, name=names[2 * i + 1]),
        ]

    @tf.function(input_signature=specs)
    def call(tokens, input_pos, *caches):
        logits, caches = cached.step(tokens, input_pos, list(caches))
        outputs = {"logits": tf.cast(logits, tf.float32)}
        outputs.update(zip(names, caches, strict=True))
        return outputs

    # The step traced in ops XNNPACK delegates (keras-hub's rotary halves
    # as a concatenation, not PACK; selections inside Softmax and keras-hub
    # layers as arithmetic; products as one FULLY_CONNECTED). The
    # selections' arithmetic is exact for finite inputs, and the dynamic
    # weight quantizer quantizes the same matmuls either way.
    with lowered():
        return call.get_concrete_function()


def lowered():
    """The lowering the steps are traced under (`litert.lowering`)."""
    stack = contextlib.ExitStack()
    stack.enter_context(matmul_as_one_product())
    stack.enter_context(decoder_graph(float_file=True))
    return stack


def _frozen_with_names(function):
    """Freezing flattens the dict of outputs (sorted keys); name them again."""
    frozen = convert_variables_to_constants(function)
    names = sorted(function.structured_outputs)

    @tf.function(input_signature=list(function.structured_input_signature[0]))
    def named(*args):
        return dict(zip(names, frozen(*args), strict=True))

    return named.get_concrete_function()


def write_generative(
    cached, *, prefill_lengths, max_sequence_length, quantize=None, verbose=False
) -> bytes:
    """The flatbuffer of `cached` (`steps.CachedModel`), builtin ops only.

    `decode` is the file's first signature, its main graph: the one an
    interpreter lists ops for (`decode_report`). The engine finds each
    signature by name."""
    keys = signature_keys(prefill_lengths)
    keys = {DECODE: keys.pop(DECODE), **keys}
    saved = tempfile.mkdtemp(prefix="kerasnorm-litert-lm-")
    try:
        with stderr_captured(not verbose):
            signatures = {
                key: _frozen_with_names(_function(cached, t, max_sequence_length))
                for key, t in keys.items()
            }
            tf.saved_model.save(
                tf.Module(),
                saved,
                signatures=signatures,
                options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
            )
            converter = tf.lite.TFLiteConverter.from_saved_model(
                saved, signature_keys=list(keys)
            )
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            if quantize in ("dynamic", "float16"):
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if quantize == "float16":
                converter.target_spec.supported_types = [tf.float16]
            return converter.convert()
    finally:
        shutil.rmtree(saved, ignore_errors=True)
