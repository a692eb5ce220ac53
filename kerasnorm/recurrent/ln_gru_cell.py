import keras
from keras import ops

from kerasnorm.recurrent._base import LayerNormCellBase
from kerasnorm.recurrent._base import LayerNormCellMixin
from kerasnorm.recurrent._base import check_reset_after
from kerasnorm.recurrent._kernels import centre_columns
from kerasnorm.recurrent._kernels import project


class LayerNormGRUCellMixin(LayerNormCellMixin):
    """`LayerNormGRUCell`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.recurrent._base` says why)."""

    _gates = 3

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
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
        reset_after=True,
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
        self.reset_after = check_reset_after(reset_after)
        # Any value, as Keras takes any (its old configs hold 0): it changes
        # nothing here.
        self.implementation = implementation
        self.state_size = self.units

    def build(self, input_shape):
        self._build_kernels(input_shape)
        width = 3 * self.units
        self._norm_sizes = [2 * self.units, self.units]
        self.input_norm_gamma, self.input_norm_beta = self._build_norm(
            "input_norm_", width
        )
        self.recurrent_norm_gamma, self.recurrent_norm_beta = self._build_norm(
            "recurrent_norm_", width
        )

    def _split_norm(self, v, gamma, beta):
        """LN over the z/r part and over the candidate part separately, of a
        product with a `centre_columns` kernel."""
        two = 2 * self.units
        return (
            self._norm(v[..., :two], gamma[:two], beta[:two], zero_mean=True),
            self._norm(v[..., two:], gamma[two:], beta[two:], zero_mean=True),
        )

    def _input_norm(self, x, gamma, beta):
        if len(x.shape) == 3:
            return super()._input_norm(x, gamma, beta)
        return ops.concatenate(self._split_norm(x, gamma, beta), axis=-1)

    def project_inputs(self, inputs, training=False):
        kernel = centre_columns(self.kernel, self._norm_sizes)
        x = project(self._dropped_inputs(inputs, training), kernel)
        x = self._input_norm(x, self.input_norm_gamma, self.input_norm_beta)
        if self.bias is not None:
            x = x + self.bias
        return x

    def recurrent_weights(self):
        # The LN_h gains and biases are sliced once per call, not at every
        # step: without XLA each slice in the loop is an op per step, and
        # its gradient a full-width StridedSliceGrad per step.
        two = 2 * self.units
        gamma, beta = self.recurrent_norm_gamma, self.recurrent_norm_beta
        return (
            super().recurrent_weights(),
            (gamma[:two], beta[:two], gamma[two:], beta[two:]),
        )

    def step(self, projected, states, recurrent, training=False):
        h_tm1 = states[0] if isinstance(states, (list, tuple)) else states
        kernel, (gamma_zr, beta_zr, gamma_h, beta_h) = recurrent
        hu = ops.matmul(self._dropped_state(h_tm1, training), kernel)
        # `split`, not slicing: without XLA the gradient of a slice is a
        # StridedSliceGrad per step (zero fill and copy), that of a split
        # one concatenation.
        two = [2 * self.units]
        hu_zr, hu_h = ops.split(hu, two, axis=-1)
        x_zr, x_h = ops.split(projected, two, axis=-1)
        hu_zr = self._norm(hu_zr, gamma_zr, beta_zr, zero_mean=True)
        hu_h = self._norm(hu_h, gamma_h, beta_h, zero_mean=True)
        z, r = ops.split(self.recurrent_activation(x_zr + hu_zr), 2, axis=-1)
        candidate = self.activation(x_h + r * hu_h)
        h = z * h_tm1 + (1.0 - z) * candidate
        return h, ([h] if isinstance(states, (list, tuple)) else h)

    def get_config(self):
        return {
            **super().get_config(),
            "reset_after": self.reset_after,
            "implementation": self.implementation,
        }


@keras.saving.register_keras_serializable(package="kerasnorm")
class LayerNormGRUCell(LayerNormGRUCellMixin, LayerNormCellBase):
    """Layer-normalized GRU cell (Ba et al., 2016, supplementary Eqs. 24-25).

    One time step in Keras' GRU convention (gate order z, r, h; the reset gate
    applied after the recurrent product, Keras' `reset_after=True`; Keras' z is
    the paper's 1 - z). The update/reset pre-activations are normalized over
    their `2 * units` together, the candidate's halves over `units`:

    ```python
    xz, xr, xh = split(x @ kernel, 3); hz, hr, hh = split(h @ recurrent_kernel, 3)
    bz, br, bh = split(bias, 3)
    z, r = recurrent_activation(LN_x([xz, xr]) + LN_h([hz, hr]) + [bz, br])
    h_cand = activation(LN_x2(xh) + bh + r * LN_h2(hh))
    h = z * h + (1 - z) * h_cand
    ```

    `kernel` (input_dim, 3 * units) and `recurrent_kernel` (units, 3 * units)
    have the layout of `keras.layers.GRUCell`. `bias` is one `(3 * units,)`
    vector added to the input half (Keras' GRU has a `(2, 3 * units)` bias:
    its input row transfers; the recurrent row's role is taken by the LN
    biases). `input_norm_*` and `recurrent_norm_*` (size `3 * units`: the
    first `2 * units` belong to the z/r LN, the rest to the candidate LN) stay
    float32 under mixed precision.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> layer = keras.layers.RNN(kerasnorm.LayerNormGRUCell(8))
        >>> tuple(layer(np.zeros((2, 5, 3), "float32")).shape)
        (2, 8)

    Args:
        units: positive int, the size of the output and of the state.
        activation: activation of the candidate. Defaults to `"tanh"`.
        recurrent_activation: activation of the gates. Defaults to
            `"sigmoid"`.
        use_bias: whether to add `bias` to the input half. Defaults to `True`.
        kernel_initializer: initializer for `kernel`. Defaults to
            `"glorot_uniform"`.
        recurrent_initializer: initializer for `recurrent_kernel`. Defaults
            to `"orthogonal"`.
        bias_initializer: initializer for `bias`. Defaults to `"zeros"`.
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
        reset_after: must be `True` (Keras' default convention, which these
            equations follow: the reset gate multiplies the normalized
            recurrent product). `False` raises. Defaults to `True`.
        implementation: accepted, whatever its value, so that
            `keras.layers.GRUCell` configs and calls work unchanged (Keras
            takes any value too, and configs of older Keras versions hold
            `0`). In Keras `1` chooses many small matmuls over few large
            ones; here the input projection of every step is always one
            matmul, so it does not change the computation. Defaults to `2`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: a 2D tensor `(batch, features)`.
        states: the `(batch, units)` state `h` (or a list holding it).
        training: whether dropout is active. Defaults to `False`.

    Reference:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450), Eqs. 24-25.
    """
