import keras

from kerasnorm.recurrent._base import LayerNormRNNBase
from kerasnorm.recurrent._base import LayerNormRNNMixin
from kerasnorm.recurrent._base import cell_property
from kerasnorm.recurrent._base import check_use_cudnn
from kerasnorm.recurrent.ln_gru_cell import LayerNormGRUCell


class LayerNormGRUMixin(LayerNormRNNMixin):
    """`LayerNormGRU`'s arguments, weights and computation, over no
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
        reset_after=True,
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
            reset_after=reset_after,
            implementation=implementation,
            dtype=kwargs.get("dtype"),
            trainable=kwargs.get("trainable", True),
            name="ln_gru_cell",
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
    norm_epsilon = cell_property("norm_epsilon")
    reset_after = cell_property("reset_after")
    implementation = cell_property("implementation")
    dropout = cell_property("dropout")
    recurrent_dropout = cell_property("recurrent_dropout")


@keras.saving.register_keras_serializable(package="kerasnorm")
class LayerNormGRU(LayerNormGRUMixin, LayerNormRNNBase):
    """Layer-normalized GRU layer (Ba et al., 2016, supplementary Eqs. 24-25).

    Computes `kerasnorm.LayerNormGRUCell` over a sequence. The input half of
    every step (the projection, its two LNs and the bias) runs for all time
    steps at once before the time loop; the loop only runs the recurrent half:

    ```python
    p_t = [LN_x(x_t @ kernel[:, :2H]), LN_x2(x_t @ kernel[:, 2H:])] + bias
    # loop over t, with u = h @ recurrent_kernel:
    z, r = sigmoid(p_t[:, :2H] + LN_h(u[:, :2H]))
    h = z * h + (1 - z) * tanh(p_t[:, 2H:] + r * LN_h2(u[:, 2H:]))
    ```

    `kernel` and `recurrent_kernel` have the layout of `keras.layers.GRU`
    (gate order z, r, h; `reset_after=True`) and can be assigned directly.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> import kerasnorm
        >>> layer = kerasnorm.LayerNormGRU(8, return_sequences=True)
        >>> tuple(layer(np.zeros((2, 5, 3), "float32")).shape)
        (2, 5, 8)

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
        reset_after: must be `True` (Keras' default convention, which these
            equations follow: the reset gate multiplies the normalized
            recurrent product). `False` raises. Defaults to `True`.
        implementation: accepted, whatever its value, so that
            `keras.layers.GRU` configs and calls work unchanged (Keras
            takes any value too, and configs of older Keras versions hold
            `0`). In Keras `1` chooses many small matmuls over few large
            ones; here the input projection of every step is always one
            matmul, so it does not change the computation. Defaults to `2`.
        use_cudnn: `"auto"` or `False`, accepted so that `keras.layers.GRU`
            configs and calls work unchanged. No cuDNN kernel computes layer
            normalization, so it does not change the computation; `True`
            (which in Keras demands the cuDNN kernel) raises. Defaults to
            `"auto"`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        sequences: a 3D tensor `(batch, timesteps, features)`.
        initial_state: optional `(batch, units)` tensor (or a list of one).
        mask: optional boolean `(batch, timesteps)`; masked steps keep the
            previous state.
        training: whether dropout is active. Defaults to `False`.

    Reference:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450), Eqs. 24-25.
    """

    _cell_class = LayerNormGRUCell
