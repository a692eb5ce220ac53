"""The attention and feed-forward sub-layers the transformer blocks wrap.

Every kernel starts Xavier-normal over the projection's matrix fans (Keras'
`EinsumDense` passes the input/output axes to `VarianceScaling`), and the
kernels DeepNorm names are then multiplied by `gain`: a Xavier-normal draw
times beta is a Xavier-normal draw with gain beta.
"""

import math

import keras
from keras import ops

from kerasnorm import _compat
from kerasnorm._compat.keras_attention import attention_projections
from kerasnorm._core import attention as cached


def xavier_normal(framework=keras):
    """Xavier (Glorot) normal, untruncated: std = sqrt(2 / (fan_in + fan_out))."""
    return framework.initializers.VarianceScaling(
        scale=1.0, mode="fan_avg", distribution="untruncated_normal"
    )


def build_sublayer(owner, layer, *shapes):
    """`layer.build(*shapes)`, under `layer`'s name when `owner` is a
    `tf_keras` layer.

    `tf_keras` names a variable after the name scope it is created in, and
    only `__call__` opens a layer's scope: the weights of sub-layers built
    directly would share names, which `.h5` files key weights by. Keras 3
    gives every variable its owner's path by itself.
    """
    if owner._framework is keras:
        layer.build(*shapes)
        return
    import tensorflow as tf

    with tf.name_scope(layer.name):
        layer.build(*shapes)


def _scale(kernel, gain):
    if gain != 1.0:
        kernel.assign(ops.multiply(kernel, gain))


def _redraw_with_matrix_fans(kernels):
    """Xavier-normal draws over each attention projection's matrix fans, for
    a Keras whose `EinsumDense` does not compute them (`_compat`): the query,
    key and value kernels map `width` to `(heads, key_dim)`, the output
    kernel `(heads, key_dim)` to `width`."""
    for i, kernel in enumerate(kernels):
        a, b, c = kernel.shape
        fan_in, fan_out = (a, b * c) if i < 3 else (a * b, c)
        draw = keras.initializers.RandomNormal(stddev=(2 / (fan_in + fan_out)) ** 0.5)
        kernel.assign(draw((a, b, c), dtype=kernel.dtype))


class AttentionSublayerMixin:
    """Multi-head attention of `inputs` over `context` (itself if None),
    causal if `causal`.

    The query and key projections keep gain 1; the value and output
    projections are scaled by `value_gain` (DeepNorm's beta). With
    `rope_max_wavelength`, queries and keys are rotated by their positions
    (rotary embedding) and the attention is computed from the layer's own
    projections; `cached_call` attends over a key/value cache
    (`kerasnorm._core.attention`).
    """

    # The Keras generation the layer is built on (`kerasnorm.blocks._base`).
    _framework = keras

    def __init__(
        self,
        num_heads,
        key_dim,
        dropout=0.0,
        value_gain=1.0,
        causal=False,
        rope_max_wavelength=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.rope_max_wavelength = (
            None if rope_max_wavelength is None else float(rope_max_wavelength)
        )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.value_gain = float(value_gain)
        self.causal = bool(causal)
        self.attention = self._framework.layers.MultiHeadAttention(
            num_heads=num_heads,
            key_dim=key_dim,
            dropout=dropout,
            kernel_initializer=xavier_normal(self._framework),
            dtype=self.dtype_policy,
            name="multi_head_attention",
        )
        self.supports_masking = True

    def build(self, inputs_shape, context_shape=None):
        self._build_attention(
            inputs_shape, inputs_shape if context_shape is None else context_shape
        )
        # The four projection kernels are the rank-3 weights, in the order
        # query, key, value, output (the biases have rank 2 or 1).
        kernels = [w for w in self.attention.weights if len(w.shape) == 3]
        if self._framework is keras and not _compat.einsum_dense_uses_matrix_fans():
            _redraw_with_matrix_fans(kernels)
        for kernel in kernels[2:]:
            _scale(kernel, self.value_gain)

    def _build_attention(self, inputs_shape, context_shape):
        self.attention.build(inputs_shape, context_shape)

    def call(self, inputs, context=None, attention_mask=None):
        if self.rope_max_wavelength is not None and context is None:
            return self._rotary_call(inputs, attention_mask)
        return self.attention(
            inputs,
            inputs if context is None else context,
            attention_mask=attention_mask,
            use_causal_mask=self.causal,
        )

    def _project(self, inputs, positions):
        query, key, value, _ = attention_projections(self.attention)
        q, k, v = query(inputs), key(inputs), value(inputs)
        if self.rope_max_wavelength is not None:
            q = cached.rotate(q, positions, self.rope_max_wavelength)
            k = cached.rotate(k, positions, self.rope_max_wavelength)
        return q, k, v

    def _rotary_call(self, inputs, attention_mask):
        length = ops.shape(inputs)[1]
        positions = ops.arange(length, dtype="int32")
        q, k, v = self._project(inputs, positions)
        bias = ops.zeros((1, 1), "float32")
        if self.causal:
            bias = cached.causal_bias(positions, length)
        if attention_mask is not None:
            # (B, T, S) -> (B, 1, 1, T, S): the grouped scores' axes.
            hidden = 1.0 - ops.cast(attention_mask, "float32")
            bias = bias + (hidden * cached.MASKED)[:, None, None]
        k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (k, v))
        out = cached.grouped_attention(q, k, v, bias, 1.0 / math.sqrt(self.key_dim))
        return attention_projections(self.attention)[3](out)

    def cached_call(self, inputs, key_cache, value_cache, positions):
        """Self-attention of `inputs` `(batch, T, width)` at `positions`
        `(T,)` over the caches `(batch, heads, L, key_dim)`, which it
        updates: `(output, (key_cache, value_cache))`."""
        q, k, v = self._project(inputs, positions)
        out, key_cache, value_cache = cached.cached_attention(
            q, k, v, key_cache, value_cache, positions, 1.0 / math.sqrt(self.key_dim)
        )
        return attention_projections(self.attention)[3](out), (key_cache, value_cache)

    def compute_output_shape(self, inputs_shape, context_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        config = {
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "dropout": self.dropout,
            "value_gain": self.value_gain,
            "causal": self.causal,
            "rope_max_wavelength": self.rope_max_wavelength,
        }
        return {**super().get_config(), **config}


class FeedForwardSublayerMixin:
    """`Dense(width)(activation(Dense(intermediate_dim)(x)))`.

    Both kernels are scaled by `gain` (DeepNorm's beta).
    """

    _framework = keras

    def __init__(self, intermediate_dim, activation="gelu", gain=1.0, **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        fw = self._framework
        self.activation = fw.activations.get(activation)
        self.gain = float(gain)
        self.intermediate = fw.layers.Dense(
            intermediate_dim,
            activation=self.activation,
            kernel_initializer=xavier_normal(fw),
            dtype=self.dtype_policy,
            name="intermediate",
        )
        self.supports_masking = True

    def build(self, inputs_shape):
        build_sublayer(self, self.intermediate, inputs_shape)
        self.output_dense = self._framework.layers.Dense(
            inputs_shape[-1],
            kernel_initializer=xavier_normal(self._framework),
            dtype=self.dtype_policy,
            name="output",
        )
        build_sublayer(
            self, self.output_dense, (*inputs_shape[:-1], self.intermediate_dim)
        )
        _scale(self.intermediate.kernel, self.gain)
        _scale(self.output_dense.kernel, self.gain)

    def call(self, inputs):
        return self.output_dense(self.intermediate(inputs))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = {
            "intermediate_dim": self.intermediate_dim,
            "activation": self._framework.activations.serialize(self.activation),
            "gain": self.gain,
        }
        return {**super().get_config(), **config}


@keras.saving.register_keras_serializable(package="kerasnorm")
class AttentionSublayer(AttentionSublayerMixin, keras.layers.Layer):
    __doc__ = AttentionSublayerMixin.__doc__


@keras.saving.register_keras_serializable(package="kerasnorm")
class FeedForwardSublayer(FeedForwardSublayerMixin, keras.layers.Layer):
    __doc__ = FeedForwardSublayerMixin.__doc__
