import keras

from kerasnorm._compat import keras_mask
from kerasnorm.blocks._base import TransformerBlockBase
from kerasnorm.blocks._base import TransformerBlockMixin
from kerasnorm.blocks._base import merge_masks
from kerasnorm.blocks._sublayers import build_sublayer


class TransformerEncoderBlockMixin(TransformerBlockMixin):
    """`TransformerEncoderBlock`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.blocks._base` says why)."""

    role = "encoder"
    other_stack = "decoder_layers"

    def __init__(
        self,
        num_heads,
        key_dim,
        intermediate_dim,
        norm_position="pre",
        norm_type="layer",
        num_layers=1,
        dropout=0.0,
        activation="gelu",
        norm_epsilon=1e-5,
        decoder_layers=None,
        **kwargs,
    ):
        super().__init__(
            num_heads,
            key_dim,
            intermediate_dim,
            norm_position=norm_position,
            norm_type=norm_type,
            num_layers=num_layers,
            dropout=dropout,
            activation=activation,
            norm_epsilon=norm_epsilon,
            other_layers=decoder_layers,
            **kwargs,
        )

    def build(self, inputs_shape):
        build_sublayer(self, self.self_attention, inputs_shape)
        build_sublayer(self, self.feed_forward, inputs_shape)

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None):
        if padding_mask is None:
            padding_mask = keras_mask(inputs)
        x = self.self_attention(
            inputs,
            attention_mask=merge_masks(padding_mask, attention_mask),
            training=training,
        )
        return self.feed_forward(x, training=training)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)


@keras.saving.register_keras_serializable(package="kerasnorm")
class TransformerEncoderBlock(TransformerEncoderBlockMixin, TransformerBlockBase):
    """Transformer encoder block with Pre-LN, Post-LN or DeepNorm residuals.

    Self-attention, then a feed-forward network, each wrapped in a
    `kerasnorm.NormResidual` with the chosen placement:

    ```python
    "pre":      x = x + F(norm(x))
    "post":     x = norm(x + F(x))
    "deepnorm": x = norm(alpha * x + F(x))
    F = MultiHeadAttention(x, x), then Dense(width)(activation(Dense(inter)(x)))
    ```

    Kernels start Xavier-normal, biases at zero. With `"deepnorm"`, `alpha`
    and `beta` come from `kerasnorm.deepnorm_constants` for a stack of
    `num_layers` encoder blocks (and `decoder_layers` decoder blocks in an
    encoder-decoder model); the feed-forward kernels and the attention value
    and output kernels are Xavier-normal with gain `beta`, the query and key
    kernels keep gain 1. A Pre-LN stack needs a final norm after the last
    block.

    Examples:
        >>> import keras
        >>> import kerasnorm
        >>> block = kerasnorm.TransformerEncoderBlock(
        ...     num_heads=2, key_dim=8, intermediate_dim=64,
        ...     norm_position="deepnorm", num_layers=48)
        >>> tuple(block(keras.random.normal((2, 10, 16))).shape)
        (2, 10, 16)

    Args:
        num_heads: number of attention heads.
        key_dim: size of each attention head's query and key.
        intermediate_dim: width of the feed-forward hidden layer.
        norm_position: `"pre"`, `"post"` or `"deepnorm"`. Defaults to `"pre"`.
        norm_type: `"layer"` (`kerasnorm.LayerNorm`) or `"rms"`
            (`kerasnorm.RMSNorm`). Defaults to `"layer"`.
        num_layers: depth N of the encoder stack the block belongs to; sets
            DeepNorm's constants. Defaults to `1`.
        dropout: rate of the attention-probability dropout and of the dropout
            on each sub-layer's output. Defaults to `0.0`.
        activation: feed-forward activation. Defaults to `"gelu"`.
        norm_epsilon: epsilon of the norms. Defaults to `1e-5`.
        decoder_layers: depth M of the decoder stack when the encoder is part
            of an encoder-decoder model (DeepNorm's encoder-decoder constants),
            else `None`. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, width)` tensor.
        padding_mask: optional `(batch, seq)` boolean mask, False at padded
            positions, which are not attended to. Defaults to the Keras mask of
            `inputs`, which is propagated to the output.
        attention_mask: optional `(batch, seq, seq)` boolean mask, True where
            a query may attend to a key; combined with `padding_mask`.
        training: whether dropout is active.

    Reference:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762).
        - [Xiong et al., 2020](https://arxiv.org/abs/2002.04745) (Pre-LN).
        - [Wang et al., 2022](https://arxiv.org/abs/2203.00555) (DeepNorm).
    """
