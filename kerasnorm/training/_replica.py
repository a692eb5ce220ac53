"""Each replica's forward and backward pass under XLA, the update outside it.

Keras compiles `strategy.run(train_step)` as one XLA cluster when
`jit_compile=True`. Under a multi-device strategy that cluster holds the
optimizer update, which reads and writes variables on several devices, and
TensorFlow cannot compile it. Compiling only what one replica computes on its
own device (forward, loss, gradients) and leaving the all-reduce and the
update to TensorFlow's distribution engine keeps XLA on and gives the same
update.
"""

import functools
import itertools
import warnings

import keras
import tensorflow as tf

from kerasnorm import _compat
from kerasnorm.training import _norm_xla


def is_distributed(model) -> bool:
    """Whether `model` trains under a strategy with more than one replica."""
    return model.distribute_strategy.num_replicas_in_sync > 1


def synchronizes_replicas(model) -> bool:
    """Whether a layer of `model` exchanges data across replicas in `call`.

    Keras' `BatchNormalization(synchronized=True)` all-reduces its batch
    statistics; kerasnorm's layers are layer-wise and never do.
    """
    return any(
        getattr(layer, "synchronized", False) is True
        for layer in _compat.sublayers(model, recursive=True)
    )


def replica_compiled(fn, model):
    """`fn`, which runs inside one replica, compiled with XLA.

    One `tf.function(jit_compile=True)` makes `fn` a single XLA program. A
    layer that all-reduces inside `call` needs `merge_call`, which TensorFlow
    refuses inside a nested function; for such models the ops are marked for
    XLA with `jit_scope`, and TensorFlow compiles the stretches between the
    synchronization points (more, smaller XLA programs).
    """
    if not synchronizes_replicas(model):
        return tf.function(fn, jit_compile=True, reduce_retracing=True)

    @functools.wraps(fn)
    def scoped(*args):
        with tf.xla.experimental.jit_scope():
            return fn(*args)

    return scoped


def forward_backward(model):
    """Keras' training forward pass, loss and gradients, without the update."""

    def run(x, y, sample_weight):
        with tf.GradientTape() as tape, _norm_xla.compiled_calls(model):
            y_pred = model(x, training=True)
            loss = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            scaled = model.optimizer.scale_loss(loss)
        return y_pred, loss, tape.gradient(scaled, model.trainable_weights)

    return run


def _train_step(model, compute, data):
    """Keras' `train_step` with the forward and backward pass in `compute`."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred, loss, gradients = compute(x, y, sample_weight)
    model.optimizer.apply_gradients(
        zip(gradients, model.trainable_weights, strict=True)
    )
    # `compute_loss` divides by the number of replicas so that the replicas'
    # gradients sum to the global batch's; the logged loss is the local mean.
    replicas = model.distribute_strategy.num_replicas_in_sync
    batch = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
    _compat.loss_tracker(model).update_state(
        loss * tf.cast(replicas, loss.dtype), sample_weight=batch
    )
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def install(model):
    """Make `model.fit` XLA-compile each replica's forward and backward pass.

    Replaces the model's `make_train_function` and `make_test_function` on
    the instance: the train function runs `strategy.run` on a step whose
    forward and backward pass is compiled when `model.jit_compile` is on,
    while the all-reduce and the update stay with TensorFlow; evaluation runs
    Keras' `test_step` per replica without XLA. The per-step logs are the
    replicas' mean (Keras 3.15's own reduction fails under
    MultiWorkerMirroredStrategy).
    """
    if type(model).train_step is not keras.Model.train_step:
        warnings.warn(
            f"Model '{model.name}' overrides `train_step`, which kerasnorm "
            "cannot split into a compiled per-replica part and the update; it "
            "trains without XLA under the strategy "
            f"({type(model.distribute_strategy).__name__}).",
            stacklevel=3,
        )
        model.jit_compile = False
        return
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        _compat.build_from_local_batch(model)

    def make_train_function(force=False):
        if model.train_function is not None and not force:
            return model.train_function
        compute = forward_backward(model)
        if model.jit_compile:
            compute = replica_compiled(compute, model)
        model.train_function = _distributed_function(
            model, functools.partial(_train_step, model, compute)
        )
        return model.train_function

    def make_test_function(force=False):
        if model.test_function is not None and not force:
            return model.test_function
        model.test_function = _distributed_function(model, model.test_step)
        return model.test_function

    _compat.replace_method(model, "make_train_function", make_train_function)
    _compat.replace_method(model, "make_test_function", make_test_function)


def _distributed_function(model, step):
    """What `fit` / `evaluate` call per batch: `step` on every replica.

    Keras would compile `strategy.run(step)` as one XLA cluster when
    `model.jit_compile` is on; here only what `step` compiles itself is.
    """
    strategy = model.distribute_strategy

    @tf.function(reduce_retracing=True)
    def one_step(data):
        logs = strategy.run(step, args=(data,))
        return tf.nest.map_structure(
            lambda value: strategy.reduce("MEAN", value, axis=None), logs
        )

    def function(iterator):
        logs = None
        for data in itertools.islice(iterator, model.steps_per_execution):
            logs = one_step(data)
        if logs is None:
            raise StopIteration
        return logs

    return function
