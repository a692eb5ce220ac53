import keras

from kerasnorm.recurrent._base import LayerNormRNNBase
from kerasnorm.recurrent._base import LayerNormRNNMixin
from kerasnorm.recurrent._base import cell_property
from kerasnorm.recurrent.ln_simple_rnn_cell import LayerNormSimpleRNNCell


class LayerNormSimpleRNNMixin(LayerNormRNNMixin):
    """`LayerNormSimpleRNN`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.recurrent._base` says why)."""

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
        activity_regularizer=None,
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
        return_sequences=False,
        return_state=False,
        go_backwards=False,
        stateful=False,
        unroll=False,
        **kwargs,
    ):
        cell = self._cell_class(
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
            dtype=kwargs.get("dtype"),
            trainable=kwargs.get("trainable", True),
            name="ln_simple_rnn_cell",
        )
        super().__init__(
            cell,
            return_sequences=return_sequences,
            return_state=return_state,
            go_backwards=go_backwards,
            stateful=stateful,
            unroll=unroll,
            activity_regularizer=activity_regularizer,
            **kwargs,
        )

    units = cell_property("units")
    activation = cell_property("activation")
    use_bias = cell_property("use_bias")
    norm_epsilon = cell_property("norm_epsilon")
    dropout = cell_property("dropout")
    recurrent_dropout = cell_property("recurrent_dropout")


@keras.saving.register_keras_serializable(package="kerasnorm")
class LayerNormSimpleRNN(LayerNormSimpleRNNMixin, LayerNormRNNBase):
    """Layer-normalized simple RNN layer (Ba et al., 2016, Eq. 4).

    Computes `kerasnorm.LayerNormSimpleRNNCell` over a sequence:

    ```python
    p_t = x_t @ kernel                       # all t at once
    # loop over t:
    h = tanh(LN(p_t + h @ recurrent_kernel) + bias)
    ```

    The LN runs over the sum of the input and recurrent terms, so only the
    input projection leaves the time loop. `kernel`, `recurrent_kernel` and
    `bias` have the layout of `keras.layers.SimpleRNN`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> layer = kerasnorm.LayerNormSimpleRNN(8, return_sequences=True)
        >>> tuple(layer(np.zeros((2, 5, 3), "float32")).shape)
        (2, 5, 8)

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
        activity_regularizer: optional regularizer for the output. Defaults
            to `None`.
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
        return_sequences: whether to return the output of every step.
            Defaults to `False`.
        return_state: whether to also return the final `h`. Defaults to
            `False`.
        go_backwards: whether to process the sequence backwards (and return
            the reversed sequence). Defaults to `False`.
        stateful: whether the final state of a batch is the initial state of
            the next one. Defaults to `False`.
        unroll: whether to unroll the time loop (fixed, short sequences).
            Defaults to `False`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        sequences: a 3D tensor `(batch, timesteps, features)`.
        initial_state: optional `(batch, units)` tensor (or a list of one).
        mask: optional boolean `(batch, timesteps)`; masked steps keep the
            previous state.
        training: whether dropout is active. Defaults to `False`.

    Reference:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450), Eq. 4.
    """

    _cell_class = LayerNormSimpleRNNCell
