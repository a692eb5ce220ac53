import keras

from kerasnorm.recurrent._base import LayerNormRNNBase
from kerasnorm.recurrent._base import LayerNormRNNMixin
from kerasnorm.recurrent._base import cell_property
from kerasnorm.recurrent._base import check_use_cudnn
from kerasnorm.recurrent.ln_lstm_cell import LayerNormLSTMCell


class LayerNormLSTMMixin(LayerNormRNNMixin):
    """`LayerNormLSTM`'s arguments, weights and computation, over no
    Layer class (`kerasnorm.recurrent._base` says why)."""

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
        implementation=2,
        use_cudnn="auto",
        **kwargs,
    ):
        check_use_cudnn(use_cudnn)
        cell = self._cell_class(
            units,
            activation=activation,
            recurrent_activation=recurrent_activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            recurrent_initializer=recurrent_initializer,
            bias_initializer=bias_initializer,
            unit_forget_bias=unit_forget_bias,
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
            implementation=implementation,
            dtype=kwargs.get("dtype"),
            trainable=kwargs.get("trainable", True),
            name="ln_lstm_cell",
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
        self.use_cudnn = use_cudnn

    def get_config(self):
        return {**super().get_config(), "use_cudnn": self.use_cudnn}

    units = cell_property("units")
    activation = cell_property("activation")
    recurrent_activation = cell_property("recurrent_activation")
    use_bias = cell_property("use_bias")
    unit_forget_bias = cell_property("unit_forget_bias")
    implementation = cell_property("implementation")
    norm_epsilon = cell_property("norm_epsilon")
    dropout = cell_property("dropout")
    recurrent_dropout = cell_property("recurrent_dropout")


@keras.saving.register_keras_serializable(package="kerasnorm")
class LayerNormLSTM(LayerNormLSTMMixin, LayerNormRNNBase):
    """Layer-normalized LSTM layer (Ba et al., 2016, supplementary Eqs. 20-22).

    Computes `kerasnorm.LayerNormLSTMCell` over a sequence. The input half of
    every step, `LN_x(x_t @ kernel) + bias`, does not depend on the state, so
    it runs for all time steps at once before the time loop (one large
    matmul); the loop only runs the recurrent half:

    ```python
    z_t = LN_x(x_t @ kernel) + bias          # all t at once
    # loop over t:
    i, f, g, o = split(z_t + LN_h(h @ recurrent_kernel), 4)
    c = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h = sigmoid(o) * tanh(LN_c(c))
    ```

    The weights have the layout of `keras.layers.LSTM` (gate order i, f, c, o),
    so a trained Keras LSTM's kernels can be assigned directly:

    ```python
    ln = kerasnorm.LayerNormLSTM(lstm.units)
    ln.build(input_shape)
    for name in ("kernel", "recurrent_kernel", "bias"):
        getattr(ln.cell, name).assign(getattr(lstm.cell, name))
    ```

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> layer = kerasnorm.LayerNormLSTM(8, return_sequences=True)
        >>> tuple(layer(np.zeros((2, 5, 3), "float32")).shape)
        (2, 5, 8)

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
        return_state: whether to also return the final `h` and `c`. Defaults
            to `False`.
        go_backwards: whether to process the sequence backwards (and return
            the reversed sequence). Defaults to `False`.
        stateful: whether the final states of a batch are the initial states
            of the next one. Defaults to `False`.
        unroll: whether to unroll the time loop (fixed, short sequences).
            Defaults to `False`.
        implementation: accepted, whatever its value, so that
            `keras.layers.LSTM` configs and calls work unchanged (Keras
            takes any value too, and configs of older Keras versions hold
            `0`). In Keras `1` chooses many small matmuls over few large
            ones; here the input projection of every step is always one
            matmul, so it does not change the computation. Defaults to `2`.
        use_cudnn: `"auto"` or `False`, accepted so that `keras.layers.LSTM`
            configs and calls work unchanged. No cuDNN kernel computes layer
            normalization, so it does not change the computation; `True`
            (which in Keras demands the cuDNN kernel) raises. Defaults to
            `"auto"`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        sequences: a 3D tensor `(batch, timesteps, features)`.
        initial_state: optional list `[h, c]` of `(batch, units)` tensors.
        mask: optional boolean `(batch, timesteps)`; masked steps keep the
            previous state.
        training: whether dropout is active. Defaults to `False`.

    Reference:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450), Eqs. 20-22.
    """

    _cell_class = LayerNormLSTMCell
