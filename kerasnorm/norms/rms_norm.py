import math
import numbers

import keras

from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
from kerasnorm.norms._base import AxesNormBase


def partial_units(partial, n):
    """k = ceil(partial * n), the units pRMSNorm takes its statistic over.

    The product is rounded to 6 decimals first so that, for example,
    `partial=0.1, n=30` gives 3 and not 4 from `0.1 * 30 = 3.0000000000000004`.
    """
    return max(1, math.ceil(round(partial * n, 6)))


class RMSNormMixin(AxesNormBase):
    """`RMSNorm`'s arguments, weights and computation, over no Layer class
    (`kerasnorm.norms._base` says why)."""

    def __init__(
        self,
        axis=-1,
        epsilon=1e-6,
        partial=1.0,
        scale=True,
        center=False,
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
        if (
            isinstance(partial, bool)
            or not isinstance(partial, numbers.Real)
            or not 0.0 < partial <= 1.0
        ):
            raise ValueError(
                f"`partial` must be a number in (0, 1]. Received: partial={partial!r}"
            )
        self.partial = float(partial)

    def _param_axes(self, input_shape):
        axes = super()._param_axes(input_shape)
        if self.partial < 1.0 and axes[-1] != len(input_shape) - 1:
            raise ValueError(
                "With `partial` < 1 the statistic is taken over the first "
                "units of the last axis, so `axis` must include the last "
                f"axis. Received: axis={self.axis}, partial={self.partial} "
                f"for input_shape={tuple(input_shape)}"
            )
        return axes

    def build(self, input_shape):
        super().build(input_shape)
        # With `partial` < 1 the last axis is always the last parameter axis.
        n = self._param_sizes[-1]
        k = partial_units(self.partial, n)
        self._units = k if k < n else None

    def call(self, inputs, mask=None):
        rank = len(inputs.shape)
        axes = self._param_axes(inputs.shape)
        inputs, stats_mask = self._apply_mask(inputs, mask, axes)
        if self._units is None:
            stats_input = inputs
        else:
            stats_input = inputs[..., : self._units]
            if stats_mask is not None:
                stats_mask = stats_mask[..., : self._units]
        _, var = compute_stats(stats_input, axes, use_mean=False, mask=stats_mask)
        gamma, beta = self._affine(self._param_shape(rank, axes))
        return normalize(
            inputs,
            None,
            var,
            epsilon=self.epsilon,
            scale=gamma,
            bias=beta,
            dtype=self.compute_dtype,
        )

    def get_config(self):
        return {**super().get_config(), "partial": self.partial}


@keras.saving.register_keras_serializable(package="kerasnorm")
class RMSNorm(RMSNormMixin, keras.layers.Layer):
    """Root-mean-square normalization, with partial RMSNorm (pRMSNorm).

    No mean is subtracted; the inputs are divided by their root mean square:

    ```python
    rms2 = mean(square(x[..., :k]), axis)     # k = ceil(partial * n)
    y = x * rsqrt(rms2 + epsilon) * gamma (+ beta if center)
    ```

    With `partial=1.0` (the default) the statistic covers every unit, which is
    plain RMSNorm. With `partial < 1`, only the first `k` units of the last axis
    enter the statistic, and that RMS then divides all `n` units (Zhang and
    Sennrich report that `partial=0.0625` still converges).

    `axis` is resolved against the rank of each input, as in Keras'
    `RMSNormalization`. A Keras mask is handled as in `kerasnorm.LayerNorm`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> x = np.ones((2, 4, 64), dtype="float32")
        >>> x[..., 4:] = 10.0  # outside the statistic's 4 units
        >>> y = kerasnorm.RMSNorm(partial=0.0625)(x)
        >>> keras.ops.convert_to_numpy(y)[0, 0, [0, 4]].round(3)
        array([ 1., 10.], dtype=float32)

    Args:
        axis: int or list of ints, the axes to normalize over (and that carry
            `gamma`/`beta`). With `partial < 1` it must include the last axis.
            Defaults to `-1`.
        epsilon: small float added to the mean square inside the square root.
            Defaults to `1e-6`.
        partial: fraction p in (0, 1] of the last axis' units the statistic is
            computed over (pRMSNorm). Defaults to `1.0`.
        scale: whether to multiply by the learned gain `gamma`. Defaults to
            `True`.
        center: whether to add a learned bias `beta`. Defaults to `False`.
        beta_initializer: initializer for `beta`. Defaults to `"zeros"`.
        gamma_initializer: initializer for `gamma`. Defaults to `"ones"`.
        beta_regularizer: optional regularizer for `beta`. Defaults to `None`.
        gamma_regularizer: optional regularizer for `gamma`. Defaults to `None`.
        beta_constraint: optional constraint for `beta`. Defaults to `None`.
        gamma_constraint: optional constraint for `gamma`. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Reference:
        - [Zhang and Sennrich, 2019](https://arxiv.org/abs/1910.07467).
    """
