"""Every private Keras, TensorFlow and LiteRT API kerasnorm uses, in one place.

Each entry says why no public API does the job and the versions it was checked
on, so that an upgrade breaks this one file, loudly. Nothing else in the
package imports `keras.src`, `tensorflow.python` or an underscore attribute of
another library. TensorFlow is imported lazily, inside the functions that need
it, so the layers import on backends without TensorFlow.
"""

from typing import NamedTuple

from keras.src import backend as _keras_backend
from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell
from keras.src.models.functional import Functional

__all__ = [
    "DropoutRNNCell",
    "Functional",
    "GraphNode",
    "backend_rnn",
    "build_from_local_batch",
    "convert_variables_to_constants",
    "functional_of",
    "graph_nodes",
    "interpreter_ops",
    "loss_tracker",
    "sublayers",
    "tf_keras_dropout_rnn_cell_mixin",
]

# Checked on keras 3.15.1 for all three entries below.
# `DropoutRNNCell`: the dropout-mask cache that `keras.layers.LSTMCell` uses;
# Keras exports no public mixin for it, and the cells must share Keras' masks
# for drop-in behaviour.
# `Functional`: the class of `keras.Model(inputs, outputs)`; `isinstance`
# against it is the only way to tell a graph model from a subclassed one.
# `backend_rnn`: the backend-neutral time loop behind `keras.layers.RNN`
# (masks, go_backwards, unroll); `keras.ops` has no public equivalent.
backend_rnn = _keras_backend.rnn


def functional_of(model):
    """The graph of a Functional model, or a Sequential's inner one; else None.

    `Sequential._functional` is private (keras 3.15.1): a built Sequential
    keeps its graph there and exposes no public accessor.
    """
    import keras

    if isinstance(model, keras.Sequential):
        return getattr(model, "_functional", None)
    if isinstance(model, Functional):
        return model
    return None


def convert_variables_to_constants(concrete_function):
    """Freeze a concrete function's variables into constants.

    `tensorflow.python.framework.convert_to_constants` (TF 2.21.0): the only
    way to hand LiteRT's converter a graph with no resource variables;
    `tf.lite.TFLiteConverter.from_concrete_functions` does the same but keeps
    variable ops for stateful models.
    """
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    return convert_variables_to_constants_v2(concrete_function)


def interpreter_ops(interpreter):
    """The op list of a LiteRT interpreter: dicts with `op_name`, `index`, ...

    `Interpreter._get_ops_details` (ai-edge-litert 2.3): the public interpreter
    lists tensors but not ops, and the op names are how an export proves it has
    no Flex (TensorFlow) ops.
    """
    return interpreter._get_ops_details()


class GraphNode(NamedTuple):
    """One call in a Functional graph, as `graph_nodes` lists it."""

    operation: object  # the layer or keras.ops operation that was called
    inputs: list  # the KerasTensors it consumed, flattened
    outputs: list  # the KerasTensors it produced, flattened
    kwargs: dict  # the call's keyword arguments (e.g. training=True)


def graph_nodes(graph):
    """The calls of a Functional graph (see `functional_of`), inputs first.

    `Functional._nodes_by_depth` and the `Node` objects in it (keras 3.15.1)
    are private: Keras exposes no graph-walking API, and
    `keras.models.clone_model` walks the graph only to rebuild it, while
    BatchNorm folding has to know each tensor's producer and consumers
    before it rebuilds anything.
    """
    nodes = []
    for depth in sorted(graph._nodes_by_depth, reverse=True):
        for node in graph._nodes_by_depth[depth]:
            if node.operation is not None and not node.is_input:
                nodes.append(
                    GraphNode(
                        node.operation,
                        list(node.input_tensors),
                        list(node.outputs),
                        dict(node.arguments.kwargs),
                    )
                )
    return nodes


def sublayers(layer, recursive=False):
    """The layers a layer holds (all nested ones with `recursive=True`).

    `Layer._flatten_layers` (keras 3.15.1): Keras 3 lists the sublayers of a
    Sequential or Functional model publicly (`model.layers`), but not those of
    a subclassed layer, a wrapper or an RNN's cell; training has to find every
    layer to attribute an XLA failure and to spot cross-replica layers.
    """
    return list(layer._flatten_layers(include_self=False, recursive=recursive))


def loss_tracker(model):
    """The `Mean` metric behind a compiled model's "loss" log.

    `Trainer._loss_tracker` (keras 3.15.1): a train-step override has to
    update it exactly as Keras' own `train_step` does, and Keras has no public
    accessor for it.
    """
    return model._loss_tracker


def build_from_local_batch(model):
    """Let `model.fit` start under `MultiWorkerMirroredStrategy` (keras 3.15.1).

    `TensorFlowTrainer._maybe_symbolic_build` builds the model from the first
    distributed batch through an eager `strategy.reduce("MEAN", batch)`, which
    MultiWorkerMirroredStrategy refuses ("Attempt to convert a value
    (PerReplica...)"), so `fit` fails there for every model, Keras' own layers
    included. Only the batch's shapes and dtypes matter: this instance
    override builds from the first local replica's part of it instead.
    """
    import tensorflow as tf

    strategy = model.distribute_strategy

    def local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(local, next(batches))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build


def tf_keras_dropout_rnn_cell_mixin():
    """`tf_keras`'s `DropoutRNNCellMixin` (tf-keras 2.21, private module).

    `tf_keras.layers.RNN` resets a cell's cached dropout masks at each call
    only for cells that inherit it, and `tf_keras` exports it nowhere; the
    legacy cells need it to work in `tf_keras.layers.RNN` as Keras' own do.
    """
    from tf_keras.src.layers.rnn.dropout_rnn_cell_mixin import DropoutRNNCellMixin

    return DropoutRNNCellMixin
