"""Public kerasnorm layers."""

from kerasnorm.blocks import NormResidual
from kerasnorm.blocks import TransformerDecoderBlock
from kerasnorm.blocks import TransformerEncoderBlock
from kerasnorm.blocks import deepnorm_constants
from kerasnorm.layers.group_norm import GroupNorm
from kerasnorm.layers.instance_norm import InstanceNorm
from kerasnorm.layers.layer_norm import LayerNorm
from kerasnorm.layers.rms_norm import RMSNorm
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
    "deepnorm_constants",
]
