"""Every kerasnorm layer and cell as a `tf_keras` layer.

Each class is the mixin of the Keras 3 layer (`kerasnorm.norms`,
`kerasnorm.recurrent`, `kerasnorm.blocks`) over `tf_keras`'s base class, with
the same constructor arguments, weights and outputs; no math is repeated.
"""

from kerasnorm.legacy._blocks import NormResidual
from kerasnorm.legacy._blocks import TransformerDecoderBlock
from kerasnorm.legacy._blocks import TransformerEncoderBlock
from kerasnorm.legacy._norms import GroupNorm
from kerasnorm.legacy._norms import InstanceNorm
from kerasnorm.legacy._norms import LayerNorm
from kerasnorm.legacy._norms import RMSNorm
from kerasnorm.legacy._norms import WeightNorm
from kerasnorm.legacy._recurrent import LayerNormGRU
from kerasnorm.legacy._recurrent import LayerNormGRUCell
from kerasnorm.legacy._recurrent import LayerNormLSTM
from kerasnorm.legacy._recurrent import LayerNormLSTMCell
from kerasnorm.legacy._recurrent import LayerNormSimpleRNN
from kerasnorm.legacy._recurrent import LayerNormSimpleRNNCell

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
]
