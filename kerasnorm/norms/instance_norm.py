import keras

from kerasnorm._core import broadcast_shape
from kerasnorm._core import check_axis
from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
from kerasnorm._core import normalize_axes
from kerasnorm.norms._base import Normalization


@keras.saving.register_keras_serializable(package="kerasnorm")
class InstanceNorm(Normalization):
    """Instance normalization (Ulyanov et al., 2016).

    Each example and each channel is normalized over the spatial axes (every
    axis but the batch and the channel axis), then scaled and shifted per
    channel:

    ```python
    mean = mean(x, spatial_axes)
    var = mean(square(x - mean), spatial_axes)
    y = (x - mean) * rsqrt(var + epsilon) * gamma + beta
    ```

    It equals `GroupNorm(groups=channels)`. For channels-last sequences a Keras
    mask of shape `(batch, time)` excludes padded steps from the statistics.

    Example:

    >>> x = keras.random.normal((4, 64, 64, 3))
    >>> y = kerasnorm.InstanceNorm()(x)

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
        self.axis = check_axis(axis, allow_list=False)

    def build(self, input_shape):
        rank = len(input_shape)
        if rank < 3:
            raise ValueError(
                "InstanceNorm needs at least one spatial axis: inputs of rank "
                ">= 3 (batch, ..., channels). "
                f"Received: input_shape={tuple(input_shape)}"
            )
        (channel_axis,) = normalize_axes(self.axis, rank)
        if channel_axis == 0:
            raise ValueError(
                "`axis` is the channel axis and cannot be the batch axis 0. "
                f"Received: axis={self.axis}"
            )
        channels = self._defined_size(input_shape, channel_axis, "channel")
        self._channels_last = channel_axis == rank - 1
        self._axes = tuple(a for a in range(1, rank) if a != channel_axis)
        self._build_affine((channels,))
        self._param_shape = (
            None
            if self._channels_last
            else broadcast_shape(rank, (channel_axis,), (channels,))
        )

    def call(self, inputs, mask=None):
        if mask is not None and not self._channels_last:
            # Keras masks cover (batch, time); a channels-first input puts the
            # channels where the mask expects time.
            raise ValueError(
                "InstanceNorm accepts a Keras mask only for "
                f"channels-last inputs (axis=-1). Received: axis={self.axis}"
            )
        stats_mask = self._stats_mask(mask, len(inputs.shape), self._axes)
        mean, var = compute_stats(inputs, self._axes, mask=stats_mask)
        gamma, beta = self._affine(self._param_shape)
        return normalize(
            inputs,
            mean,
            var,
            epsilon=self.epsilon,
            scale=gamma,
            bias=beta,
            dtype=self.compute_dtype,
            centred=False,
        )

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}
