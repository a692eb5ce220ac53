"""Public kerasnorm layers: one façade over `norms`, `recurrent` and `blocks`.

Nothing inside the package imports this module; it only re-exports.
"""

from kerasnorm.blocks import NormResidual
from kerasnorm.blocks import TransformerDecoderBlock
from kerasnorm.blocks import TransformerEncoderBlock
from kerasnorm.blocks import deepnorm_constants
from kerasnorm.norms import GroupNorm
from kerasnorm.norms import InstanceNorm
from kerasnorm.norms import LayerNorm
from kerasnorm.norms import RMSNorm
from kerasnorm.norms import WeightNorm
from kerasnorm.recurrent import LayerNormGRU
from kerasnorm.recurrent import LayerNormGRUCell
from kerasnorm.recurrent import LayerNormLSTM
from kerasnorm.recurrent import LayerNormLSTMCell
from kerasnorm.recurrent import LayerNormSimpleRNN
from kerasnorm.recurrent import LayerNormSimpleRNNCell

__all__ = [
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "LayerNormGRU",
    "LayerNormGRUCell",
    "LayerNormLSTM",
    "LayerNormLSTMCell",
    "LayerNormSimpleRNN",
    "LayerNormSimpleRNNCell",
    "NormResidual",
    "RMSNorm",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "WeightNorm",
    "deepnorm_constants",
]
