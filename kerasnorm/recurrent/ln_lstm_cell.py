import keras
from keras import ops

from kerasnorm.recurrent._base import LayerNormCellBase
from kerasnorm.recurrent._base import LayerNormCellMixin
from kerasnorm.recurrent._kernels import centre_columns
from kerasnorm.recurrent._kernels import project


class LayerNormLSTMCellMixin(LayerNormCellMixin):
    """`LayerNormLSTMCell`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.recurrent._base` says why)."""

    _gates = 4

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        unit_forget_bias=True,
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
        implementation=2,
        **kwargs,
    ):
        super().__init__(
            units,
            activation=activation,
            recurrent_activation=recurrent_activation,
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
        self.unit_forget_bias = bool(unit_forget_bias)
        # Any value, as Keras takes any (its old configs hold 0): it changes
        # nothing here.
        self.implementation = implementation
        self.state_size = [self.units, self.units]

    def build(self, input_shape):
        bias_initializer = None
        if self.unit_forget_bias:
            units, init = self.units, self.bias_initializer
            ones = self._framework.initializers.get("ones")

            def bias_initializer(_, *args, **kwargs):
                return ops.concatenate(
                    [
                        init((units,), *args, **kwargs),
                        ones((units,), *args, **kwargs),
                        init((2 * units,), *args, **kwargs),
                    ]
                )

        self._build_kernels(input_shape, bias_initializer)
        width = 4 * self.units
        self._norm_sizes = [width]
        self.input_norm_gamma, self.input_norm_beta = self._build_norm(
            "input_norm_", width
        )
        self.recurrent_norm_gamma, self.recurrent_norm_beta = self._build_norm(
            "recurrent_norm_", width
        )
        self.cell_norm_gamma, self.cell_norm_beta = self._build_norm(
            "cell_norm_", self.units
        )

    def project_inputs(self, inputs, training=False):
        kernel = centre_columns(self.kernel, self._norm_sizes)
        x = project(self._dropped_inputs(inputs, training), kernel)
        x = self._input_norm(x, self.input_norm_gamma, self.input_norm_beta)
        if self.bias is not None:
            x = x + self.bias
        return x

    def step(self, projected, states, recurrent, training=False):
        h_tm1, c_tm1 = states[0], states[1]
        hu = ops.matmul(self._dropped_state(h_tm1, training), recurrent)
        z = projected + self._norm(
            hu, self.recurrent_norm_gamma, self.recurrent_norm_beta, zero_mean=True
        )
        i, f, g, o = ops.split(z, 4, axis=-1)
        act, gate = self.activation, self.recurrent_activation
        c = gate(f) * c_tm1 + gate(i) * act(g)
        h = gate(o) * act(self._norm(c, self.cell_norm_gamma, self.cell_norm_beta))
        return h, [h, c]

    def get_config(self):
        return {
            **super().get_config(),
            "unit_forget_bias": self.unit_forget_bias,
            "implementation": self.implementation,
        }


@keras.saving.register_keras_serializable(package="kerasnorm")
class LayerNormLSTMCell(LayerNormLSTMCellMixin, LayerNormCellBase):
    """Layer-normalized LSTM cell (Ba et al., 2016, supplementary Eqs. 20-22).

    One time step, Keras gate order (i, f, c, o); each LN runs over all
    `4 * units` pre-activations together, and over the cell state before its
    activation. The state `c` itself is kept un-normalized:

    ```python
    z = LN_x(x @ kernel) + LN_h(h @ recurrent_kernel) + bias
    i, f, g, o = split(z, 4)
    c = recurrent_activation(f) * c + recurrent_activation(i) * activation(g)
    h = recurrent_activation(o) * activation(LN_c(c))
    ```

    `kernel` (input_dim, 4 * units), `recurrent_kernel` (units, 4 * units) and
    `bias` (4 * units,) have the layout of `keras.layers.LSTMCell`, so its
    weights can be assigned directly. The LN gains and biases
    (`input_norm_*` and `recurrent_norm_*` of size `4 * units`, `cell_norm_*`
    of size `units`) stay float32 under mixed precision.

    Use it in `keras.layers.RNN` or `keras.layers.StackedRNNCells`; for whole
    sequences `kerasnorm.LayerNormLSTM` is faster (it normalizes the input
    projection of every step before the time loop).

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> layer = keras.layers.RNN(kerasnorm.LayerNormLSTMCell(8))
        >>> tuple(layer(np.zeros((2, 5, 3), "float32")).shape)
        (2, 8)

    Args:
        units: positive int, the size of the output and of both states.
        activation: activation of the candidate and of the normalized cell
            state. Defaults to `"tanh"`.
        recurrent_activation: activation of the gates. Defaults to
            `"sigmoid"`.
        use_bias: whether to add `bias` after the normalizations. Defaults to
            `True`.
        kernel_initializer: initializer for `kernel`. Defaults to
            `"glorot_uniform"`.
        recurrent_initializer: initializer for `recurrent_kernel`. Defaults
            to `"orthogonal"`.
        bias_initializer: initializer for `bias`. Defaults to `"zeros"`.
        unit_forget_bias: whether to add 1 to the forget-gate bias at
            initialization (the rest comes from `bias_initializer`). Defaults
            to `True`.
        norm_gamma_initializer: initializer for the LN gains. Defaults to
            `"ones"`.
        norm_beta_initializer: initializer for the LN biases. Defaults to
            `"zeros"`.
        norm_epsilon: small float added to the variance inside the square
            root of every LN. Defaults to `1e-5`.
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
        implementation: accepted, whatever its value, so that
            `keras.layers.LSTMCell` configs and calls work unchanged (Keras
            takes any value too, and configs of older Keras versions hold
            `0`). In Keras `1` chooses many small matmuls over few large
            ones; here the input projection of every step is always one
            matmul, so it does not change the computation. Defaults to `2`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: a 2D tensor `(batch, features)`.
        states: list `[h, c]` of two `(batch, units)` tensors.
        training: whether dropout is active. Defaults to `False`.

    Reference:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450), Eqs. 20-22.
    """
