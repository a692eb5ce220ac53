import inspect

import keras
from keras import ops

from kerasnorm._core.validation import check_choice
from kerasnorm._core.validation import check_epsilon
from kerasnorm._core.validation import check_positive_number
from kerasnorm._core.validation import check_rate
from kerasnorm.blocks._sublayers import build_sublayer
from kerasnorm.norms.layer_norm import LayerNorm
from kerasnorm.norms.rms_norm import RMSNorm

NORM_POSITIONS = ("pre", "post", "deepnorm")
NORM_TYPES = {"layer": LayerNorm, "rms": RMSNorm}


def _builds_from_one_shape(layer):
    required = [
        p
        for p in inspect.signature(layer.build).parameters.values()
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) == 1


class NormResidualMixin:
    """`NormResidual`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.blocks._base` says why)."""

    _framework = keras
    # The norm class of each `norm_type`.
    _norm_types = None

    def __init__(
        self,
        sublayer,
        norm_position="pre",
        norm_type="layer",
        alpha=1.0,
        norm_epsilon=1e-5,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        fw = self._framework
        if not isinstance(sublayer, fw.layers.Layer):
            raise ValueError(
                f"`sublayer` must be a {fw.__name__}.layers.Layer. "
                f"Received: sublayer={sublayer!r}"
            )
        self.norm_position = check_choice(
            norm_position, NORM_POSITIONS, "norm_position"
        )
        self.norm_type = check_choice(norm_type, NORM_TYPES, "norm_type")
        alpha = check_positive_number(alpha, "alpha")
        if alpha != 1.0 and norm_position != "deepnorm":
            raise ValueError(
                "Only norm_position='deepnorm' scales the residual stream, so "
                f"`alpha` must be 1.0 with norm_position={norm_position!r}. "
                f"Received: alpha={alpha!r}"
            )
        self.alpha = alpha
        self.norm_epsilon = check_epsilon(norm_epsilon, "norm_epsilon")
        self.dropout = check_rate(dropout, "dropout")
        self.sublayer = sublayer
        self.norm = self._norm_types[norm_type](
            epsilon=self.norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.dropout_layer = fw.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="dropout"
        )
        self.supports_masking = True

    def build(self, input_shape):
        build_sublayer(self, self.norm, input_shape)
        # A sub-layer built from the stream's shape alone is built here, so
        # that its weights exist before saved ones are loaded; one that needs
        # more shapes (cross-attention) builds on its first call, or its owner
        # builds it beforehand.
        if not self.sublayer.built and _builds_from_one_shape(self.sublayer):
            build_sublayer(self, self.sublayer, input_shape)

    def call(self, inputs, *args, training=None, **kwargs):
        x = self.norm(inputs) if self.norm_position == "pre" else inputs
        y = self.dropout_layer(self.sublayer(x, *args, **kwargs), training=training)
        return self.combine(inputs, y)

    def call_with_state(self, inputs, function, training=None):
        """The residual around `function(x) -> (y, state)` in place of the
        sub-layer (a cached attention step): `(output, state)`."""
        x = self.norm(inputs) if self.norm_position == "pre" else inputs
        y, state = function(x)
        return self.combine(inputs, self.dropout_layer(y, training=training)), state

    def combine(self, inputs, y):
        """The stream after the sub-layer's output `y` joins it."""
        if self.norm_position == "pre":
            return inputs + y
        if self.norm_position == "deepnorm":
            inputs = ops.multiply(inputs, ops.cast(self.alpha, inputs.dtype))
        return self.norm(inputs + y)

    def compute_mask(self, inputs, mask=None, *args, **kwargs):
        return mask

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def get_config(self):
        config = {
            "sublayer": self._framework.saving.serialize_keras_object(self.sublayer),
            "norm_position": self.norm_position,
            "norm_type": self.norm_type,
            "alpha": self.alpha,
            "norm_epsilon": self.norm_epsilon,
            "dropout": self.dropout,
        }
        return {**super().get_config(), **config}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        # `layers.deserialize` knows each generation's built-in layers; the
        # generic `saving.deserialize_keras_object` of `tf_keras` does not.
        config["sublayer"] = cls._framework.layers.deserialize(config["sublayer"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="kerasnorm")
class NormResidual(NormResidualMixin, keras.layers.Layer):
    """A residual connection around any sub-layer, with a chosen norm placement.

    For a sub-layer `F` (attention, feed-forward, your own layer):

    ```python
    "pre":      y = x + dropout(F(norm(x)))
    "post":     y = norm(x + dropout(F(x)))
    "deepnorm": y = norm(alpha * x + dropout(F(x)))
    ```

    Extra positional and keyword call arguments go to `F` unchanged (for
    example the encoder output and a mask for cross-attention); only the
    residual stream `x` is normalized. DeepNorm's other half, the
    beta-scaled initialization of `F`'s weights, belongs to `F`: see
    `kerasnorm.deepnorm_constants`. A Pre-LN stack needs a final norm after
    its last block; that is the model's job, not the block's.

    Examples:
        >>> import keras
        >>> import kerasnorm
        >>> ffn = keras.Sequential([keras.layers.Dense(64, "gelu"),
        ...                         keras.layers.Dense(16)])
        >>> alpha, _ = kerasnorm.deepnorm_constants(encoder_layers=12)["encoder"]
        >>> block = kerasnorm.NormResidual(ffn, "deepnorm", alpha=alpha)
        >>> tuple(block(keras.random.normal((2, 5, 16))).shape)
        (2, 5, 16)

    Args:
        sublayer: a `keras.layers.Layer` whose first call argument is the
            (normalized, for `"pre"`) residual stream and whose output has the
            same shape.
        norm_position: `"pre"`, `"post"` or `"deepnorm"`. Defaults to `"pre"`.
        norm_type: `"layer"` (`kerasnorm.LayerNorm`) or `"rms"`
            (`kerasnorm.RMSNorm`). Defaults to `"layer"`.
        alpha: the residual scale; only `"deepnorm"` accepts a value other than
            1. Defaults to `1.0`.
        norm_epsilon: epsilon of the norm. Defaults to `1e-5`.
        dropout: dropout rate applied to `F`'s output before the addition.
            Defaults to `0.0`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Reference:
        - [Xiong et al., 2020](https://arxiv.org/abs/2002.04745) (Pre-LN vs
          Post-LN).
        - [Wang et al., 2022](https://arxiv.org/abs/2203.00555) (DeepNorm).
    """

    _norm_types = NORM_TYPES
