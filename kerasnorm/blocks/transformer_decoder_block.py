import keras

from kerasnorm._compat import keras_mask
from kerasnorm.blocks._base import TransformerBlockBase
from kerasnorm.blocks._base import TransformerBlockMixin
from kerasnorm.blocks._base import merge_masks
from kerasnorm.blocks._sublayers import build_sublayer


class TransformerDecoderBlockMixin(TransformerBlockMixin):
    """`TransformerDecoderBlock`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.blocks._base` says why)."""

    role = "decoder"
    other_stack = "encoder_layers"
    causal = True

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
        encoder_layers=None,
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
            other_layers=encoder_layers,
            **kwargs,
        )
        self.cross_attention = None

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        build_sublayer(self, self.self_attention, decoder_sequence_shape)
        if encoder_sequence_shape is not None:
            self._build_cross_attention(decoder_sequence_shape, encoder_sequence_shape)
        build_sublayer(self, self.feed_forward, decoder_sequence_shape)

    def _build_cross_attention(self, decoder_sequence_shape, encoder_sequence_shape):
        if self.norm_position == "deepnorm" and self._other_layers is None:
            raise ValueError(
                "A DeepNorm decoder block with cross-attention belongs to an "
                "encoder-decoder model, whose constants need the encoder "
                "depth: pass `encoder_layers`. Received: encoder_layers=None"
            )
        self.cross_attention = self._residual(
            self._attention_class(
                self.num_heads,
                self.key_dim,
                dropout=self.dropout,
                value_gain=self.beta,
                dtype=self.dtype_policy,
                name="cross_attention",
            ),
            "cross_attention",
        )
        build_sublayer(
            self,
            self.cross_attention.sublayer,
            decoder_sequence_shape,
            encoder_sequence_shape,
        )
        build_sublayer(self, self.cross_attention, decoder_sequence_shape)

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_padding_mask=None,
        encoder_attention_mask=None,
        training=None,
    ):
        if (encoder_sequence is None) != (self.cross_attention is None):
            raise ValueError(
                "The block was built "
                + ("with" if self.cross_attention is not None else "without")
                + " cross-attention: call it "
                + ("with" if self.cross_attention is not None else "without")
                + " `encoder_sequence`."
            )
        if decoder_padding_mask is None:
            decoder_padding_mask = keras_mask(decoder_sequence)
        x = self.self_attention(
            decoder_sequence,
            attention_mask=merge_masks(decoder_padding_mask, decoder_attention_mask),
            training=training,
        )
        if encoder_sequence is not None:
            if encoder_padding_mask is None:
                encoder_padding_mask = keras_mask(encoder_sequence)
            x = self.cross_attention(
                x,
                encoder_sequence,
                attention_mask=merge_masks(
                    encoder_padding_mask, encoder_attention_mask
                ),
                training=training,
            )
        return self.feed_forward(x, training=training)

    def compute_output_shape(self, decoder_sequence_shape, encoder_sequence_shape=None):
        return tuple(decoder_sequence_shape)


@keras.saving.register_keras_serializable(package="kerasnorm")
class TransformerDecoderBlock(TransformerDecoderBlockMixin, TransformerBlockBase):
    """Transformer decoder block with Pre-LN, Post-LN or DeepNorm residuals.

    Causal self-attention, cross-attention to an encoder output (when the
    block is called with one), then a feed-forward network, each wrapped in a
    `kerasnorm.NormResidual` with the chosen placement:

    ```python
    "pre":      x = x + F(norm(x))
    "post":     x = norm(x + F(x))
    "deepnorm": x = norm(alpha * x + F(x))
    ```

    Only the decoder stream is normalized by the block; the encoder output
    enters cross-attention as it is (a Pre-LN encoder ends in its own norm).

    With `"deepnorm"`, `alpha` and `beta` are the decoder constants of
    `kerasnorm.deepnorm_constants`: decoder-only for a stack of `num_layers`
    blocks, encoder-decoder when `encoder_layers` is given. The feed-forward
    kernels and the value and output kernels of both attentions are
    Xavier-normal with gain `beta`; query and key kernels keep gain 1.
    Whether cross-attention exists is decided by the first call (or `build`):
    a block built with an encoder output has it.

    Examples:
        >>> import keras
        >>> import kerasnorm
        >>> block = kerasnorm.TransformerDecoderBlock(
        ...     num_heads=2, key_dim=8, intermediate_dim=64,
        ...     norm_position="deepnorm", num_layers=6, encoder_layers=6)
        >>> y = block(keras.random.normal((2, 7, 16)), keras.random.normal((2, 9, 16)))
        >>> tuple(y.shape)
        (2, 7, 16)

    Args:
        num_heads: number of attention heads.
        key_dim: size of each attention head's query and key.
        intermediate_dim: width of the feed-forward hidden layer.
        norm_position: `"pre"`, `"post"` or `"deepnorm"`. Defaults to `"pre"`.
        norm_type: `"layer"` (`kerasnorm.LayerNorm`) or `"rms"`
            (`kerasnorm.RMSNorm`). Defaults to `"layer"`.
        num_layers: depth M of the decoder stack the block belongs to; sets
            DeepNorm's constants. Defaults to `1`.
        dropout: rate of the attention-probability dropout and of the dropout
            on each sub-layer's output. Defaults to `0.0`.
        activation: feed-forward activation. Defaults to `"gelu"`.
        norm_epsilon: epsilon of the norms. Defaults to `1e-5`.
        encoder_layers: depth N of the encoder stack in an encoder-decoder
            model (DeepNorm's encoder-decoder constants), or `None` for a
            decoder-only model. Required with `"deepnorm"` when the block has
            cross-attention. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        decoder_sequence: `(batch, target_seq, width)` tensor.
        encoder_sequence: optional `(batch, source_seq, encoder_width)`
            encoder output to attend to.
        decoder_padding_mask: optional `(batch, target_seq)` boolean mask,
            False at padded positions. Defaults to the Keras mask of
            `decoder_sequence`, which is propagated to the output.
        decoder_attention_mask: optional `(batch, target_seq, target_seq)`
            mask, combined with the causal mask.
        encoder_padding_mask: optional `(batch, source_seq)` mask. Defaults to
            the Keras mask of `encoder_sequence`.
        encoder_attention_mask: optional `(batch, target_seq, source_seq)`
            mask for cross-attention.
        training: whether dropout is active.

    Reference:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762).
        - [Wang et al., 2022](https://arxiv.org/abs/2203.00555) (DeepNorm).
    """
