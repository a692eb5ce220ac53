"""kerasnorm: normalization layers for Keras 3 and TensorFlow.

The layers live in `kerasnorm.layers` and are re-exported here:

>>> import kerasnorm
>>> layer = kerasnorm.LayerNorm()
"""

from kerasnorm.layers import GroupNorm
from kerasnorm.layers import InstanceNorm
from kerasnorm.layers import LayerNorm
from kerasnorm.layers import RMSNorm

__version__ = "0.1.0"

__all__ = ["GroupNorm", "InstanceNorm", "LayerNorm", "RMSNorm", "__version__"]
