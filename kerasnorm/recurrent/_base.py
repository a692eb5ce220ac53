"""What the layer-normalized cells and sequence layers share.

A cell splits its step into the half that depends only on the input,
`project_inputs` (the projection W_x x_t and, where the cell's equations allow
it, its normalization; docs/design.md), and the half that needs the previous
state, `step`. A cell's `call` runs both for one time step, so the cells work
in `keras.layers.RNN`.
The sequence layers run `project_inputs` once over every time step (one large
matmul and one LN over all steps) and keep only `step` inside the time loop.

As in `kerasnorm.norms._base`, every cell and sequence layer is a mixin over
no Layer class, holding its arguments, weights and computation, and thin
classes put it over Keras 3 (`LayerNormCellBase`, `LayerNormRNNBase`) or over
`tf_keras` (`kerasnorm.legacy.layers`). The mixins reach what differs between
the two Keras generations through `_framework` (the `keras` module or
`tf_keras`) and a few hooks the thin classes implement (the dropout random
generator); the math is `keras.ops` and Keras 3's backend `rnn`, which run on
the TensorFlow tensors a `tf_keras` layer is called with.
"""

import keras
from keras import ops
from keras import tree

# `keras.layers.RNN` creates the dropout masks before its time loop only for
# cells that inherit this mixin (keras >=3.15,<3.16 is pinned in
# pyproject.toml).
from kerasnorm._compat import DropoutRNNCell
from kerasnorm._compat import KerasRNNInnerLoop
from kerasnorm._compat import backend_rnn
from kerasnorm._core import check_choice
from kerasnorm._core import check_epsilon
from kerasnorm._core import check_positive_int
from kerasnorm._core import check_rate
from kerasnorm.recurrent._kernels import centre_columns
from kerasnorm.recurrent._kernels import keep_only_matmuls
from kerasnorm.recurrent._kernels import layer_norm
from kerasnorm.recurrent._kernels import sequence_layer_norm


def check_reset_after(reset_after):
    """`reset_after` of a GRU: only Keras' default, `True`, is what LN-GRU
    computes (the reset gate multiplies the normalized recurrent product)."""
    if reset_after is not True:
        raise ValueError(
            "`reset_after` must be True: the layer-normalized GRU applies the "
            "reset gate after the recurrent product (Keras' default); the "
            f"reset_after=False variant is not implemented. "
            f"Received: reset_after={reset_after!r}"
        )
    return reset_after


def check_use_cudnn(use_cudnn):
    """`use_cudnn` of a Keras LSTM/GRU: `"auto"` and `False` mean the same
    here; `True` demands a cuDNN kernel, and none computes an LN."""
    check_choice(use_cudnn, ("auto", True, False), "use_cudnn")
    if use_cudnn is True:
        raise ValueError(
            "`use_cudnn=True` asks for cuDNN's fused kernel, which has no "
            "layer normalization; this layer always runs its own time loop. "
            "Pass use_cudnn='auto' or False. Received: use_cudnn=True"
        )
    return use_cudnn


# The arguments of every cell that name a Keras object, and the module of
# `_framework` that resolves and serializes each.
_OBJECT_MODULES = {
    "activation": "activations",
    "kernel_initializer": "initializers",
    "recurrent_initializer": "initializers",
    "bias_initializer": "initializers",
    "norm_gamma_initializer": "initializers",
    "norm_beta_initializer": "initializers",
    "kernel_regularizer": "regularizers",
    "recurrent_regularizer": "regularizers",
    "bias_regularizer": "regularizers",
    "kernel_constraint": "constraints",
    "recurrent_constraint": "constraints",
    "bias_constraint": "constraints",
    "norm_gamma_regularizer": "regularizers",
    "norm_beta_regularizer": "regularizers",
    "norm_gamma_constraint": "constraints",
    "norm_beta_constraint": "constraints",
}


class LayerNormCellMixin:
    """Options, weights and config shared by the layer-normalized cells.

    Subclasses set `_gates` (G: 1, 3 or 4), set `_norm_sizes` (the column
    groups each normalized on their own) in `build`, and implement
    `project_inputs` and `step`. The Layer class under the mixin implements
    `_init_dropout_rng(seed)`, `get_dropout_mask(step_input)` and
    `get_recurrent_dropout_mask(step_input)`.
    """

    _gates = 1
    # The Keras generation the layer is built on (see the module docstring).
    _framework = keras

    def __init__(self, units, **options):
        # The public classes write out (and document) every argument with its
        # default and pass them all on; the objects among them are resolved
        # with the module `_OBJECT_MODULES` names, as `get_config` serializes
        # them.
        fw = self._framework
        objects = {name: options.pop(name) for name in _OBJECT_MODULES}
        recurrent_activation = options.pop("recurrent_activation", None)
        use_bias = options.pop("use_bias")
        norm_epsilon = options.pop("norm_epsilon")
        dropout = options.pop("dropout")
        recurrent_dropout = options.pop("recurrent_dropout")
        seed = options.pop("seed")
        super().__init__(**options)
        self.units = check_positive_int(units, "units")
        for name, module in _OBJECT_MODULES.items():
            setattr(self, name, getattr(fw, module).get(objects[name]))
        self.recurrent_activation = (
            None
            if recurrent_activation is None
            else fw.activations.get(recurrent_activation)
        )
        self.use_bias = bool(use_bias)
        self.norm_epsilon = check_epsilon(norm_epsilon, "norm_epsilon")
        self.dropout = check_rate(dropout, "dropout")
        self.recurrent_dropout = check_rate(recurrent_dropout, "recurrent_dropout")
        self.seed = seed
        self._init_dropout_rng(seed)
        self.output_size = self.units

    def _build_kernels(self, input_shape, bias_initializer=None):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError(
                "The last dimension of the inputs must be defined. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        width = self._gates * self.units
        self.kernel = self.add_weight(
            name="kernel",
            shape=(int(input_dim), width),
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        self.recurrent_kernel = self.add_weight(
            name="recurrent_kernel",
            shape=(self.units, width),
            initializer=self.recurrent_initializer,
            regularizer=self.recurrent_regularizer,
            constraint=self.recurrent_constraint,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(width,),
                initializer=bias_initializer or self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )

    def _build_norm(self, prefix, size):
        """float32 (under mixed precision) gain and bias of one LN."""
        gamma = self.add_weight(
            name=f"{prefix}gamma",
            shape=(size,),
            initializer=self.norm_gamma_initializer,
            regularizer=self.norm_gamma_regularizer,
            constraint=self.norm_gamma_constraint,
            autocast=False,
        )
        beta = self.add_weight(
            name=f"{prefix}beta",
            shape=(size,),
            initializer=self.norm_beta_initializer,
            regularizer=self.norm_beta_regularizer,
            constraint=self.norm_beta_constraint,
            autocast=False,
        )
        return gamma, beta

    def _dropped_inputs(self, inputs, training):
        """Inputs times the dropout mask; the same mask at every time step."""
        if not (training and self.dropout > 0.0):
            return inputs
        # (time, batch, features) inputs broadcast against the (batch,
        # features) mask as they are.
        step_input = inputs if len(inputs.shape) == 2 else inputs[0]
        return inputs * self.get_dropout_mask(step_input)

    def _dropped_state(self, h, training):
        if not (training and self.recurrent_dropout > 0.0):
            return h
        return h * self.get_recurrent_dropout_mask(h)

    def _norm(self, x, gamma, beta, zero_mean=False):
        return layer_norm(
            x, gamma, beta, self.norm_epsilon, self.compute_dtype, zero_mean=zero_mean
        )

    def _input_norm(self, x, gamma, beta):
        """LN of the input projection `x` (made with a `centre_columns`
        kernel) over each group of `_norm_sizes` columns: one time step, or
        every step at once before the loop."""
        if len(x.shape) == 3:
            return sequence_layer_norm(
                x, gamma, beta, self.norm_epsilon, self.compute_dtype, self._norm_sizes
            )
        return self._norm(x, gamma, beta, zero_mean=True)

    def project_inputs(self, inputs, training=False):
        """The input half of the step, for one step `(batch, features)` or a
        time-major sequence `(time, batch, features)`."""
        raise NotImplementedError

    def recurrent_weights(self):
        """What `step` multiplies the state with, prepared once per call."""
        return centre_columns(self.recurrent_kernel, self._norm_sizes)

    def step(self, projected, states, recurrent, training=False):
        """The recurrent half: `(output, new_states)` from the input half and
        `recurrent_weights()`."""
        raise NotImplementedError

    def call(self, inputs, states, training=False):
        return self.step(
            self.project_inputs(inputs, training),
            states,
            self.recurrent_weights(),
            training,
        )

    def get_initial_state(self, batch_size=None):
        sizes = self.state_size if isinstance(self.state_size, list) else [self.units]
        return [ops.zeros((batch_size, d), dtype=self.compute_dtype) for d in sizes]

    def get_config(self):
        fw = self._framework
        config = {
            "units": self.units,
            "use_bias": self.use_bias,
            "norm_epsilon": self.norm_epsilon,
            "dropout": self.dropout,
            "recurrent_dropout": self.recurrent_dropout,
            "seed": self.seed,
            **{
                name: getattr(fw, module).serialize(getattr(self, name))
                for name, module in _OBJECT_MODULES.items()
            },
        }
        if self.recurrent_activation is not None:
            config["recurrent_activation"] = fw.activations.serialize(
                self.recurrent_activation
            )
        return {**super().get_config(), **config}


class LayerNormCellBase(LayerNormCellMixin, keras.layers.Layer, DropoutRNNCell):
    """A layer-normalized cell over `keras.layers.Layer`.

    `keras.layers.RNN` creates the dropout masks before its time loop only for
    cells that inherit `DropoutRNNCell`, which draws them from
    `seed_generator`.
    """

    def _init_dropout_rng(self, seed):
        self.seed_generator = keras.random.SeedGenerator(seed=seed)


def cell_property(name):
    """A read-only property of a sequence layer that reads its cell's `name`."""
    return property(lambda self: getattr(self.cell, name), doc=f"The cell's `{name}`.")


class LayerNormRNNMixin:
    """The time loop of the sequence layers, over no RNN class: only the
    recurrent half of each step runs inside it.

    The input half (`cell.project_inputs`) runs once over the whole sequence
    before the loop. `keras.layers.RNN.call` runs `time_loop` through its
    undocumented `inner_loop` hook (`kerasnorm._compat.KerasRNNInnerLoop`;
    masking, `go_backwards`, `unroll`, `stateful` and initial states are
    `keras.layers.RNN`'s); the `tf_keras` classes call it from their `call`.
    The loop is Keras' backend `rnn`.
    """

    _framework = keras
    # The class of the cell the layer builds from its arguments.
    _cell_class = None

    def time_loop(self, sequences, initial_state, mask, training=False):
        if tree.is_nested(mask):
            mask = mask[0]
        cell = self.cell
        # Time-major from the start: transposing the (batch, time, features)
        # input is cheaper than transposing its G-times wider projection, and
        # reversing it (go_backwards) likewise.
        if mask is not None:
            # Padded steps may hold anything (NaN, inf). The input half runs
            # over every step before the loop, whose `where` only selects the
            # padded results away: the forward pass is clean, but the backward
            # pass multiplies their zero cotangents with NaN (nan * 0 = NaN)
            # in the projection's weight gradient. Zeroing the padding before
            # the projection keeps it out of both; multiplying by the mask
            # would not.
            mask = ops.cast(mask, "bool")
            sequences = ops.where(
                mask[:, :, None], sequences, ops.zeros_like(sequences)
            )
            mask = ops.transpose(mask, (1, 0))
        sequences = ops.transpose(sequences, (1, 0, 2))
        if self.go_backwards:
            sequences = ops.flip(sequences, axis=0)
            if mask is not None:
                mask = ops.flip(mask, axis=0)
        projected = cell.project_inputs(sequences, training)
        recurrent = cell.recurrent_weights()

        def step(inputs, states):
            output, new_states = cell.step(inputs, states, recurrent, training)
            if not tree.is_nested(new_states):
                new_states = [new_states]
            # Off TensorFlow, Keras' activations compute float64 in float32
            # (its type promotion maps float64 to float32), and `lax.scan`
            # refuses a carry whose dtype changes between steps.
            new_states = [
                ops.cast(new, old.dtype)
                for new, old in zip(new_states, states, strict=True)
            ]
            return ops.cast(output, new_states[0].dtype), new_states

        step = keep_only_matmuls(step)
        if not tree.is_nested(initial_state):
            initial_state = [initial_state]
        last_output, outputs, states = backend_rnn(
            step,
            projected,
            initial_state,
            mask=mask,
            unroll=self.unroll,
            input_length=_time_steps(sequences),
            time_major=True,
            zero_output_for_mask=self.zero_output_for_mask,
            return_all_outputs=self.return_sequences,
        )
        return last_output, ops.transpose(outputs, (1, 0, 2)), states

    def get_config(self):
        config = super().get_config()
        del config["cell"]
        config["activity_regularizer"] = self._framework.regularizers.serialize(
            self.activity_regularizer
        )
        cell_config = self.cell.get_config()
        base_keys = self._framework.layers.Layer.get_config(self.cell)
        for key, value in cell_config.items():
            if key not in base_keys:
                config[key] = value
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


def _time_steps(sequences):
    """The `input_length` of a time-major `sequences` for Keras' `rnn`.

    Keras' TensorFlow loop takes `input_length or inputs.shape[1]` as its
    iteration bound: for a time-major input with an undefined time axis that
    is the batch size, and a graph traced at a fixed batch (a `.tflite` file
    at batch 1 with any sequence length) ran that many steps only. The time
    axis's size as a tensor inside a list (the bound is its `reduce_max`;
    a bare tensor cannot be tested for truth in a graph) keeps the loop
    over every step."""
    steps = sequences.shape[0]
    if steps is None:
        return [ops.shape(sequences)[0]]
    return steps


class LayerNormRNNBase(LayerNormRNNMixin, KerasRNNInnerLoop, keras.layers.RNN):
    """A layer-normalized sequence layer over `keras.layers.RNN`."""

    def __init__(self, cell, **kwargs):
        super().__init__(cell, **kwargs)
        self.input_spec = keras.layers.InputSpec(ndim=3)

    def call(self, sequences, initial_state=None, mask=None, training=False):
        return super().call(
            sequences, initial_state=initial_state, mask=mask, training=training
        )
