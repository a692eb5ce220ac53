"""Keras' quantized layers' private state kerasnorm reads (see
`kerasnorm._compat`): a layer after `model.quantize("int8")` holds its
integers and scales in private variables, and Keras offers no public
dequantization.

Checked on keras 3.15.1: `Dense` and `EinsumDense` store `_kernel` (int8,
the float kernel's shape) and `kernel_scale` (one per output channel;
`EinsumDense._adjust_scale_for_dequant` lays it out against the kernel);
`Embedding` stores `_embeddings` (int8) and `embeddings_scale` (one per
row), `ReversibleEmbedding` besides `reverse_embeddings` and
`reverse_embeddings_scale` when untied. The float kernel is the integers
over the scale.
"""

import keras
import numpy as np
from keras import ops


def _np(x):
    return np.asarray(ops.convert_to_numpy(x), np.float32)


def quantized_layers(model):
    """The layers of `model` (nested) with a Keras quantization mode."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "quantization_mode", None) is not None
    ]


def int8_integers(layer):
    """The int8 array a quantized `Dense`, `EinsumDense` or `Embedding`
    stores (its kernel, or its table)."""
    if isinstance(layer, keras.layers.Embedding):
        return np.asarray(ops.convert_to_numpy(layer._embeddings))
    return np.asarray(ops.convert_to_numpy(layer._kernel))


def dequantized_kernel(layer):
    """The float32 kernel of an int8 `Dense` or `EinsumDense`."""
    if isinstance(layer, keras.layers.EinsumDense):
        scale = _np(layer._adjust_scale_for_dequant(layer.kernel_scale))
    else:
        scale = _np(layer.kernel_scale)
    return _np(layer._kernel) / scale


def dequantized_tables(layer):
    """The float32 table of an int8 `Embedding`, and the head's kernel
    `(dim, vocab)` of a `ReversibleEmbedding` (None for an `Embedding`)."""
    table = _np(layer._embeddings) / _np(layer.embeddings_scale)[:, None]
    if not hasattr(layer, "tie_weights"):
        return table, None
    if layer.tie_weights:
        return table, table.T
    scale = _np(layer.reverse_embeddings_scale).reshape(1, -1)
    return table, _np(layer.reverse_embeddings) / scale
