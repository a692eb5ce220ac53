"""kerasnorm's layers for `tf_keras` (Keras 2), the Keras that
tensorflow-model-optimization works with.

`kerasnorm.legacy.layers.LayerNorm` and its siblings are `tf_keras` layers
that share their implementation with the Keras 3 classes (`kerasnorm.LayerNorm`,
...): the same constructor arguments, the same weights in the same order
(`legacy.set_weights(keras3_layer.get_weights())` works) and the same outputs.
They are registered for `tf_keras` serialization under the package name
`kerasnorm`, so `.h5` files and SavedModels load without `custom_objects`.

Importing this package imports `tf_keras`; `kerasnorm` and `kerasnorm.export`
import it only on the quantization-aware-training path
(`kerasnorm.export.quantize_aware`).
"""

from kerasnorm.legacy import layers

__all__ = ["layers"]
