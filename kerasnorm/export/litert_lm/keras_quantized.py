"""Models quantized by Keras (`model.quantize("int8")`) written with their
own integers.

Keras' int8 layers compute with int8 tensors (`_kernel`, a scale per output
channel) in ops the converter cannot lower (an int8 `BatchMatMulV3`). The
cached step is traced with each such layer computing in float32 from its
kernel dequantized exactly (`_kernel / kernel_scale`); the writer's
`"dynamic"` pass then quantizes each product's weights symmetric per output
channel, which recovers Keras' integers (Keras rounds each channel to its
largest magnitude over 127: the dequantized channel's largest is that
again). A product whose input the converter folds a norm's gain into
carries the gain in its weights, and is rounded afresh.
"""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from kerasnorm._compat import replace_method
from kerasnorm._compat import restore_method
from kerasnorm._compat.keras_quantized import dequantized_kernel
from kerasnorm._compat.keras_quantized import dequantized_tables
from kerasnorm._compat.keras_quantized import quantized_layers

# Keras' quantization modes the file can hold, and the file's mode.
FILE_MODE = {"int8": "dynamic"}


def keras_quantization(model):
    """The file mode of a Keras-quantized `model` (None: not quantized);
    refuses modes a file cannot hold, naming the layer."""
    modes = set()
    for layer in quantized_layers(model):
        mode = layer.quantization_mode
        if mode not in FILE_MODE:
            raise ValueError(
                f"to_litert_lm: layer {layer.name!r} of {model.name!r} is "
                f"quantized by Keras to {mode!r}, which the generative file "
                "does not hold: LiteRT's XNNPACK delegate has no float8 "
                "weights, and Keras' int4 blocks carry zero points LiteRT's "
                "block-wise int4 does not. Export the float model with "
                "quantize='int4' or 'dynamic', or quantize it with "
                "model.quantize('int8')."
            )
        if getattr(layer, "lora_enabled", False):
            raise ValueError(
                f"to_litert_lm: layer {layer.name!r} of {model.name!r} has "
                "LoRA enabled on Keras int8 weights; merge it first."
            )
        modes.add(FILE_MODE[mode])
    return modes.pop() if modes else None


@contextlib.contextmanager
def float_traced(model):
    """Inside: each Keras-quantized layer of `model` computes in float32
    from its exactly dequantized weights."""
    saved = []
    for layer in quantized_layers(model):
        saved.append((layer, layer.__dict__.get("quantized_call")))
        replace_method(layer, "quantized_call", _float_call(layer))
    try:
        yield
    finally:
        for layer, before in saved:
            restore_method(layer, "quantized_call", before)


def _float_call(layer):
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
        f"to_litert_lm: layer {layer.name!r} ({type(layer).__name__}) is "
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
