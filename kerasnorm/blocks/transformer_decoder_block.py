import keras
from keras import ops

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
        rope_max_wavelength=None,
        **kwargs,
    ):
        if rope_max_wavelength is not None and not rope_max_wavelength > 0:
            raise ValueError(
                "`rope_max_wavelength` is the longest rotary wavelength, a "
                "positive number (10000.0 in most models), or None for no "
                "rotary positions. Received: "
                f"rope_max_wavelength={rope_max_wavelength!r}"
            )
        self.rope_max_wavelength = rope_max_wavelength
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
            rope_max_wavelength=rope_max_wavelength,
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
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        training=None,
    ):
        if self_attention_cache is not None:
            return self._call_with_stacked_cache(
                decoder_sequence,
                self_attention_cache,
                self_attention_cache_update_index,
                encoder_sequence=encoder_sequence,
                training=training,
            )
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

    def _call_with_stacked_cache(
        self, decoder_sequence, cache, update_index, encoder_sequence, training
    ):
        """keras-hub's cached call: `cache` `(batch, 2, L, heads, key_dim)`
        holds the keys and values, `update_index` the position of the first
        token of `decoder_sequence`; returns `(output, cache)`."""
        if update_index is None:
            raise ValueError(
                "A call with `self_attention_cache` needs "
                "`self_attention_cache_update_index`, the position of the "
                "first token of `decoder_sequence` in the cache. Received: "
                "self_attention_cache_update_index=None"
            )
        length = ops.shape(decoder_sequence)[1]
        positions = ops.arange(length, dtype="int32") + ops.cast(update_index, "int32")
        # keras-hub's (batch, L, heads, d) to the cached step's heads-first
        # layout and back.
        x, caches = self.cached_step(
            decoder_sequence,
            ops.transpose(cache[:, 0], (0, 2, 1, 3)),
            ops.transpose(cache[:, 1], (0, 2, 1, 3)),
            positions,
            encoder_sequence=encoder_sequence,
            training=training,
        )
        caches = [ops.transpose(c, (0, 2, 1, 3)) for c in caches]
        return x, ops.stack(caches, axis=1)

    def cached_step(
        self,
        decoder_sequence,
        key_cache,
        value_cache,
        positions,
        encoder_sequence=None,
        training=None,
    ):
        """One generation call over a key/value cache.

        Args:
            decoder_sequence: `(batch, T, width)`, the new tokens.
            key_cache, value_cache: `(batch, num_heads, L, key_dim)`.
            positions: `(T,)` int, consecutive positions of the new tokens;
                their keys and values are written at those rows, and each
                attends to the rows at or before its position.
            encoder_sequence: the encoder output, for a block with
                cross-attention.

        Returns:
            `(output, (key_cache, value_cache))`.
        """
        attention = self.self_attention.sublayer
        x, caches = self.self_attention.call_with_state(
            decoder_sequence,
            lambda y: attention.cached_call(y, key_cache, value_cache, positions),
            training=training,
        )
        if self.cross_attention is not None:
            if encoder_sequence is None:
                raise ValueError(
                    "The block was built with cross-attention: call it with "
                    "`encoder_sequence`."
                )
            x = self.cross_attention(x, encoder_sequence, training=training)
        return self.feed_forward(x, training=training), caches

    def get_config(self):
        config = super().get_config()
        config["rope_max_wavelength"] = self.rope_max_wavelength
        return config

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
        rope_max_wavelength: rotate queries and keys by their positions
            (rotary position embedding, Su et al. 2021, the half-split layout
            of Llama and keras-hub) with this longest wavelength, e.g.
            `10000.0`; `None` for no rotary positions. Defaults to `None`.
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
        self_attention_cache: optional `(batch, 2, L, num_heads, key_dim)`
            keys and values of earlier positions (keras-hub's
            `TransformerDecoder` layout); the call then returns
            `(output, updated_cache)`.
        self_attention_cache_update_index: with a cache, the position of
            the first token of `decoder_sequence`.
        training: whether dropout is active.

    Reference:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762).
        - [Wang et al., 2022](https://arxiv.org/abs/2203.00555) (DeepNorm).
    """
