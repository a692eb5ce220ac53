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

After `model.quantize("int4")` the same layers hold int4 integers packed
two per int8 byte (`quantizers.unpack_int4`): `Dense` and `EinsumDense`
along the output of the kernel flattened to `(rows, columns)` (the reduced
axes first, `_int4_unpacked_column_size` columns), `Embedding` along the
row, an untied `ReversibleEmbedding`'s `reverse_embeddings` `(dim, vocab)`
along the dim. `_int4_block_size` None is per channel, symmetric (float =
integers over `kernel_scale`, one per column); else blocks of that many
rows (the last one short when it does not divide), asymmetric: float =
(integers - `kernel_zero`) * `kernel_scale`, both `(blocks, columns)`
(`embeddings_*`: `(vocab, blocks)`, the blocks along the row).
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
    """The float32 kernel of an int8 or int4 `Dense` or `EinsumDense`."""
    if layer.quantization_mode == "int4":
        return int4_kernel(layer).float_value().T.reshape(_kernel_shape(layer))
    if isinstance(layer, keras.layers.EinsumDense):
        scale = _np(_einsum_scale(layer))
    else:
        scale = _np(layer.kernel_scale)
    return _np(layer._kernel) / scale


def _einsum_scale(layer):
    """An int8 `EinsumDense`'s per-channel scale in its kernel's layout.
    Keras 3.15 has a method for it; before it (3.10) the layer undid its
    scale's squeeze, expand and transpose inline, in this order."""
    adjust = getattr(layer, "_adjust_scale_for_dequant", None)
    if adjust is not None:
        return adjust(layer.kernel_scale)
    scale = layer.kernel_scale
    if layer._kernel_squeeze_axes:
        scale = ops.expand_dims(scale, axis=layer._kernel_squeeze_axes)
    if layer._kernel_expand_axes:
        scale = ops.squeeze(scale, axis=layer._kernel_expand_axes)
    if layer._kernel_transpose_axes:
        order = layer._kernel_transpose_axes
        scale = ops.transpose(scale, sorted(range(len(order)), key=order.__getitem__))
    return scale


def dequantized_tables(layer):
    """The float32 table of an int8 or int4 `Embedding`, and the head's
    kernel `(dim, vocab)` of a `ReversibleEmbedding` (None for an
    `Embedding`)."""
    if layer.quantization_mode == "int4":
        table, head = int4_tables(layer)
        table = table.float_value()
        if head is None:
            return table, (table.T if hasattr(layer, "tie_weights") else None)
        return table, head.float_value().T
    table = _np(layer._embeddings) / _np(layer.embeddings_scale)[:, None]
    if not hasattr(layer, "tie_weights"):
        return table, None
    if layer.tie_weights:
        return table, table.T
    scale = _np(layer.reverse_embeddings_scale).reshape(1, -1)
    return table, _np(layer.reverse_embeddings) / scale


class Int4Weights:
    """Keras' int4 weights of one product as `(out, in)` integers: float =
    (`q` - `zero`) * `scale` per block of `block` along `in` (`scale`,
    `zero` `(out, blocks)`; `zero` None: symmetric, one block per row).
    `file_block`: the block an exporter writes it in (None until chosen)."""

    def __init__(self, name, q, scale, zero, block):
        self.name, self.q, self.scale, self.zero = name, q, scale, zero
        self.block = block
        self.file_block = None

    def expanded(self, values):
        """`(out, blocks)` values repeated over their blocks' columns."""
        return np.repeat(values, self.block, axis=1)[:, : self.q.shape[1]]

    def float_value(self, scale=None):
        """The float32 weights `(out, in)`, at `scale` (Keras' by default)."""
        scale = self.expanded(self.scale if scale is None else scale)
        q = self.q.astype(np.float32)
        if self.zero is not None:
            q = q - self.expanded(self.zero)
        return (q * scale).astype(np.float32)


def _unpack(packed, count, axis):
    from keras import quantizers

    return np.asarray(
        ops.convert_to_numpy(quantizers.unpack_int4(packed, count, axis=axis)),
        np.int8,
    )


def _kernel_shape(layer):
    if isinstance(layer, keras.layers.EinsumDense):
        return tuple(layer.original_kernel_shape)
    return (layer._orig_input_dim, layer._orig_output_dim)


def _int4(name, q, scale, zero, block):
    """`Int4Weights` of `q` `(out, in)` and Keras' scale and zero laid
    `(out, blocks)` (per channel: `(out,)`, the scale divided by)."""
    if block is None or block == -1:
        scale = (1.0 / _np(scale)).reshape(-1, 1)
        return Int4Weights(name, q, scale, None, q.shape[1])
    return Int4Weights(name, q, _np(scale), _np(zero), block)


def int4_kernel(layer):
    """`Int4Weights` of an int4 `Dense` or `EinsumDense`: its kernel
    flattened to `(rows, columns)`, transposed."""
    rows, columns = (
        (layer._int4_rows, layer._int4_unpacked_column_size)
        if isinstance(layer, keras.layers.EinsumDense)
        else (layer._orig_input_dim, layer._orig_output_dim)
    )
    q = _unpack(layer._kernel, columns, -1).reshape(rows, columns).T
    block = getattr(layer, "_int4_block_size", None)
    zero = getattr(layer, "kernel_zero", None)
    scale = layer.kernel_scale
    if block is not None and block != -1:
        scale, zero = _np(scale).T, _np(zero).T
    return _int4(layer.name, q, scale, zero, block)


def int4_tables(layer):
    """`Int4Weights` of an int4 `Embedding`'s table `(vocab, dim)` and of an
    untied `ReversibleEmbedding`'s head `(vocab, dim)` (None otherwise)."""
    dim = layer.output_dim
    block = getattr(layer, "_int4_block_size", None)
    q = _unpack(layer._embeddings, dim, -1)
    table = _int4(
        layer.name,
        q,
        layer.embeddings_scale,
        getattr(layer, "embeddings_zero", None),
        block,
    )
    if getattr(layer, "tie_weights", True):
        return table, None
    q = _unpack(layer.reverse_embeddings, dim, 0).T
    scale = layer.reverse_embeddings_scale
    zero = getattr(layer, "reverse_embeddings_zero", None)
    if block is not None and block != -1:
        scale, zero = _np(scale).T, _np(zero).T
    return table, _int4(layer.name + "/reverse", q, scale, zero, block)
