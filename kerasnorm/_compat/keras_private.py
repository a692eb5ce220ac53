"""Keras' private APIs kerasnorm uses (see `kerasnorm._compat`)."""

import importlib
import inspect
from typing import NamedTuple

import keras
from keras.src import backend as _keras_backend
from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell as DropoutRNNCell
from keras.src.models.functional import Functional

# `DropoutRNNCell` is re-exported by `kerasnorm._compat` (the alias says so).

# Checked on keras 3.10.0 and 3.15.1 for all three entries below.
# `DropoutRNNCell`: the dropout-mask cache that `keras.layers.LSTMCell` uses;
# Keras exports no public mixin for it, and the cells must share Keras' masks
# for drop-in behaviour.
# `Functional`: the class of `keras.Model(inputs, outputs)`; `isinstance`
# against it is the only way to tell a graph model from a subclassed one.
# `backend_rnn`: the backend-neutral time loop behind `keras.layers.RNN`
# (masks, go_backwards, unroll); `keras.ops` has no public equivalent.


def _backend_rnn():
    """`keras.src.backend.rnn`, or the active backend's own module's `rnn`
    (where `keras.src.backend` re-exports it from) if the re-export goes."""
    found = getattr(_keras_backend, "rnn", None)
    if found is not None:
        return found
    module = f"keras.src.backend.{keras.backend.backend()}.rnn"
    return importlib.import_module(module).rnn


backend_rnn = _backend_rnn()


def _require_inner_loop(rnn_class):
    """Fail at import, naming the hook, if `RNN.call` no longer runs its time
    loop through `inner_loop` (present from keras 3.0 to 3.15.1): the
    layer-normalized recurrent layers would silently run Keras' own loop."""
    if not callable(getattr(rnn_class, "inner_loop", None)):
        raise ImportError(
            f"kerasnorm's recurrent layers need `{rnn_class.__name__}.inner_loop`"
            f" (Keras 3.10 to 3.15); keras {keras.__version__} has none."
        )


class KerasRNNInnerLoop:
    """Runs a sequence layer's own `time_loop` inside `keras.layers.RNN.call`.

    `RNN.inner_loop(sequences, initial_state, mask, training)` (keras 3.15.1)
    is undocumented: the hook `RNN.call` runs the time loop through, after it
    has handled masking, `stateful`, initial states and dropout masks. The
    layer-normalized layers override it to run the input half of every step
    before the loop; overriding `call` would mean rewriting all the rest.
    Put it before `keras.layers.RNN` in the bases.
    """

    _require_inner_loop(keras.layers.RNN)

    def inner_loop(self, sequences, initial_state, mask, training=False):
        return self.time_loop(sequences, initial_state, mask, training=training)


def keras_mask(x):
    """The mask Keras attached to the tensor `x`, or None.

    Keras passes the mask as `mask=` only to layers called with one tensor
    argument; a block called with a mask tensor as well reads it from the
    tensor. Keras' own reader (`keras.src.backend.get_keras_mask`, keras 3.10
    to 3.15.1) also finds masks of tensors that refuse attributes, which it
    keeps in a side table; without it, the `_keras_mask` attribute it writes
    where it can.
    """
    reader = getattr(_keras_backend, "get_keras_mask", None)
    if reader is not None:
        return reader(x)
    return getattr(x, "_keras_mask", None)


def keras_layers(*names):
    """The classes `keras.layers.<name>` that this Keras has, in order.

    For layer lists that name layers newer than the oldest supported Keras:
    `AdaptiveAveragePooling1D` and `AdaptiveMaxPooling1D` are in keras 3.15.1,
    not in 3.10.0, where no model can contain them.
    """
    return tuple(
        getattr(keras.layers, name) for name in names if hasattr(keras.layers, name)
    )


def layer_config(layer):
    """`layer.get_config()`, with what Keras 3.10 leaves out of it.

    Keras 3.10's transposed convolutions leave `output_padding` out of their
    config (3.15 keeps it), so a layer rebuilt from the config computes a
    smaller output. Detected by the key's absence while the layer (public
    attribute) has a value; `WeightNorm.remove` rebuilds layers this way.
    """
    config = layer.get_config()
    padding = getattr(layer, "output_padding", None)
    if padding is not None and "output_padding" not in config:
        config["output_padding"] = padding
    return config


def einsum_dense_uses_matrix_fans():
    """Whether Keras' `EinsumDense` gives `VarianceScaling` its kernel's
    input and output axes (keras 3.15.1: yes, through the initializer's
    `input_axes`/`output_axes` arguments).

    Without them (keras 3.10) a rank-3 kernel such as an attention
    projection's `(width, heads, key_dim)` gets a convolution's fans
    (`fan_in = heads * width`), a 6x smaller Xavier std for the blocks'
    shapes; the blocks then redraw those kernels with the matrix fans.
    """
    signature = inspect.signature(keras.initializers.VarianceScaling)
    return "input_axes" in signature.parameters


def replace_method(obj, name, function):
    """Make `obj.name` (a method of `obj`'s class) call `function` on this
    instance only; `restore_method` undoes it.

    Keras (3.15.1) calls `fit`'s `make_train_function`, `make_test_function`
    and `train_step` and a layer's `call` through the instance, so an instance
    attribute takes their place; Keras offers no public hook for compiling
    each replica's step or a layer's call on its own. `object.__setattr__`:
    Keras' `Layer.__setattr__` would track the function as state.
    """
    object.__setattr__(obj, name, function)


def restore_method(obj, name, saved):
    """Undo `replace_method`: `saved` is what `obj.__dict__` held under
    `name` before (None: nothing, the class's method applies again)."""
    if saved is None:
        object.__delattr__(obj, name)
    else:
        object.__setattr__(obj, name, saved)


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


class GraphNode(NamedTuple):
    """One call in a Functional graph, as `graph_nodes` lists it."""

    operation: object  # the layer or keras.ops operation that was called
    inputs: list  # the KerasTensors it consumed, flattened
    outputs: list  # the KerasTensors it produced, flattened
    kwargs: dict  # the call's keyword arguments (e.g. training=True)
    args: tuple = ()  # the call's positional arguments, tensors and constants


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
                        tuple(node.arguments.args),
                    )
                )
    return nodes


def input_tensors_of_calls(layer):
    """The input tensors of each recorded call of `layer`, flattened.

    `Layer._inbound_nodes` (keras 3.15.1): `layer.input` is public but raises
    for a layer called more than once or never called in a graph; the
    recurrent unrolling at export reads a layer's sequence length from
    whichever call recorded one.
    """
    return [
        keras.tree.flatten(getattr(node, "input_tensors", None) or [])
        for node in getattr(layer, "_inbound_nodes", None) or []
    ]


def sublayers(layer, recursive=False):
    """The layers a layer holds (all nested ones with `recursive=True`).

    `Layer._flatten_layers` (keras 3.10 to 3.15.1): Keras 3 lists the
    sublayers of a Sequential or Functional model publicly (`model.layers`),
    but not those of a subclassed layer, a wrapper or an RNN's cell; training
    has to find every layer to attribute an XLA failure and to spot
    cross-replica layers. Without it, the layers held in the layer's
    attributes (directly or in lists, tuples and dicts), which is where
    Keras' tracker finds them.
    """
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=recursive))
    return _sublayers_by_attributes(layer, recursive)


def _sublayers_by_attributes(layer, recursive):
    # A Sequential's inner Functional (`functional_of`) is a view of the
    # Sequential's own layers, which Keras' tracker does not list.
    found, seen = [], {id(layer), id(functional_of(layer))}

    def visit(value):
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list | tuple):
            for item in value:
                visit(item)
        elif isinstance(value, keras.layers.Layer) and id(value) not in seen:
            seen.update({id(value), id(functional_of(value))})
            found.append(value)
            if recursive:
                visit(list(vars(value).values()))

    visit(list(vars(layer).values()))
    return found


def loss_tracker(model):
    """The `Mean` metric behind a compiled model's "loss" log.

    `Trainer._loss_tracker` (keras 3.10 to 3.15.1): a train-step override
    has to update it exactly as Keras' own `train_step` does, and Keras has
    no public accessor for it. Without the attribute: the metric named
    "loss" in `model.metrics`, which lists the loss tracker first.
    """
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is not None:
        return tracker
    return next(m for m in model.metrics if m.name == "loss")


def build_from_local_batch(model):
    """Let `model.fit` start under `MultiWorkerMirroredStrategy` (keras 3.15.1).

    `TensorFlowTrainer._maybe_symbolic_build` builds the model from the first
    distributed batch through an eager `strategy.reduce("MEAN", batch)`, which
    MultiWorkerMirroredStrategy refuses ("Attempt to convert a value
    (PerReplica...)"), so `fit` fails there for every model, Keras' own layers
    included. Only the batch's shapes and dtypes matter: this instance
    override builds from the first local replica's part of it instead.
    The epoch iterator yields `(step, batches)` in keras 3.10 and
    `(begin_step, end_step, batches)` in 3.15: the batches come last in both.
    """
    import tensorflow as tf

    strategy = model.distribute_strategy

    def local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for *_, batches in iterator:
                data_batch = tf.nest.map_structure(local, next(batches))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build
