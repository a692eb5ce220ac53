"""The four normalization layers over one shared core (`kerasnorm._core`), and
the `WeightNorm` wrapper."""

from kerasnorm.norms.group_norm import GroupNorm
from kerasnorm.norms.instance_norm import InstanceNorm
from kerasnorm.norms.layer_norm import LayerNorm
from kerasnorm.norms.rms_norm import RMSNorm
from kerasnorm.norms.weight_norm import WeightNorm

__all__ = ["GroupNorm", "InstanceNorm", "LayerNorm", "RMSNorm", "WeightNorm"]
