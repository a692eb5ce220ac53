import keras
from keras import ops

from kerasnorm.recurrent._base import LayerNormCellBase
from kerasnorm.recurrent._base import LayerNormCellMixin
from kerasnorm.recurrent._kernels import centre_columns
from kerasnorm.recurrent._kernels import project


class LayerNormSimpleRNNCellMixin(LayerNormCellMixin):
    """`LayerNormSimpleRNNCell`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.recurrent._base` says why)."""

    _gates = 1

    def __init__(
        self,
        units,
        activation="tanh",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        norm_gamma_initializer="ones",
        norm_beta_initializer="zeros",
        norm_epsilon=1e-5,
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        norm_gamma_regularizer=None,
        norm_beta_regularizer=None,
        norm_gamma_constraint=None,
        norm_beta_constraint=None,
        dropout=0.0,
        recurrent_dropout=0.0,
        seed=None,
        **kwargs,
    ):
        super().__init__(
            units,
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            recurrent_initializer=recurrent_initializer,
            bias_initializer=bias_initializer,
            norm_gamma_initializer=norm_gamma_initializer,
            norm_beta_initializer=norm_beta_initializer,
            norm_epsilon=norm_epsilon,
            kernel_regularizer=kernel_regularizer,
            recurrent_regularizer=recurrent_regularizer,
            bias_regularizer=bias_regularizer,
            kernel_constraint=kernel_constraint,
            recurrent_constraint=recurrent_constraint,
            bias_constraint=bias_constraint,
            norm_gamma_regularizer=norm_gamma_regularizer,
            norm_beta_regularizer=norm_beta_regularizer,
            norm_gamma_constraint=norm_gamma_constraint,
            norm_beta_constraint=norm_beta_constraint,
            dropout=dropout,
            recurrent_dropout=recurrent_dropout,
            seed=seed,
            **kwargs,
        )
        self.state_size = self.units

    def build(self, input_shape):
        self._build_kernels(input_shape)
        self._norm_sizes = [self.units]
        self.norm_gamma, self.norm_beta = self._build_norm("norm_", self.units)

    def project_inputs(self, inputs, training=False):
        # The LN runs over the sum with the recurrent term (Eq. 4), so only
        # the projection can leave the time loop. Both kernels are centred, so
        # the sum is too.
        kernel = centre_columns(self.kernel, self._norm_sizes)
        return project(self._dropped_inputs(inputs, training), kernel)

    def step(self, projected, states, recurrent, training=False):
        h_tm1 = states[0] if isinstance(states, (list, tuple)) else states
        a = projected + ops.matmul(self._dropped_state(h_tm1, training), recurrent)
        a = self._norm(a, self.norm_gamma, self.norm_beta, zero_mean=True)
        if self.bias is not None:
            a = a + self.bias
        h = self.activation(a)
        return h, ([h] if isinstance(states, (list, tuple)) else h)


@keras.saving.register_keras_serializable(package="kerasnorm")
class LayerNormSimpleRNNCell(LayerNormSimpleRNNCellMixin, LayerNormCellBase):
    """Layer-normalized simple RNN cell (Ba et al., 2016, Eq. 4).

    One time step; the LN runs over the summed pre-activation:

    ```python
    a = x @ kernel + h @ recurrent_kernel
    h = activation(LN(a) + bias)
    ```

    `kernel` (input_dim, units), `recurrent_kernel` (units, units) and `bias`
    (units,) have the layout of `keras.layers.SimpleRNNCell`. The LN gain and
    bias (`norm_gamma`, `norm_beta`) stay float32 under mixed precision.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> layer = keras.layers.RNN(kerasnorm.LayerNormSimpleRNNCell(8))
        >>> tuple(layer(np.zeros((2, 5, 3), "float32")).shape)
        (2, 8)

    Args:
        units: positive int, the size of the output and of the state.
        activation: activation of the output. Defaults to `"tanh"`.
        use_bias: whether to add `bias` after the LN. Defaults to `True`.
        kernel_initializer: initializer for `kernel`. Defaults to
            `"glorot_uniform"`.
        recurrent_initializer: initializer for `recurrent_kernel`. Defaults
            to `"orthogonal"`.
        bias_initializer: initializer for `bias`. Defaults to `"zeros"`.
        norm_gamma_initializer: initializer for the LN gain. Defaults to
            `"ones"`.
        norm_beta_initializer: initializer for the LN bias. Defaults to
            `"zeros"`.
        norm_epsilon: small float added to the variance inside the square
            root. Defaults to `1e-5`.
        kernel_regularizer: optional regularizer for `kernel`. Defaults to
            `None`.
        recurrent_regularizer: optional regularizer for `recurrent_kernel`.
            Defaults to `None`.
        bias_regularizer: optional regularizer for `bias`. Defaults to `None`.
        kernel_constraint: optional constraint for `kernel`. Defaults to
            `None`.
        recurrent_constraint: optional constraint for `recurrent_kernel`.
            Defaults to `None`.
        bias_constraint: optional constraint for `bias`. Defaults to `None`.
        norm_gamma_regularizer: optional regularizer for the LN gains.
            Defaults to `None`.
        norm_beta_regularizer: optional regularizer for the LN biases.
            Defaults to `None`.
        norm_gamma_constraint: optional constraint for the LN gains. Defaults
            to `None`.
        norm_beta_constraint: optional constraint for the LN biases. Defaults
            to `None`.
        dropout: fraction in [0, 1) of the inputs dropped in training (one
            mask for the whole sequence). Defaults to `0.0`.
        recurrent_dropout: fraction in [0, 1) of `h` dropped before the
            recurrent projection in training. Defaults to `0.0`.
        seed: optional int, the dropout seed. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: a 2D tensor `(batch, features)`.
        states: the `(batch, units)` state `h` (or a list holding it).
        training: whether dropout is active. Defaults to `False`.

    Reference:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450), Eq. 4.
    """
