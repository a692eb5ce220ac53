import warnings

import keras

from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
from kerasnorm.norms._base import AxesNormBase


class LayerNormMixin(AxesNormBase):
    """`LayerNorm`'s arguments, weights and computation, over no Layer class
    (`kerasnorm.norms._base` says why)."""

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
        rms_scaling=False,
        **kwargs,
    ):
        self.rms_scaling = bool(rms_scaling)
        if self.rms_scaling:
            warnings.warn(
                "`rms_scaling=True` reproduces the option of Keras' "
                "LayerNormalization, which Keras deprecates: it divides the "
                "input by its standard deviation without subtracting the "
                "mean, not by its root mean square. For RMSNorm use "
                "`kerasnorm.RMSNorm`.",
                stacklevel=2,
            )
            # As in Keras: the gain only, whatever `center` and `scale` say.
            center, scale = False, True
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
        axes = self._param_axes(inputs.shape)
        inputs, stats_mask = self._apply_mask(inputs, mask, axes)
        mean, var = compute_stats(inputs, axes, mask=stats_mask)
        gamma, beta = self._affine(self._param_shape(rank, axes))
        return normalize(
            inputs,
            None if self.rms_scaling else mean,
            var,
            epsilon=self.epsilon,
            scale=gamma,
            bias=beta,
            dtype=self.compute_dtype,
        )

    def get_config(self):
        return {**super().get_config(), "rms_scaling": self.rms_scaling}


@keras.saving.register_keras_serializable(package="kerasnorm")
class LayerNorm(LayerNormMixin, keras.layers.Layer):
    """Layer normalization (Ba et al., 2016).

    Normalizes each example over `axis`, independently of the batch:

    ```python
    mean = mean(x, axis)
    var = mean(square(x - mean), axis)
    y = (x - mean) * rsqrt(var + epsilon) * gamma + beta
    ```

    Statistics are computed in float32 even for float16/bfloat16 inputs, and
    `gamma`/`beta` (shape: the sizes of `axis`) stay float32 under mixed
    precision. `axis` is resolved against the rank of each input, as in
    Keras' `LayerNormalization`: a layer built for `(batch, features)` and
    called on `(batch, time, features)` normalizes the features.

    A Keras mask passes through. It is applied to the statistics when `axis`
    includes a masked (time) axis; padded positions never reach the valid
    ones, whatever they hold (NaN and inf included), and padded outputs are
    those of a zero input.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> x = np.array([[1.0, 2.0, 3.0]], dtype="float32")
        >>> y = kerasnorm.LayerNorm()(x)
        >>> np.round(keras.ops.convert_to_numpy(y), 2)
        array([[-1.22,  0.  ,  1.22]], dtype=float32)

    Args:
        axis: int or list of ints, the axes to normalize over (and that carry
            `gamma`/`beta`). Defaults to `-1`.
        epsilon: small float added to the variance inside the square root.
            Defaults to `1e-5`.
        center: whether to add the learned bias `beta`. Defaults to `True`.
        scale: whether to multiply by the learned gain `gamma`. Defaults to
            `True`.
        beta_initializer: initializer for `beta`. Defaults to `"zeros"`.
        gamma_initializer: initializer for `gamma`. Defaults to `"ones"`.
        beta_regularizer: optional regularizer for `beta`. Defaults to `None`.
        gamma_regularizer: optional regularizer for `gamma`. Defaults to `None`.
        beta_constraint: optional constraint for `beta`. Defaults to `None`.
        gamma_constraint: optional constraint for `gamma`. Defaults to `None`.
        rms_scaling: Keras' `LayerNormalization` option, for code written
            against it: `y = x * rsqrt(var + epsilon) * gamma`, the variance
            still taken around the mean but the mean not subtracted, no
            `beta` (`center` and `scale` are then ignored). Keras deprecates
            it; it warns. For RMSNorm use `kerasnorm.RMSNorm`. Defaults to
            `False`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Reference:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450), Eq. 3.
    """
