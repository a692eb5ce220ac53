"""What the encoder and decoder blocks share: arguments, constants, config.

As in `kerasnorm.norms._base`, `NormResidual`, the blocks and their
sub-layers are mixins over no Layer class, holding their arguments, weights
and computation; thin classes put them over Keras 3 (`TransformerBlockBase`,
...) or over `tf_keras` (`kerasnorm.legacy.layers`). A mixin creates its
sub-layers from `_framework.layers` (the `keras` module or `tf_keras`) and
from the classes named in `_attention_class`, `_feed_forward_class` and
`_residual_class`, so each generation's block is made of its own layers.
"""

import keras
from keras import ops

from kerasnorm._core.validation import check_choice
from kerasnorm._core.validation import check_epsilon
from kerasnorm._core.validation import check_positive_int
from kerasnorm._core.validation import check_rate
from kerasnorm.blocks._sublayers import AttentionSublayer
from kerasnorm.blocks._sublayers import FeedForwardSublayer
from kerasnorm.blocks.deepnorm import deepnorm_constants
from kerasnorm.blocks.norm_residual import NORM_POSITIONS
from kerasnorm.blocks.norm_residual import NORM_TYPES
from kerasnorm.blocks.norm_residual import NormResidual


def merge_masks(padding_mask, attention_mask):
    """A (B, S) padding mask over keys and a (B, T, S) attention mask, ANDed."""
    mask = None
    if padding_mask is not None:
        mask = ops.expand_dims(ops.cast(padding_mask, "bool"), 1)
    if attention_mask is not None:
        attention_mask = ops.cast(attention_mask, "bool")
        mask = attention_mask if mask is None else ops.logical_and(mask, attention_mask)
    return mask


class TransformerBlockMixin:
    """Self-attention and feed-forward sub-layers, each in a `NormResidual`.

    Subclasses set `role` (`"encoder"`/`"decoder"`), `other_stack`, the
    name of the argument giving the other stack's depth in an
    encoder-decoder model, and whether self-attention is `causal`.
    """

    role = None
    other_stack = None
    causal = False
    _framework = keras
    _attention_class = None
    _feed_forward_class = None
    _residual_class = None

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
        other_layers=None,
        rope_max_wavelength=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int(num_heads, "num_heads")
        self.key_dim = check_positive_int(key_dim, "key_dim")
        self.intermediate_dim = check_positive_int(intermediate_dim, "intermediate_dim")
        self.norm_position = check_choice(
            norm_position, NORM_POSITIONS, "norm_position"
        )
        self.norm_type = check_choice(norm_type, NORM_TYPES, "norm_type")
        self.num_layers = check_positive_int(num_layers, "num_layers")
        self.dropout = check_rate(dropout, "dropout")
        self.activation = self._framework.activations.get(activation)
        self.norm_epsilon = check_epsilon(norm_epsilon, "norm_epsilon")
        if other_layers is not None:
            other_layers = check_positive_int(other_layers, self.other_stack)
        self._other_layers = other_layers

        self.alpha, self.beta = 1.0, 1.0
        if norm_position == "deepnorm":
            depths = {f"{self.role}_layers": self.num_layers}
            if other_layers is not None:
                depths[self.other_stack] = other_layers
            self.alpha, self.beta = deepnorm_constants(**depths)[self.role]

        self.self_attention = self._residual(
            self._attention_class(
                num_heads,
                key_dim,
                dropout=self.dropout,
                value_gain=self.beta,
                causal=self.causal,
                rope_max_wavelength=rope_max_wavelength,
                dtype=self.dtype_policy,
                name="attention",
            ),
            "self_attention",
        )
        self.feed_forward = self._residual(
            self._feed_forward_class(
                intermediate_dim,
                activation=self.activation,
                gain=self.beta,
                dtype=self.dtype_policy,
                name="feed_forward",
            ),
            "feed_forward",
        )
        self.supports_masking = True

    def _residual(self, sublayer, name):
        return self._residual_class(
            sublayer,
            norm_position=self.norm_position,
            norm_type=self.norm_type,
            alpha=self.alpha,
            norm_epsilon=self.norm_epsilon,
            dropout=self.dropout,
            dtype=self.dtype_policy,
            name=name,
        )

    def compute_mask(self, inputs, mask=None, *args, **kwargs):
        return mask

    def get_config(self):
        config = {
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "intermediate_dim": self.intermediate_dim,
            "norm_position": self.norm_position,
            "norm_type": self.norm_type,
            "num_layers": self.num_layers,
            "dropout": self.dropout,
            "activation": self._framework.activations.serialize(self.activation),
            "norm_epsilon": self.norm_epsilon,
            self.other_stack: self._other_layers,
        }
        return {**super().get_config(), **config}


class TransformerBlockBase(TransformerBlockMixin, keras.layers.Layer):
    """A transformer block over `keras.layers.Layer`, made of Keras 3 layers."""

    _attention_class = AttentionSublayer
    _feed_forward_class = FeedForwardSublayer
    _residual_class = NormResidual
