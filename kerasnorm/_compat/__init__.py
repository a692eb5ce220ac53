"""Every private Keras, TensorFlow and LiteRT API kerasnorm uses, in one place.

Each entry says why no public API does the job and the versions it was checked
on (the supported range, Keras 3.10 to 3.15 and TensorFlow 2.19 to 2.21, both
ends tested), so that an upgrade breaks this one package, loudly. Where a hook
differs inside that range, or a second route to the same result exists, the
entry detects the feature (never the version number) and falls back; each
fallback has a test that takes it (tests/test_compat.py). Nothing else in the
package imports `keras.src`, `tensorflow.python` or an underscore attribute of
another library. TensorFlow is imported lazily, inside the functions that need
it, so the layers import on backends without TensorFlow.
"""

from kerasnorm._compat.keras_private import DropoutRNNCell
from kerasnorm._compat.keras_private import Functional
from kerasnorm._compat.keras_private import GraphNode
from kerasnorm._compat.keras_private import KerasRNNInnerLoop
from kerasnorm._compat.keras_private import backend_rnn
from kerasnorm._compat.keras_private import build_from_local_batch
from kerasnorm._compat.keras_private import einsum_dense_uses_matrix_fans
from kerasnorm._compat.keras_private import functional_of
from kerasnorm._compat.keras_private import graph_nodes
from kerasnorm._compat.keras_private import input_tensors_of_calls
from kerasnorm._compat.keras_private import keras_layers
from kerasnorm._compat.keras_private import keras_mask
from kerasnorm._compat.keras_private import layer_config
from kerasnorm._compat.keras_private import loss_tracker
from kerasnorm._compat.keras_private import replace_method
from kerasnorm._compat.keras_private import restore_method
from kerasnorm._compat.keras_private import sublayers
from kerasnorm._compat.keras_tracing import backend_numpy_replaced
from kerasnorm._compat.keras_tracing import backend_replaced
from kerasnorm._compat.keras_tracing import calling_layers
from kerasnorm._compat.keras_tracing import matmul_as_one_product
from kerasnorm._compat.tensorflow_private import convert_variables_to_constants
from kerasnorm._compat.tensorflow_private import get_tf_keras_autocast
from kerasnorm._compat.tensorflow_private import interpreter_ops
from kerasnorm._compat.tensorflow_private import new_axes_as_expand_dims
from kerasnorm._compat.tensorflow_private import op_creation_callback
from kerasnorm._compat.tensorflow_private import set_tf_keras_autocast
from kerasnorm._compat.tensorflow_private import set_tf_keras_dropout_generator
from kerasnorm._compat.tensorflow_private import strided_slices_as_reshapes
from kerasnorm._compat.tensorflow_private import tf_keras_dropout_rnn_cell_mixin
from kerasnorm._compat.tensorflow_private import tflite_calibrated
from kerasnorm._compat.tensorflow_private import tflite_quantize_calibrated
from kerasnorm._compat.tensorflow_private import write_buffers_after_flatbuffer

__all__ = [
    "DropoutRNNCell",
    "Functional",
    "GraphNode",
    "KerasRNNInnerLoop",
    "backend_numpy_replaced",
    "backend_replaced",
    "backend_rnn",
    "build_from_local_batch",
    "calling_layers",
    "convert_variables_to_constants",
    "einsum_dense_uses_matrix_fans",
    "functional_of",
    "get_tf_keras_autocast",
    "graph_nodes",
    "input_tensors_of_calls",
    "interpreter_ops",
    "keras_layers",
    "keras_mask",
    "layer_config",
    "loss_tracker",
    "matmul_as_one_product",
    "new_axes_as_expand_dims",
    "op_creation_callback",
    "replace_method",
    "restore_method",
    "set_tf_keras_autocast",
    "set_tf_keras_dropout_generator",
    "strided_slices_as_reshapes",
    "sublayers",
    "tf_keras_dropout_rnn_cell_mixin",
    "tflite_calibrated",
    "tflite_quantize_calibrated",
    "write_buffers_after_flatbuffer",
]
