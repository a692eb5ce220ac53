"""Public kerasnorm layers."""

from kerasnorm.layers.group_norm import GroupNorm
from kerasnorm.layers.instance_norm import InstanceNorm
from kerasnorm.layers.layer_norm import LayerNorm
from kerasnorm.layers.rms_norm import RMSNorm

__all__ = ["GroupNorm", "InstanceNorm", "LayerNorm", "RMSNorm"]
