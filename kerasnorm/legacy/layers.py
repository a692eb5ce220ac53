"""Every kerasnorm layer and cell as a `tf_keras` layer.

Each class is the mixin of the Keras 3 layer (`kerasnorm.norms`,
`kerasnorm.recurrent`, `kerasnorm.blocks`) over `tf_keras`'s base class; no
math is repeated here. The normalization layers are defined in this module,
the others in private modules of this package.
"""

import tf_keras

from kerasnorm import norms
from kerasnorm.legacy._adapter import TfKerasAdapter
from kerasnorm.legacy._adapter import legacy_docstring
from kerasnorm.legacy._recurrent import LayerNormGRU
from kerasnorm.legacy._recurrent import LayerNormGRUCell
from kerasnorm.legacy._recurrent import LayerNormLSTM
from kerasnorm.legacy._recurrent import LayerNormLSTMCell
from kerasnorm.legacy._recurrent import LayerNormSimpleRNN
from kerasnorm.legacy._recurrent import LayerNormSimpleRNNCell
from kerasnorm.norms.group_norm import GroupNormMixin
from kerasnorm.norms.instance_norm import InstanceNormMixin
from kerasnorm.norms.layer_norm import LayerNormMixin
from kerasnorm.norms.rms_norm import RMSNormMixin

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
    "RMSNorm",
]

_register = tf_keras.saving.register_keras_serializable(package="kerasnorm")


@_register
class LayerNorm(TfKerasAdapter, LayerNormMixin, tf_keras.layers.Layer):
    __doc__ = legacy_docstring(norms.LayerNorm)


@_register
class RMSNorm(TfKerasAdapter, RMSNormMixin, tf_keras.layers.Layer):
    __doc__ = legacy_docstring(norms.RMSNorm)


@_register
class GroupNorm(TfKerasAdapter, GroupNormMixin, tf_keras.layers.Layer):
    __doc__ = legacy_docstring(norms.GroupNorm)


@_register
class InstanceNorm(TfKerasAdapter, InstanceNormMixin, tf_keras.layers.Layer):
    __doc__ = legacy_docstring(norms.InstanceNorm)
