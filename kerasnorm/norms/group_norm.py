import math

import keras
from keras import ops

from kerasnorm._core import check_axis
from kerasnorm._core import check_positive_int
from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
from kerasnorm._core import normalize_axes
from kerasnorm.norms._base import Normalization


@keras.saving.register_keras_serializable(package="kerasnorm")
class GroupNorm(Normalization):
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

    For channels-last sequences a Keras mask of shape `(batch, time)` excludes
    padded steps from the statistics.

    Example:

    >>> x = keras.random.normal((8, 32, 32, 64))
    >>> y = kerasnorm.GroupNorm(groups=8)(x)
    >>> x_nchw = keras.random.normal((8, 64, 32, 32))
    >>> y = kerasnorm.GroupNorm(groups=8, axis=1)(x_nchw)

    Args:
        groups: positive int, the number of groups; it must divide the number
            of channels. Defaults to `32`.
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
        self.groups = check_positive_int(groups, "groups")
        self.axis = check_axis(axis, allow_list=False)

    def build(self, input_shape):
        rank = len(input_shape)
        if rank < 2:
            raise ValueError(
                "GroupNorm expects inputs of rank >= 2 (batch, ..., channels). "
                f"Received: input_shape={tuple(input_shape)}"
            )
        (self._channel_axis,) = normalize_axes(self.axis, rank)
        if self._channel_axis == 0:
            raise ValueError(
                "`axis` is the channel axis and cannot be the batch axis 0. "
                f"Received: axis={self.axis}"
            )
        channels = self._defined_size(input_shape, self._channel_axis, "channel")
        if channels % self.groups:
            raise ValueError(
                f"`groups` must divide the number of channels: {channels} "
                f"channels cannot be split into groups={self.groups} equal "
                f"groups. Received: input_shape={tuple(input_shape)}"
            )
        self._build_affine((channels,))

    def _grouped_shape(self, inputs):
        """View of the input as (batch, [pre], groups, C/groups, [post]).

        Returns the shape, the reduction axes in that view and the shape the
        per-channel parameters take in it. `pre` (axes between batch and
        channels) and `post` (after the channels) are flattened to one axis
        each and omitted when empty, so channels-last and channels-first inputs
        of any rank become 4-D.
        """
        a = self._channel_axis
        rank = len(inputs.shape)
        dims = ops.shape(inputs)
        channels = inputs.shape[a]
        shape, axes = [dims[0]], []
        if a > 1:
            shape.append(math.prod(dims[1:a]))
            axes.append(len(shape) - 1)
        shape += [self.groups, channels // self.groups]
        axes.append(len(shape) - 1)
        param_shape = (self.groups, channels // self.groups)
        if a < rank - 1:
            shape.append(math.prod(dims[a + 1 :]))
            axes.append(len(shape) - 1)
            param_shape += (1,)
        return shape, tuple(axes), param_shape

    def call(self, inputs, mask=None):
        shape, axes, param_shape = self._grouped_shape(inputs)
        grouped = ops.reshape(inputs, shape)
        rank = len(inputs.shape)
        if mask is not None and self._channel_axis != rank - 1:
            # Keras masks cover (batch, time); a channels-first input puts the
            # channels where the mask expects time.
            raise ValueError(
                "GroupNorm accepts a Keras mask only for channels-last inputs "
                f"(axis=-1). Received: axis={self.axis}"
            )
        stats_mask = None
        if self._stats_mask(mask, rank, range(1, rank)) is not None:
            # Channels-last view: (batch, spatial, groups, channels/group).
            stats_mask = ops.reshape(mask, (shape[0], -1, 1, 1))
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
            centred=False,
        )
        return ops.reshape(outputs, ops.shape(inputs))

    def get_config(self):
        return {**super().get_config(), "groups": self.groups, "axis": self.axis}
