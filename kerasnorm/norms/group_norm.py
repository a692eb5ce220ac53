import math

import keras
from keras import ops

from kerasnorm._core import check_groups
from kerasnorm._core import compute_stats
from kerasnorm._core import lowering
from kerasnorm._core import normalize
from kerasnorm._core import reshape_target
from kerasnorm._core import stats_dtype
from kerasnorm.norms._base import ChannelNormBase


class GroupNormMixin(ChannelNormBase):
    """`GroupNorm`'s arguments, weights and computation, over no Layer class
    (`kerasnorm.norms._base` says why)."""

    def __init__(
        self,
        groups=32,
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
        self.groups = check_groups(groups)

    def _num_groups(self, channels):
        """`groups`, with -1 (one group per channel) resolved."""
        return channels if self.groups == -1 else self.groups

    def build(self, input_shape):
        (channel_axis,) = self._param_axes(input_shape)
        channels = input_shape[channel_axis]
        if channels is not None and self.groups > channels:
            raise ValueError(
                f"The number of groups ({self.groups}) cannot be more than the "
                f"number of channels ({channels}). "
                f"Received: groups={self.groups}, input_shape={tuple(input_shape)}"
            )
        if channels is not None and channels % self._num_groups(channels):
            raise ValueError(
                f"`groups` must divide the number of channels: {channels} "
                f"channels cannot be split into groups={self.groups} equal "
                f"groups. Received: input_shape={tuple(input_shape)}"
            )
        super().build(input_shape)

    def _grouped_shape(self, inputs, channel_axis):
        """View of the input as (batch, [pre], groups, C/groups, [post]).

        Returns the shape, the reduction axes in that view and the shape the
        per-channel parameters take in it. `pre` (axes between batch and
        channels) and `post` (after the channels) are flattened to one axis
        each and omitted when empty, so channels-last and channels-first inputs
        of any rank become 4-D.
        """
        a = channel_axis
        rank = len(inputs.shape)
        dims = ops.shape(inputs)
        (channels,) = self._param_sizes
        groups = self._num_groups(channels)
        shape, axes = [dims[0]], []
        if a > 1:
            shape.append(math.prod(dims[1:a]))
            axes.append(len(shape) - 1)
        shape += [groups, channels // groups]
        axes.append(len(shape) - 1)
        param_shape = (groups, channels // groups)
        if a < rank - 1:
            shape.append(math.prod(dims[a + 1 :]))
            axes.append(len(shape) - 1)
            param_shape += (1,)
        return list(reshape_target(shape)), tuple(axes), param_shape

    def call(self, inputs, mask=None):
        rank = len(inputs.shape)
        (channel_axis,) = self._param_axes(inputs.shape)
        self._check_mask(mask, channel_axis)
        channels_last = rank >= 3 and channel_axis == rank - 1
        if lowering.channel_stats() and mask is None and channels_last:
            return self._tflite(inputs)
        inputs, stats_mask = self._apply_mask(inputs, mask, range(1, rank))
        shape, axes, param_shape = self._grouped_shape(inputs, channel_axis)
        if stats_mask is not None:
            # The mask covers axes before the channels only; in the grouped
            # view those are flattened into the `pre` axis.
            dims = ops.shape(inputs)
            stats_mask = ops.broadcast_to(
                stats_mask, (*dims[:channel_axis], *[1] * (rank - channel_axis))
            )
            stats_mask = ops.reshape(stats_mask, (dims[0], -1, *[1] * (len(shape) - 2)))
        grouped = ops.reshape(inputs, shape)
        mean, var = compute_stats(grouped, axes, mask=stats_mask)
        gamma, beta = self._affine(param_shape)
        outputs = normalize(
            grouped,
            mean,
            var,
            epsilon=self.epsilon,
            scale=gamma,
            bias=beta,
            dtype=self.compute_dtype,
            mean_in_shift=not lowering.centres_first(),
        )
        return ops.reshape(outputs, reshape_target(ops.shape(inputs)))

    def _tflite(self, inputs):
        """The `.tflite` graph of a channels-last call: the group statistics
        in channel space (`lowering.channel_group_stats`). A float32 file
        folds the gain into the reciprocal std (both `(batch, 1, .., C)`);
        a fast int8 file keeps `centred * rsqrt(...)` whole, the pattern its
        quantizer keeps in float, and the affine after it, as in the core."""
        (channels,) = self._param_sizes
        x = ops.cast(inputs, stats_dtype(inputs.dtype))
        centred, var = lowering.channel_group_stats(x, self._num_groups(channels))
        multiplier = ops.rsqrt(var + self.epsilon)
        gamma, beta = self._affine()
        if gamma is not None and lowering.active():
            multiplier = multiplier * ops.cast(gamma, x.dtype)
            gamma = None
        y = centred * multiplier
        if gamma is not None:
            y = y * ops.cast(gamma, x.dtype)
        if beta is not None:
            y = y + ops.cast(beta, x.dtype)
        return ops.cast(y, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "groups": self.groups}


@keras.saving.register_keras_serializable(package="kerasnorm")
class GroupNorm(GroupNormMixin, keras.layers.Layer):
    """Group normalization (Wu and He, 2018).

    The channels are split into `groups` groups of `C // groups`; each example
    is normalized over its spatial axes and the channels of one group, then
    scaled and shifted per channel:

    ```python
    xg = reshape(x, (batch, spatial, groups, C // groups))
    mean = mean(xg, axes=(spatial, channels in group))
    var = mean(square(xg - mean), same axes)
    y = reshape((xg - mean) * rsqrt(var + epsilon)) * gamma + beta
    ```

    `groups=1` is LayerNorm over (spatial, channels) with per-channel affine;
    `groups=C` is InstanceNorm. The input is viewed as at most 4-D whatever its
    rank (all spatial axes flattened into one), which keeps the graph within
    what TFLite's builtin MEAN/RESHAPE kernels accept.

    For channels-last data a Keras mask over leading axes (`(batch, time)`,
    `(batch, height)`) excludes padded positions from the statistics,
    whatever they hold (NaN and inf included), exactly as in
    `kerasnorm.InstanceNorm`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> x = np.random.default_rng(0).normal(size=(2, 8, 8, 16)).astype("float32")
        >>> y = keras.ops.convert_to_numpy(kerasnorm.GroupNorm(groups=4)(x))
        >>> groups = y.reshape(2, 8 * 8, 4, 4)
        >>> bool(np.allclose(groups.mean(axis=(1, 3)), 0.0, atol=1e-5))
        True
        >>> x_nchw = np.transpose(x, (0, 3, 1, 2))
        >>> y_nchw = kerasnorm.GroupNorm(groups=4, axis=1)(x_nchw)
        >>> y_back = np.transpose(keras.ops.convert_to_numpy(y_nchw), (0, 2, 3, 1))
        >>> bool(np.allclose(y_back, y, atol=1e-5))
        True

    Args:
        groups: positive int, the number of groups; it must divide the number
            of channels. `-1` means one group per channel (InstanceNorm), as
            in Keras' `GroupNormalization`. Defaults to `32`.
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
        - [Wu and He, 2018](https://arxiv.org/abs/1803.08494).
    """
