"""kerasnorm: normalization layers for Keras 3 and TensorFlow.

The layers live in `kerasnorm.layers` and are re-exported here:

>>> import kerasnorm
>>> layer = kerasnorm.LayerNorm()
"""

from kerasnorm.layers import GroupNorm
from kerasnorm.layers import InstanceNorm
from kerasnorm.layers import LayerNorm
from kerasnorm.layers import LayerNormGRU
from kerasnorm.layers import LayerNormGRUCell
from kerasnorm.layers import LayerNormLSTM
from kerasnorm.layers import LayerNormLSTMCell
from kerasnorm.layers import LayerNormSimpleRNN
from kerasnorm.layers import LayerNormSimpleRNNCell
from kerasnorm.layers import NormResidual
from kerasnorm.layers import RMSNorm
from kerasnorm.layers import TransformerDecoderBlock
from kerasnorm.layers import TransformerEncoderBlock
from kerasnorm.layers import WeightNorm
from kerasnorm.layers import deepnorm_constants

# The one place the version is written: the build reads this literal
# (pyproject.toml, [tool.setuptools.dynamic]).
__version__ = "0.1.0"

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
    "__version__",
    "deepnorm_constants",
]
