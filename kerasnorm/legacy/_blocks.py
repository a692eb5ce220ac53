"""`NormResidual` and the transformer blocks as `tf_keras` layers.

Each class is the mixin of the Keras 3 layer (`kerasnorm.blocks`) over
`tf_keras.layers.Layer`, made of `tf_keras` sub-layers (`MultiHeadAttention`,
`Dense`, `Dropout`) and the legacy norms; no math is repeated here.
"""

import tensorflow as tf
import tf_keras

from kerasnorm import blocks
from kerasnorm.blocks._sublayers import AttentionSublayerMixin
from kerasnorm.blocks._sublayers import FeedForwardSublayerMixin
from kerasnorm.blocks.norm_residual import NormResidualMixin
from kerasnorm.blocks.transformer_decoder_block import TransformerDecoderBlockMixin
from kerasnorm.blocks.transformer_encoder_block import TransformerEncoderBlockMixin
from kerasnorm.legacy._adapter import TfKerasAdapter
from kerasnorm.legacy._adapter import legacy_docstring
from kerasnorm.legacy._norms import LayerNorm
from kerasnorm.legacy._norms import RMSNorm

_register = tf_keras.saving.register_keras_serializable(package="kerasnorm")


def _zeros(shape, dtype):
    return tf.zeros([1 if size is None else size for size in shape], dtype)


@_register
class AttentionSublayer(TfKerasAdapter, AttentionSublayerMixin, tf_keras.layers.Layer):
    __doc__ = AttentionSublayerMixin.__doc__

    def _build_attention(self, inputs_shape, context_shape):
        # `tf_keras`'s MultiHeadAttention creates its weights on its first
        # call only.
        self.attention(
            _zeros(inputs_shape, self.compute_dtype),
            _zeros(context_shape, self.compute_dtype),
        )


@_register
class FeedForwardSublayer(
    TfKerasAdapter, FeedForwardSublayerMixin, tf_keras.layers.Layer
):
    __doc__ = FeedForwardSublayerMixin.__doc__


@_register
class NormResidual(TfKerasAdapter, NormResidualMixin, tf_keras.layers.Layer):
    __doc__ = legacy_docstring(blocks.NormResidual)
    _norm_types = {"layer": LayerNorm, "rms": RMSNorm}


class TfKerasBlockAdapter(TfKerasAdapter):
    """A block made of the legacy sub-layers."""

    _attention_class = AttentionSublayer
    _feed_forward_class = FeedForwardSublayer
    _residual_class = NormResidual


@_register
class TransformerEncoderBlock(
    TfKerasBlockAdapter, TransformerEncoderBlockMixin, tf_keras.layers.Layer
):
    __doc__ = legacy_docstring(blocks.TransformerEncoderBlock)


@_register
class TransformerDecoderBlock(
    TfKerasBlockAdapter, TransformerDecoderBlockMixin, tf_keras.layers.Layer
):
    __doc__ = legacy_docstring(blocks.TransformerDecoderBlock)

    def call(self, decoder_sequence, encoder_sequence=None, **kwargs):
        # `tf_keras` builds a layer from the shape of its first argument
        # only; the cross-attention, which needs the encoder's too, is built
        # on the first call that passes it.
        if encoder_sequence is not None and self.cross_attention is None:
            with tf.init_scope():
                self._build_cross_attention(
                    decoder_sequence.shape, encoder_sequence.shape
                )
        return super().call(decoder_sequence, encoder_sequence, **kwargs)
