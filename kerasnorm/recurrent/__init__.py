"""Layer-normalized recurrent cells and sequence layers (docs/design.md)."""

from kerasnorm.recurrent.ln_gru import LayerNormGRU
from kerasnorm.recurrent.ln_gru_cell import LayerNormGRUCell
from kerasnorm.recurrent.ln_lstm import LayerNormLSTM
from kerasnorm.recurrent.ln_lstm_cell import LayerNormLSTMCell
from kerasnorm.recurrent.ln_simple_rnn import LayerNormSimpleRNN
from kerasnorm.recurrent.ln_simple_rnn_cell import LayerNormSimpleRNNCell

__all__ = [
    "LayerNormGRU",
    "LayerNormGRUCell",
    "LayerNormLSTM",
    "LayerNormLSTMCell",
    "LayerNormSimpleRNN",
    "LayerNormSimpleRNNCell",
]
