"""The normalization layers as `tf_keras` layers: each is the mixin of the
Keras 3 layer (`kerasnorm.norms`) over `tf_keras.layers.Layer`."""

import tf_keras

from kerasnorm import norms
from kerasnorm.legacy._adapter import TfKerasAdapter
from kerasnorm.legacy._adapter import legacy_docstring
from kerasnorm.norms.group_norm import GroupNormMixin
from kerasnorm.norms.instance_norm import InstanceNormMixin
from kerasnorm.norms.layer_norm import LayerNormMixin
from kerasnorm.norms.rms_norm import RMSNormMixin

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
