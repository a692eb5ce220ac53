"""The base every normalization layer shares: options, weights, config.

Subclasses choose the reduction axes and the parameter shape in `build` and
call the math core in `call`; nothing here computes a statistic.
"""

import keras
from keras import constraints
from keras import initializers
from keras import ops
from keras import regularizers

from kerasnorm._core import check_epsilon


class Normalization(keras.layers.Layer):
    """Base class: epsilon, optional gain `gamma` and bias `beta`.

    Norm parameters are float32 variables read without autocasting, so under a
    `mixed_float16`/`mixed_bfloat16` policy they stay float32 and the statistics
    are computed in float32; only the output is cast to the compute dtype.
    """

    def __init__(
        self,
        *,
        epsilon,
        center,
        scale,
        beta_initializer="zeros",
        gamma_initializer="ones",
        beta_regularizer=None,
        gamma_regularizer=None,
        beta_constraint=None,
        gamma_constraint=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.epsilon = check_epsilon(epsilon)
        self.center = bool(center)
        self.scale = bool(scale)
        self.beta_initializer = initializers.get(beta_initializer)
        self.gamma_initializer = initializers.get(gamma_initializer)
        self.beta_regularizer = regularizers.get(beta_regularizer)
        self.gamma_regularizer = regularizers.get(gamma_regularizer)
        self.beta_constraint = constraints.get(beta_constraint)
        self.gamma_constraint = constraints.get(gamma_constraint)
        self.supports_masking = True
        # Statistics are promoted to float32 in the core anyway; casting the
        # inputs to the compute dtype first would only add a pass.
        self.autocast = False
        self.gamma = None
        self.beta = None

    def _build_affine(self, shape):
        """Create `gamma` (if `scale`) and `beta` (if `center`) of `shape`."""
        if self.scale:
            self.gamma = self.add_weight(
                name="gamma",
                shape=shape,
                initializer=self.gamma_initializer,
                regularizer=self.gamma_regularizer,
                constraint=self.gamma_constraint,
                trainable=True,
                autocast=False,
            )
        if self.center:
            self.beta = self.add_weight(
                name="beta",
                shape=shape,
                initializer=self.beta_initializer,
                regularizer=self.beta_regularizer,
                constraint=self.beta_constraint,
                trainable=True,
                autocast=False,
            )

    def _affine(self, shape=None):
        """`(gamma, beta)` reshaped to `shape` (unchanged when None)."""
        if shape is None:
            return self.gamma, self.beta
        return tuple(
            None if p is None else ops.reshape(p, shape)
            for p in (self.gamma, self.beta)
        )

    @staticmethod
    def _defined_size(input_shape, axis, what):
        size = input_shape[axis]
        if size is None:
            raise ValueError(
                f"The {what} dimension (axis {axis}) of the input must be "
                f"defined. Received: input_shape={tuple(input_shape)}"
            )
        return int(size)

    @staticmethod
    def _stats_mask(mask, rank, axes):
        """The Keras mask as a weight over the reduced axes, or None.

        Keras masks cover the leading (batch, time, ...) axes. They only change
        the statistics when a reduction runs over one of those axes; per-step
        statistics of padded steps are never read.
        """
        if mask is None:
            return None
        mask_rank = len(mask.shape)
        if not any(0 < a < mask_rank for a in axes):
            return None
        return ops.reshape(mask, tuple(ops.shape(mask)) + (1,) * (rank - mask_rank))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = {
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
            "beta_initializer": initializers.serialize(self.beta_initializer),
            "gamma_initializer": initializers.serialize(self.gamma_initializer),
            "beta_regularizer": regularizers.serialize(self.beta_regularizer),
            "gamma_regularizer": regularizers.serialize(self.gamma_regularizer),
            "beta_constraint": constraints.serialize(self.beta_constraint),
            "gamma_constraint": constraints.serialize(self.gamma_constraint),
        }
        return {**super().get_config(), **config}
