"""What a kerasnorm layer mixin needs from `tf_keras` that Keras 3 spells
differently."""

import tensorflow as tf
import tf_keras

from kerasnorm._compat import get_tf_keras_autocast
from kerasnorm._compat import set_tf_keras_autocast

# Keras 3 names a variable's aggregation with a string, `tf_keras` with
# TensorFlow's enum.
_AGGREGATIONS = {
    "none": tf.VariableAggregation.NONE,
    "sum": tf.VariableAggregation.SUM,
    "mean": tf.VariableAggregation.MEAN,
    "only_first_replica": tf.VariableAggregation.ONLY_FIRST_REPLICA,
}


class TfKerasAdapter:
    """Put first in a legacy class's bases, before the layer's mixin and
    `tf_keras.layers.Layer`.

    The mixins reach initializers, regularizers, constraints and `InputSpec`
    through `_framework`; Keras 3's `add_weight(autocast=...)` and
    `layer.autocast` are `experimental_autocast` and a private attribute in
    `tf_keras` (`kerasnorm._compat.get_tf_keras_autocast`)
    (and `aggregation` an enum rather than a string),
    and a `build` called directly (to `set_weights` before the first call)
    marks the layer built in Keras 3 only.
    """

    _framework = tf_keras

    @property
    def autocast(self):
        return get_tf_keras_autocast(self)

    @autocast.setter
    def autocast(self, value):
        set_tf_keras_autocast(self, value)

    def build(self, *shapes):
        super().build(*shapes)
        self.built = True

    def add_weight(self, *args, autocast=True, aggregation="none", **kwargs):
        return super().add_weight(
            *args,
            experimental_autocast=autocast,
            aggregation=_AGGREGATIONS[aggregation],
            **kwargs,
        )


def legacy_docstring(keras3_class):
    """The docstring of a legacy twin: where the layer is documented."""
    name = keras3_class.__name__
    return (
        f"`tf_keras` twin of `kerasnorm.{name}`: same arguments, weights and "
        f"outputs; see that class for the documentation.\n"
    )
