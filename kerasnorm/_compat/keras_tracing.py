"""Keras' private hooks used while a graph is traced for export: the calling
layers and the swaps of Keras' backend functions (see `kerasnorm._compat`)."""

import contextlib

import keras
from keras.src import backend as _keras_backend


def calling_layers():
    """The Keras layers whose calls are running now, outermost first.

    Keras' name-scope stack (`keras.src.backend.common.global_state`'s
    `"name_scope_stack"`, keras 3.10.0 to 3.15.1): each `Layer.__call__`
    pushes a scope whose `caller` is the layer. TensorFlow's own name
    scopes cannot stand in: a graph makes them unique by appending `_1`,
    which collides with the names Keras gives a second layer of the same
    class. Empty when the stack is absent.
    """
    stack = _scope_stack() or []
    layers = []
    for scope in stack:
        caller = getattr(scope, "caller", None)
        if isinstance(caller, keras.layers.Layer) and caller not in layers:
            layers.append(caller)
    return layers


def _scope_stack():
    """Keras' name-scope stack on this thread, or None (see
    `calling_layers`)."""
    try:
        from keras.src.backend.common import global_state

        return global_state.get_global_attribute("name_scope_stack")
    except (ImportError, AttributeError):
        return None


@contextlib.contextmanager
def matmul_as_one_product():
    """While active, `keras.ops.matmul` of a floating tensor of rank > 2 by a
    matrix of its dtype, on the TensorFlow backend, is one `tf.matmul` (a
    broadcasting batch product) where Keras writes `tf.tensordot`.

    The two compute the same product. A `Dense` layer on tokens calls it
    (`(batch, time, C) @ (C, units)`); `tf.tensordot` reshapes to rank 2 by
    shapes it computes at run time when a dimension is dynamic, which the
    TFLite converter writes as `SHAPE`, `GATHER`, `REDUCE_PROD`, `PACK` and
    `CONCATENATION` around each product. XNNPACK delegates none of them, so
    a dynamic-batch token model's `.tflite` file splits into one partition
    per `Dense`; `tf.matmul` of the same operands converts to one
    `FULLY_CONNECTED` that keeps the leading dimensions.

    The hook is `keras.src.backend`'s `numpy.matmul`, the function
    `keras.ops.matmul` calls on an eager or traced tensor (keras 3.10.0 and
    3.15.1; 3.10.0 writes `tf.matmul` itself, so there the replacement
    computes what Keras does); Keras offers no public way to choose how its
    backend lowers an op. The attribute is restored on exit, also on an
    error. Where it is absent, or the backend is not TensorFlow, nothing is
    replaced.
    """
    module = getattr(_keras_backend, "numpy", None)
    original = getattr(module, "matmul", None)
    if original is None or keras.backend.backend() != "tensorflow":
        yield False
        return
    import tensorflow as tf

    def matmul(x1, x2):
        if not any(isinstance(x, tf.SparseTensor) for x in (x1, x2)):
            a, b = keras.ops.convert_to_tensor(x1), keras.ops.convert_to_tensor(x2)
            if _one_product(a, b):
                return tf.matmul(a, b)
        return original(x1, x2)

    module.matmul = matmul
    try:
        yield True
    finally:
        module.matmul = original


def backend_numpy_replaced(**functions):
    """While active, each `keras.ops.<name>` on the TensorFlow backend calls
    `functions[name](original, *args, **kwargs)`, with `original` Keras'
    own backend function, which the replacement calls where it has nothing
    to change. A None replacement is skipped.

    The hook is `keras.src.backend`'s `numpy` module, whose functions
    `keras.ops` looks up at each call (keras 3.10.0 and 3.15.1), as
    `matmul_as_one_product`'s; Keras offers no public way to choose how its
    backend lowers an op. The attributes are restored on exit, also on an
    error. Where the backend is not TensorFlow or a name is absent, nothing
    is replaced for it.
    """
    return backend_replaced("numpy", **functions)


@contextlib.contextmanager
def backend_replaced(module_name, **functions):
    """`backend_numpy_replaced` for the functions of another module of
    `keras.src.backend` (`"math"`: `keras.ops.top_k`; `"nn"`:
    `keras.ops.one_hot`), looked up at each call the same way (keras
    3.10.0 and 3.15.1)."""
    module = getattr(_keras_backend, module_name, None)
    saved = {}
    if module is not None and keras.backend.backend() == "tensorflow":
        for name, function in functions.items():
            original = getattr(module, name, None)
            if function is None or original is None:
                continue
            saved[name] = original
            setattr(module, name, _calling(function, original))
    try:
        yield sorted(saved)
    finally:
        for name, original in saved.items():
            setattr(module, name, original)


def _calling(function, original):
    def replaced(*args, **kwargs):
        return function(original, *args, **kwargs)

    return replaced


def _one_product(x1, x2):
    """Whether `matmul_as_one_product` writes `x1 @ x2` (dense tensors) as
    one `tf.matmul`: floating, of one dtype, `x1` of known rank > 2 and `x2`
    a matrix (the case Keras writes as `tf.tensordot`)."""
    import tensorflow as tf

    # A Keras variable passes through `convert_to_tensor` as itself (an
    # EinsumDense's LoRA product `a @ b`, keras 3.15.1): its shape is a
    # tuple and its dtype a name, so both are read through TensorFlow.
    rank = tf.TensorShape(x1.shape).rank
    dtype = tf.as_dtype(x1.dtype)
    return (
        rank is not None
        and rank > 2
        and tf.TensorShape(x2.shape).rank == 2
        and dtype.is_floating
        and dtype == tf.as_dtype(x2.dtype)
    )
