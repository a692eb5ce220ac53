"""The normalization layers and `WeightNorm` as `tf_keras` layers: each is
the mixin of the Keras 3 layer (`kerasnorm.norms`) over `tf_keras`'s Layer
or Wrapper."""

import tf_keras

from kerasnorm import norms
from kerasnorm.legacy._adapter import TfKerasAdapter
from kerasnorm.legacy._adapter import legacy_docstring
from kerasnorm.norms.group_norm import GroupNormMixin
from kerasnorm.norms.instance_norm import InstanceNormMixin
from kerasnorm.norms.layer_norm import LayerNormMixin
from kerasnorm.norms.rms_norm import RMSNormMixin
from kerasnorm.norms.weight_norm import WeightNormMixin

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


@_register
class WeightNorm(TfKerasAdapter, WeightNormMixin, tf_keras.layers.Wrapper):
    __doc__ = legacy_docstring(norms.WeightNorm)

    @property
    def weights(self):
        # Keras 3's order, which `get_weights`/`set_weights` follow: the
        # wrapper's own weights, then the wrapped layer's (`tf_keras` lists
        # trainable before non-trainable ones).
        own = [w for w in (self.g, self.initialized) if w is not None]
        return own + self.layer.weights
