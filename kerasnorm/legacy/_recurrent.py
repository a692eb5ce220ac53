"""The layer-normalized cells and sequence layers as `tf_keras` layers.

Each class is the mixin of the Keras 3 layer (`kerasnorm.recurrent`) over
`tf_keras`'s Layer or RNN; no math is repeated here. The sequence layers run
the mixins' `time_loop`, the same time loop as the Keras 3 layers (the input
projection hoisted out of it), from their own `call`.
"""

import tensorflow as tf
import tf_keras

from kerasnorm import recurrent
from kerasnorm._compat import set_tf_keras_dropout_generator
from kerasnorm._compat import tf_keras_dropout_rnn_cell_mixin
from kerasnorm.legacy._adapter import TfKerasAdapter
from kerasnorm.legacy._adapter import legacy_docstring
from kerasnorm.recurrent.ln_gru import LayerNormGRUMixin
from kerasnorm.recurrent.ln_gru_cell import LayerNormGRUCellMixin
from kerasnorm.recurrent.ln_lstm import LayerNormLSTMMixin
from kerasnorm.recurrent.ln_lstm_cell import LayerNormLSTMCellMixin
from kerasnorm.recurrent.ln_simple_rnn import LayerNormSimpleRNNMixin
from kerasnorm.recurrent.ln_simple_rnn_cell import LayerNormSimpleRNNCellMixin

_register = tf_keras.saving.register_keras_serializable(package="kerasnorm")
DropoutRNNCellMixin = tf_keras_dropout_rnn_cell_mixin()


class _OpSeedDropout:
    """What `tf_keras`'s dropout mixin draws masks from
    (`set_tf_keras_dropout_generator`): a stateful op seeded with the cell's
    `seed`, which holds no variable that a SavedModel would have to track."""

    def __init__(self, seed):
        self.seed = seed

    def dropout(self, inputs, rate):
        return tf.nn.dropout(inputs, rate, seed=self.seed)


class TfKerasCellAdapter(TfKerasAdapter):
    """What a cell mixin needs from `tf_keras`: Keras 3's dropout-mask and
    initial-state methods, over `tf_keras`'s `DropoutRNNCellMixin` (whose
    masks `tf_keras.layers.RNN` resets at each call)."""

    def _init_dropout_rng(self, seed):
        set_tf_keras_dropout_generator(self, _OpSeedDropout(seed))

    def get_dropout_mask(self, step_input):
        return self.get_dropout_mask_for_cell(step_input, training=True)

    def get_recurrent_dropout_mask(self, step_input):
        return self.get_recurrent_dropout_mask_for_cell(step_input, training=True)

    def get_initial_state(self, inputs=None, batch_size=None, dtype=None):
        return super().get_initial_state(batch_size)


class TfKerasRNNAdapter(TfKerasAdapter):
    """`call` of a sequence layer over `tf_keras.layers.RNN`: the initial
    state, dropout masks and stateful update around the mixin's
    `time_loop`, as `keras.layers.RNN.call` does them."""

    def call(self, inputs, mask=None, training=None, initial_state=None):
        # `tf_keras.layers.RNN.__call__` passes initial states given as
        # tensors after the sequence.
        if isinstance(inputs, (list, tuple)):
            inputs, initial_state = inputs[0], list(inputs[1:]) or None
        if initial_state is None:
            initial_state = (
                self.states if self.stateful else self.get_initial_state(inputs)
            )
        dtype = self.cell.compute_dtype
        initial_state = [tf.cast(s, dtype) for s in tf.nest.flatten(initial_state)]
        cell = self.cell
        cell.reset_dropout_mask()
        cell.reset_recurrent_dropout_mask()
        if training:
            # Drawn outside the time loop, so that every step reads the same
            # mask (one drawn inside would be drawn again at each step).
            cell.get_recurrent_dropout_mask(initial_state[0])
        last_output, outputs, states = self.time_loop(
            inputs, initial_state, mask, training=training
        )
        if self.stateful:
            for variable, state in zip(self.states, states, strict=True):
                variable.assign(tf.cast(state, variable.dtype))
        output = outputs if self.return_sequences else last_output
        return [output, *states] if self.return_state else output


_CELL_BASES = (DropoutRNNCellMixin, tf_keras.layers.Layer)


@_register
class LayerNormSimpleRNNCell(
    TfKerasCellAdapter, LayerNormSimpleRNNCellMixin, *_CELL_BASES
):
    __doc__ = legacy_docstring(recurrent.LayerNormSimpleRNNCell)


@_register
class LayerNormLSTMCell(TfKerasCellAdapter, LayerNormLSTMCellMixin, *_CELL_BASES):
    __doc__ = legacy_docstring(recurrent.LayerNormLSTMCell)


@_register
class LayerNormGRUCell(TfKerasCellAdapter, LayerNormGRUCellMixin, *_CELL_BASES):
    __doc__ = legacy_docstring(recurrent.LayerNormGRUCell)


@_register
class LayerNormSimpleRNN(
    TfKerasRNNAdapter, LayerNormSimpleRNNMixin, tf_keras.layers.RNN
):
    __doc__ = legacy_docstring(recurrent.LayerNormSimpleRNN)
    _cell_class = LayerNormSimpleRNNCell


@_register
class LayerNormLSTM(TfKerasRNNAdapter, LayerNormLSTMMixin, tf_keras.layers.RNN):
    __doc__ = legacy_docstring(recurrent.LayerNormLSTM)
    _cell_class = LayerNormLSTMCell


@_register
class LayerNormGRU(TfKerasRNNAdapter, LayerNormGRUMixin, tf_keras.layers.RNN):
    __doc__ = legacy_docstring(recurrent.LayerNormGRU)
    _cell_class = LayerNormGRUCell


# `tf_keras.layers.RNN` writes its cell with both its class name and its
# registered name, but reads an `.h5` file's by class name only: registered
# under it as well, a cell inside `tf_keras.layers.RNN` loads without
# `custom_objects`.
for _cell in (LayerNormSimpleRNNCell, LayerNormLSTMCell, LayerNormGRUCell):
    tf_keras.saving.get_custom_objects()[_cell.__name__] = _cell
