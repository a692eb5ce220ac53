"""The generative `.tflite`: one signature per prefill length and `decode`.

Each signature takes `tokens` int32 `(1, T)`, `input_pos` int32 `(T,)` and
`kv_cache_k_<i>`, `kv_cache_v_<i>` `(1, g, L, d)` per layer, and returns
`logits` and the caches under the same names: the names litert-torch writes
and LiteRT-LM's engine reads, in the heads-first layout the engine reads the
context length from (its dimension 2). `decode`'s logits are `(1, 1,
vocab)`; a prefill's are its last row's `(1, 1, vocab)` by default
(`prefill_logits="last"`: the head multiplies one row, not T; the engine
reads logits from `decode` only), every row's `(1, T, vocab)`
(`prefill_logits="all"`, for scoring) or none (`prefill_logits="none"`:
the caches only, as litert-torch writes; the converter then drops the last
layer's attention output and feed-forward, the final norm and the head).

How the file is written, in bounded memory (issue 50: an export's peak at
most 4x its model's float32 weights, a 1B model on a 24 GB machine):

1. The signatures are traced over one `tf.Module` holding the variables
   the steps read (`_module`), each once, and saved as a SavedModel; the
   large float32 variables (`weight_inputs.INPUT_WEIGHT_BYTES`, 1 MiB, and
   over: the embedding table and every kernel) are traced as inputs of
   every signature instead (`weight_inputs`), so the SavedModel and the
   converter hold only the small ones (norm gains): LiteRT's converter
   reads every weight it is given into constants of its own and writes
   them out again, ~3x the weights above its start.
2. `TFLiteConverter.from_saved_model` converts it (the converter's log
   hidden unless `verbose`).
3. `weights.placement.place_weights` writes the variables into the converted
   graph as constants: the `RESHAPE`s and `TRANSPOSE`s the converter put
   between an input and its reader applied in NumPy, each product on a
   weight input (`BATCH_MATMUL`) written as the `FULLY_CONNECTED` of its
   constant. A graph that reads a weight input any other way is converted
   again with every weight in the converter (step 1 without inputs), as
   in `"float16"` (the converter's own pass) and for a model Keras
   quantized (whose integers are found by their float values).
4. `weights.quantize` quantizes the weights in the flatbuffer for the
   quantized modes other than `"float16"`, and stores identical buffers
   once. Past `BUFFER_OFFSET_BYTES` of weights the file's buffers lie
   after the flatbuffer, found by offset (`weights.buffers`), and the
   placed weights are read from the variables where the pass reads them:
   the float32 weights are never all copied at once.

Measured on a 1B Llama shape (4.6 GiB of float32 weights, `"dynamic"`):
the export peaked at 2.2x its weights, the model and TensorFlow's 5.6 GiB
included (docs/benchmarks.md, "Export memory").
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import shutil
import sys
import tempfile

import tensorflow as tf

from kerasnorm._compat import matmul_as_one_product
from kerasnorm._compat import write_buffers_after_flatbuffer
from kerasnorm.export.litert.convert import stderr_captured
from kerasnorm.export.litert.lowering import decoder_graph
from kerasnorm.export.litert_lm.fused_products import fused_calls
from kerasnorm.export.litert_lm.fused_products import fused_weights
from kerasnorm.export.litert_lm.weight_inputs import input_specs
from kerasnorm.export.litert_lm.weight_inputs import large_variables
from kerasnorm.export.litert_lm.weight_inputs import placed_bytes
from kerasnorm.export.litert_lm.weight_inputs import read_from
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.weights.buffers import read_model
from kerasnorm.export.weights.placement import Unplaced
from kerasnorm.export.weights.placement import place_weights
from kerasnorm.export.weights.quantize import quantize_model
from kerasnorm.export.weights.quantize import quantize_weights
from kerasnorm.export.weights.quantize import weights_schema

DECODE = "decode"
# Variables of at least this many bytes go after the flatbuffer, found by
# offset (`write_buffers_after_flatbuffer`): a flatbuffer holds at most
# 2 GB, and the converter then makes no Python copies of the weights (its
# de-duplication round trip costs them three times over;
# `weights.buffers` reads and writes such files for the weights pass).
BUFFER_OFFSET_BYTES = 2**28
PREFILL_LOGITS = ("last", "all", "none")


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


def _function(
    cached, length, max_sequence_length, last=False, logits=True, weights=(), lora=None
):
    """The signature of `length` tokens; `weights` (Keras variables) are
    read from inputs of their own (`weight_inputs`), after the caches;
    `lora` (`runtime_lora.RuntimeLora`): the engine's adapter inputs, last."""
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

    count = len(specs) - 2
    specs += input_specs(weights)
    adapters = [] if lora is None else lora.input_specs()
    specs += adapters
    given = count + len(weights)
    takes_last = "last" in inspect.signature(cached.step).parameters
    with_logits = logits

    def call(tokens, input_pos, *inputs):
        caches = list(inputs[:count])
        fed = contextlib.nullcontext() if lora is None else lora.fed(inputs[given:])
        # The fused products' calls inside the adapters' (`fused_products`).
        fused = fused_calls(getattr(cached, "fused", ()))
        with read_from(weights, inputs[count:given]), fused, fed:
            if takes_last:
                logits, caches = cached.step(tokens, input_pos, caches, last=last)
            else:
                # A step without the option: the head runs on every row.
                logits, caches = cached.step(tokens, input_pos, caches)
                logits = logits[:, -1:] if last else logits
        outputs = {"logits": tf.cast(logits, tf.float32)} if with_logits else {}
        outputs.update(zip(names, caches, strict=True))
        return outputs

    # The step traced in ops XNNPACK delegates (keras-hub's rotary halves
    # as a concatenation, not PACK; selections inside Softmax and keras-hub
    # layers as arithmetic; products as one FULLY_CONNECTED). The
    # selections' arithmetic is exact for finite inputs, and the dynamic
    # weight quantizer quantizes the same matmuls either way.
    with lowered():
        return _traced(call, specs)


def _traced(call, specs):
    """`call`'s concrete function, traced without autograph: keras-hub's
    cached calls and the steps branch on Python values only, and autograph's
    rewrite of every function they reach was a fifth of an export's time. A
    step that branches on a tensor (a user's decoder written for
    `tf.function`) is traced again with it."""
    try:
        traced = tf.function(call, input_signature=specs, autograph=False)
        return traced.get_concrete_function()
    except tf.errors.OperatorNotAllowedInGraphError:
        return tf.function(call, input_signature=specs).get_concrete_function()


def lowered():
    """The lowering the steps are traced under (`litert.lowering`)."""
    stack = contextlib.ExitStack()
    stack.enter_context(matmul_as_one_product())
    stack.enter_context(decoder_graph(float_file=True))
    return stack


def variables_module(functions):
    """A `tf.Module` holding the variables the traced `functions` read,
    each once (every signature shares them): saved with it, the weights are
    written to the SavedModel once, and the converter freezes them once,
    one buffer each in the file, however many signatures read them.
    Freezing each signature first (`convert_variables_to_constants`) would
    copy every weight per signature, in memory and in the SavedModel."""
    module = tf.Module()
    seen, weights = set(), []
    for function in functions:
        for variable in function.variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                weights.append(variable)
    module.weights = weights
    return module


def _bytes(variables):
    return sum(v.dtype.size * v.shape.num_elements() for v in variables)


def _save(cached, keys, max_sequence_length, directory, prefill_logits, weights, lora):
    """The signatures traced over the model's variables (`weights` read
    from inputs) and saved to `directory`, the variables once; nothing
    traced is kept. Returns the variables' bytes."""
    signatures = {
        key: _function(
            cached,
            t,
            max_sequence_length,
            last=key != DECODE and prefill_logits != "all",
            logits=key == DECODE or prefill_logits != "none",
            weights=weights,
            lora=lora,
        )
        for key, t in keys.items()
    }
    module = variables_module(signatures.values())
    tf.saved_model.save(
        module,
        directory,
        signatures=signatures,
        options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
    )
    return _bytes(module.weights)


def write_generative(
    cached,
    *,
    prefill_lengths,
    max_sequence_length,
    quantize=None,
    prefill_logits="last",
    int4_block_size=32,
    known_weights=None,
    variables=(),
    verbose=False,
    fallbacks=None,
    calibration=None,
    lora=None,
) -> bytes:
    """The flatbuffer of `cached` (`steps.CachedModel`), builtin ops only.

    `decode` is the file's first signature, its main graph: the one an
    interpreter lists ops for (`decode_report`). The engine finds each
    signature by name. `known_weights`: Keras' own int4 weights to write
    as they are (`weights.quantize_weights`). `variables`: the model's
    variables; the large ones are kept out of the converter
    (`weight_inputs`) and written into its file, except in `"float16"`
    (the converter's own pass) and for Keras-quantized weights, or where
    the converted graph reads one in a way not written so (`Unplaced`):
    then every weight goes through the converter. `fallbacks`: a list the
    weights pass appends each product to that `int4_block_size` does not
    divide, written in a smaller block or int8 (`weights.quantize`);
    `calibration`: products' inputs that GPTQ rounds their int4 on;
    `lora`: the engine's adapter inputs (`runtime_lora.RuntimeLora`)."""
    keys = signature_keys(prefill_lengths)
    keys = {DECODE: keys.pop(DECODE), **keys}
    row = GENERATIVE_MODES[quantize]
    mode = row.pass_mode
    weights = []
    if not row.converter_float16 and not known_weights:
        # Quantized: every kernel an input, none with a norm's gain folded in.
        weights = large_variables(variables, matrices=mode is not None)
        # A fused product's kernels are one input (`fused_products`).
        weights = fused_weights(weights, getattr(cached, "fused", ()))
    if weights:
        try:
            model, outside = _converted(
                cached,
                keys,
                max_sequence_length,
                quantize,
                prefill_logits,
                weights,
                verbose,
                lora,
            )
            schema, fu = weights_schema()
            # Past the flatbuffer's inline size, the weights are read from
            # the variables where the pass reads them (`weights.placement.Values`).
            outside = outside or placed_bytes(weights) >= BUFFER_OFFSET_BYTES
            place_weights(model, schema, fu, weights, lazy=outside)
            return quantize_model(
                model,
                outside,
                mode,
                int4_block_size,
                fallbacks=fallbacks,
                calibration=calibration,
            )
        except Unplaced as err:
            if verbose:
                print(
                    f"to_litert_lm: the converted graph reads a weight input "
                    f"in a way not written as a constant ({err}); converting "
                    "again with every weight in the converter (more memory).",
                    file=sys.stderr,
                    flush=True,
                )
    content = _converted(
        cached, keys, max_sequence_length, quantize, prefill_logits, [], verbose, lora
    )
    # Weights quantized in the flatbuffer (float16: the converter's); in
    # every mode, identical constants (a tied head's table) stored once.
    return quantize_weights(
        content,
        mode,
        int4_block_size,
        known_weights,
        fallbacks=fallbacks,
        calibration=calibration,
    )


def _converted(
    cached, keys, max_sequence_length, quantize, prefill_logits, weights, verbose, lora
):
    """The converter's flatbuffer of `cached`'s signatures; with `weights`
    (read from inputs), read into a `ModelT` and whether its buffers lie
    after the flatbuffer (`buffers.read_model`)."""
    saved = tempfile.mkdtemp(prefix="kerasnorm-litert-lm-")
    try:
        with stderr_captured(not verbose):
            weight_bytes = _save(
                cached, keys, max_sequence_length, saved, prefill_logits, weights, lora
            )
            # The traced graphs are gone; what they allocated is given back
            # before the converter reads the SavedModel.
            gc.collect()
            converter = tf.lite.TFLiteConverter.from_saved_model(
                saved, signature_keys=list(keys)
            )
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            # The conversion metadata costs a round trip of the whole file
            # through Python objects (a copy of every weight, twice).
            converter.exclude_conversion_metadata = True
            if weight_bytes >= BUFFER_OFFSET_BYTES:
                write_buffers_after_flatbuffer(converter)
            if GENERATIVE_MODES[quantize].converter_float16:
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
                converter.target_spec.supported_types = [tf.float16]
            content = converter.convert()
    finally:
        shutil.rmtree(saved, ignore_errors=True)
    if not weights:
        return content
    return read_model(weights_schema()[1], content)
