import keras

from kerasnorm._core import compute_stats
from kerasnorm._core import lowering
from kerasnorm._core import normalize
from kerasnorm.norms._base import ChannelNormBase


class InstanceNormMixin(ChannelNormBase):
    """`InstanceNorm`'s arguments, weights and computation, over no Layer class
    (`kerasnorm.norms._base` says why)."""

    _min_rank = 3
    _layout = "(batch, spatial..., channels) with at least one spatial axis"

    def __init__(
        self,
        axis=-1,
        epsilon=1e-5,
        center=True,
        scale=True,
        beta_initializer="zeros",
        gamma_initializer="ones",
        beta_regularizer=None,
        gamma_regularizer=None,
        beta_constraint=None,
        gamma_constraint=None,
        **kwargs,
    ):
        super().__init__(
            axis=axis,
            epsilon=epsilon,
            center=center,
            scale=scale,
            beta_initializer=beta_initializer,
            gamma_initializer=gamma_initializer,
            beta_regularizer=beta_regularizer,
            gamma_regularizer=gamma_regularizer,
            beta_constraint=beta_constraint,
            gamma_constraint=gamma_constraint,
            **kwargs,
        )

    def call(self, inputs, mask=None):
        rank = len(inputs.shape)
        (channel_axis,) = self._param_axes(inputs.shape)
        self._check_mask(mask, channel_axis)
        axes = tuple(a for a in range(1, rank) if a != channel_axis)
        inputs, stats_mask = self._apply_mask(inputs, mask, axes)
        mean, var = compute_stats(inputs, axes, mask=stats_mask)
        gamma, beta = self._affine(self._param_shape(rank, (channel_axis,)))
        return normalize(
            inputs,
            mean,
            var,
            epsilon=self.epsilon,
            scale=gamma,
            bias=beta,
            dtype=self.compute_dtype,
            mean_in_shift=not lowering.centres_first(),
        )


@keras.saving.register_keras_serializable(package="kerasnorm")
class InstanceNorm(InstanceNormMixin, keras.layers.Layer):
    """Instance normalization (Ulyanov et al., 2016).

    Each example and each channel is normalized over the spatial axes (every
    axis but the batch and the channel axis), then scaled and shifted per
    channel:

    ```python
    mean = mean(x, spatial_axes)
    var = mean(square(x - mean), spatial_axes)
    y = (x - mean) * rsqrt(var + epsilon) * gamma + beta
    ```

    It equals `GroupNorm(groups=channels)`, masks included: for channels-last
    data a Keras mask over leading axes (`(batch, time)`, `(batch, height)`)
    excludes padded positions from the statistics, whatever they hold.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> x = np.random.default_rng(0).normal(3.0, 2.0, (4, 16, 16, 3))
        >>> x = x.astype("float32")
        >>> y = keras.ops.convert_to_numpy(kerasnorm.InstanceNorm()(x))
        >>> bool(np.allclose(y.std(axis=(1, 2)), 1.0, atol=1e-3))
        True

    Args:
        axis: int, the channel axis (`1` for channels-first data). Defaults to
            `-1`.
        epsilon: small float added to the variance inside the square root.
            Defaults to `1e-5`.
        center: whether to add the learned per-channel bias `beta`. Defaults to
            `True`.
        scale: whether to multiply by the learned per-channel gain `gamma`.
            Defaults to `True`.
        beta_initializer: initializer for `beta`. Defaults to `"zeros"`.
        gamma_initializer: initializer for `gamma`. Defaults to `"ones"`.
        beta_regularizer: optional regularizer for `beta`. Defaults to `None`.
        gamma_regularizer: optional regularizer for `gamma`. Defaults to `None`.
        beta_constraint: optional constraint for `beta`. Defaults to `None`.
        gamma_constraint: optional constraint for `gamma`. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Reference:
        - [Ulyanov et al., 2016](https://arxiv.org/abs/1607.08022).
    """
