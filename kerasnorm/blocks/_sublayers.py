"""The attention and feed-forward sub-layers the transformer blocks wrap.

Every kernel starts Xavier-normal over the projection's matrix fans (Keras'
`EinsumDense` passes the input/output axes to `VarianceScaling`), and the
kernels DeepNorm names are then multiplied by `gain`: a Xavier-normal draw
times beta is a Xavier-normal draw with gain beta.
"""

import keras
from keras import initializers
from keras import ops


def xavier_normal():
    """Xavier (Glorot) normal, untruncated: std = sqrt(2 / (fan_in + fan_out))."""
    return initializers.VarianceScaling(
        scale=1.0, mode="fan_avg", distribution="untruncated_normal"
    )


def _scale_kernel(dense, gain):
    if gain != 1.0:
        dense.kernel.assign(ops.multiply(dense.kernel, gain))


@keras.saving.register_keras_serializable(package="kerasnorm")
class AttentionSublayer(keras.layers.Layer):
    """Multi-head attention of `inputs` over `context` (itself if None),
    causal if `causal`.

    The query and key projections keep gain 1; the value and output
    projections are scaled by `value_gain` (DeepNorm's beta).
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        dropout=0.0,
        value_gain=1.0,
        causal=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.value_gain = float(value_gain)
        self.causal = bool(causal)
        self.attention = keras.layers.MultiHeadAttention(
            num_heads=num_heads,
            key_dim=key_dim,
            dropout=dropout,
            kernel_initializer=xavier_normal(),
            dtype=self.dtype_policy,
            name="multi_head_attention",
        )
        self.supports_masking = True

    def build(self, inputs_shape, context_shape=None):
        self.attention.build(
            inputs_shape, inputs_shape if context_shape is None else context_shape
        )
        _scale_kernel(self.attention.value_dense, self.value_gain)
        _scale_kernel(self.attention.output_dense, self.value_gain)

    def call(self, inputs, context=None, attention_mask=None):
        return self.attention(
            inputs,
            inputs if context is None else context,
            attention_mask=attention_mask,
            use_causal_mask=self.causal,
        )

    def compute_output_shape(self, inputs_shape, context_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        config = {
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "dropout": self.dropout,
            "value_gain": self.value_gain,
            "causal": self.causal,
        }
        return {**super().get_config(), **config}


@keras.saving.register_keras_serializable(package="kerasnorm")
class FeedForwardSublayer(keras.layers.Layer):
    """`Dense(width)(activation(Dense(intermediate_dim)(x)))`.

    Both kernels are scaled by `gain` (DeepNorm's beta).
    """

    def __init__(self, intermediate_dim, activation="gelu", gain=1.0, **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.activation = keras.activations.get(activation)
        self.gain = float(gain)
        self.intermediate = keras.layers.Dense(
            intermediate_dim,
            activation=self.activation,
            kernel_initializer=xavier_normal(),
            dtype=self.dtype_policy,
            name="intermediate",
        )
        self.supports_masking = True

    def build(self, inputs_shape):
        self.intermediate.build(inputs_shape)
        self.output_dense = keras.layers.Dense(
            inputs_shape[-1],
            kernel_initializer=xavier_normal(),
            dtype=self.dtype_policy,
            name="output",
        )
        self.output_dense.build((*inputs_shape[:-1], self.intermediate_dim))
        _scale_kernel(self.intermediate, self.gain)
        _scale_kernel(self.output_dense, self.gain)

    def call(self, inputs):
        return self.output_dense(self.intermediate(inputs))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = {
            "intermediate_dim": self.intermediate_dim,
            "activation": keras.activations.serialize(self.activation),
            "gain": self.gain,
        }
        return {**super().get_config(), **config}
