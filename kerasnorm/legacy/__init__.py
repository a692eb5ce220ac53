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

They compute with `keras.ops`, which work on the TensorFlow tensors a
`tf_keras` layer is called with only on Keras' TensorFlow backend (on
another one they return that backend's arrays), so importing this package on
another backend raises an `ImportError` naming it.
"""

import keras

from kerasnorm._core.dependencies import require_tensorflow

require_tensorflow("kerasnorm.legacy")
if keras.backend.backend() != "tensorflow":
    raise ImportError(
        "kerasnorm.legacy needs Keras' TensorFlow backend: its tf_keras layers "
        "compute with keras.ops, which return TensorFlow tensors only there. "
        f"Keras runs on the {keras.backend.backend()!r} backend here; set "
        "KERAS_BACKEND=tensorflow before Keras is first imported."
    )

from kerasnorm.legacy import layers  # noqa: E402

__all__ = ["layers"]
