"""Models quantized by Keras (`model.quantize("int8")`, `"int4"`) written
with their own integers, by `to_litert_lm` and `to_tflite` alike (each
passes the words of its refusals: `caller`, its name, and `instead`, the
float-model modes it suggests).

Keras' int8 layers compute with int8 tensors (`_kernel`, a scale per output
channel) in ops the converter cannot lower (an int8 `BatchMatMulV3`). The
cached step (or `to_tflite`'s graph) is traced with each such layer
computing in float32 from its kernel dequantized exactly
(`_kernel / kernel_scale`); the writer's
`"dynamic"` pass then quantizes each product's weights symmetric per output
channel, which recovers Keras' integers (Keras rounds each channel to its
largest magnitude over 127: the dequantized channel's largest is that
again). A product whose input the converter folds a norm's gain into
carries the gain in its weights, and is rounded afresh.

An int4 layer is traced the same way, from its exactly dequantized weights,
and written `"int4"` with Keras' integers and scales (`int4_known`: the
writer finds each product's and table's weights by their float32 content).
Keras' blocks (128 rows by default, asymmetric) hold several of the file's
(32 to 256 columns, dividing Keras' block and the input); per-channel int4
is one Keras block per row. The scales round through bfloat16, as XNNPACK
holds them; the integers are Keras'. float8 has no LiteRT weights type
XNNPACK runs, and is refused.
"""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from kerasnorm._compat import replace_method
from kerasnorm._compat import restore_method
from kerasnorm._compat.keras_quantized import dequantized_kernel
from kerasnorm._compat.keras_quantized import dequantized_tables
from kerasnorm._compat.keras_quantized import int4_kernel
from kerasnorm._compat.keras_quantized import int4_tables
from kerasnorm._compat.keras_quantized import quantized_layers
from kerasnorm.export.options.generative_modes import INT4_BLOCK_SIZES
from kerasnorm.export.weights.int_weights import file_block
from kerasnorm.export.weights.int_weights import weights_key

# Keras' quantization modes the file can hold, and the file's mode.
FILE_MODE = {"int8": "dynamic", "int4": "int4"}


def keras_quantization(model, caller, instead):
    """The file mode of a Keras-quantized `model` (None: not quantized);
    refuses modes a file cannot hold, naming the layer (and `caller`, the
    export, and `instead`, the modes it suggests for the float model)."""
    modes = set()
    for layer in quantized_layers(model):
        mode = layer.quantization_mode
        if mode not in FILE_MODE:
            raise ValueError(
                f"{caller}: layer {layer.name!r} of {model.name!r} is "
                f"quantized by Keras to {mode!r}, which the file does not "
                "hold: LiteRT's XNNPACK delegate runs no float8 weights. "
                f"Export the float model with {instead}, or "
                "quantize it with model.quantize('int8') or "
                "model.quantize('int4'). Nothing was written."
            )
        if getattr(layer, "lora_enabled", False):
            raise ValueError(
                f"{caller}: layer {layer.name!r} of {model.name!r} has "
                f"LoRA enabled on Keras {mode} weights; merge it first."
            )
        modes.add(FILE_MODE[mode])
    if len(modes) > 1:
        raise ValueError(
            f"{caller}: {model.name!r} mixes layers Keras quantized to int8 "
            "and to int4; the file holds one of them. Quantize the float "
            "model with one mode. Nothing was written."
        )
    return modes.pop() if modes else None


def int4_known(model, caller, instead):
    """Keras' int4 weights of `model`'s products and tables by
    `weights_key` of their float32 `(out, in)` values (what the traced file
    holds), each with the file block it is written in; refuses a layer no
    file block fits, by name."""
    known = {}
    for layer in quantized_layers(model):
        if layer.quantization_mode != "int4":
            continue
        if isinstance(layer, keras.layers.Embedding):
            weights = [w for w in int4_tables(layer) if w is not None]
        else:
            weights = [int4_kernel(layer)]
        for w in weights:
            columns = w.q.shape[1]
            w.file_block = file_block(w.block, columns, INT4_BLOCK_SIZES)
            if w.file_block is None:
                raise ValueError(
                    f"{caller}: layer {layer.name!r} of {model.name!r} "
                    f"holds Keras int4 blocks of {w.block} along an input of "
                    f"{columns}; LiteRT's block-wise int4 needs a block of "
                    f"{INT4_BLOCK_SIZES} dividing both. Quantize with "
                    "model.quantize('int4', config=Int4QuantizationConfig("
                    "block_size=128)) on inputs that 32 divides, or export the "
                    f"float model with {instead}. Nothing was "
                    "written."
                )
            known[weights_key(w.float_value())] = w
    return known


@contextlib.contextmanager
def float_traced(model, caller, instead):
    """Inside: each Keras-quantized layer of `model` computes in float32
    from its exactly dequantized weights; yields `int4_known(model, caller,
    instead)`."""
    known = int4_known(model, caller, instead)
    saved = []
    for layer in quantized_layers(model):
        saved.append((layer, layer.__dict__.get("quantized_call")))
        replace_method(layer, "quantized_call", _float_call(layer, caller))
    try:
        yield known
    finally:
        for layer, before in saved:
            restore_method(layer, "quantized_call", before)


def _float_call(layer, caller):
    if isinstance(layer, keras.layers.Embedding):
        return _embedding_call(layer)
    if isinstance(layer, keras.layers.EinsumDense):
        kernel = dequantized_kernel(layer)

        def einsum(inputs, training=None):
            return _finish(layer, ops.einsum(layer.equation, inputs, kernel))

        return einsum
    if isinstance(layer, keras.layers.Dense):
        kernel = dequantized_kernel(layer)

        def dense(inputs, training=None):
            return _finish(layer, ops.matmul(inputs, kernel))

        return dense
    raise ValueError(
        f"{caller}: layer {layer.name!r} ({type(layer).__name__}) is "
        "quantized by Keras and has no float path here: export the model "
        "before quantizing it, with quantize='dynamic'."
    )


def _finish(layer, x):
    if layer.bias is not None:
        x = x + layer.bias
    if layer.activation is not None:
        x = layer.activation(x)
    return x


def _embedding_call(layer):
    table, head = dequantized_tables(layer)

    def call(inputs, reverse=False, training=None):
        if not reverse:
            return ops.take(table, ops.cast(inputs, "int32"), axis=0)
        logits = ops.matmul(inputs, head)
        cap = getattr(layer, "logit_soft_cap", None)
        if cap is not None:
            logits = ops.tanh(logits / cap) * cap
        return logits

    return call
