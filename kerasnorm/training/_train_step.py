"""`train_step`: one XLA-compiled training step for custom training loops."""

from collections.abc import Callable

import keras
import tensorflow as tf

from kerasnorm._core import check_positive_number
from kerasnorm.training import _norm_xla
from kerasnorm.training import _replica


class TrainStep:
    """`step(x, y) -> loss`, as returned by `train_step`.

    Attributes:
        optimizer: the optimizer it updates with; under `mixed_float16` a
            `keras.optimizers.LossScaleOptimizer` around the one given.
        jit_compile: whether the step runs under XLA: `True`, `False` or
            `"norms"` (the normalization layers only).
    """

    def __init__(self, model, optimizer, loss_fn, jit_compile, clip_norm):
        self.optimizer = optimizer
        self.jit_compile = jit_compile
        self._norm_calls = ()
        if jit_compile == "norms":
            self._norm_calls = _norm_xla.compiled_norm_calls(model)
            jit_compile = False
        self._model = model
        self._loss_fn = loss_fn
        self._clip_norm = clip_norm
        self._strategy = tf.distribute.get_strategy()
        self._replicas = self._strategy.num_replicas_in_sync
        if self._replicas > 1:
            compute = self._loss_and_gradients
            if jit_compile:
                compute = _replica.replica_compiled(compute, model)
            self._compute = compute
            self._function = tf.function(self._distributed_step)
        else:
            self._function = tf.function(self._step, jit_compile=jit_compile)

    def __call__(self, x, y):
        """Train on one batch; under a strategy, on per-replica values.

        Returns:
            The loss of the (global) batch, regularization losses included.
        """
        return self._function(x, y)

    def _loss_and_gradients(self, x, y, global_batch):
        model = self._model
        with tf.GradientTape() as tape:
            with _norm_xla.swapped_calls(self._norm_calls):
                y_pred = model(x, training=True)
            y_pred = keras.ops.cast(y_pred, "float32")
            if isinstance(self._loss_fn, keras.losses.Loss):
                # Unreduced: `Loss.__call__` would divide by the number of
                # replicas on top of the division by the global batch below.
                loss = self._loss_fn.call(y, y_pred)
            else:
                loss = self._loss_fn(y, y_pred)
            if len(loss.shape) == 0:
                loss = loss * tf.cast(_batch_size(x), loss.dtype)
            else:
                loss = tf.reduce_sum(
                    tf.reduce_mean(loss, axis=list(range(1, len(loss.shape))))
                )
            # Each replica's share: the replicas' losses (and gradients)
            # sum to the global batch's mean.
            loss = loss / global_batch
            if model.losses:
                loss += tf.add_n(
                    [tf.cast(term, "float32") for term in model.losses]
                ) / tf.cast(self._replicas, "float32")
            scaled = self.optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, model.trainable_variables)

    def _step(self, x, y):
        global_batch = tf.cast(_batch_size(x), "float32")
        loss, gradients = self._loss_and_gradients(x, y, global_batch)
        if self._clip_norm is not None:
            gradients = self._clipped(gradients)
        self.optimizer.apply_gradients(
            zip(gradients, self._model.trainable_variables, strict=True)
        )
        return loss

    def _replica_step(self, x, y):
        context = tf.distribute.get_replica_context()
        local_batch = tf.cast(_batch_size(x), "float32")
        global_batch = context.all_reduce(tf.distribute.ReduceOp.SUM, local_batch)
        loss, gradients = self._compute(x, y, global_batch)
        if self._clip_norm is not None:
            # The norm to clip to is that of the global batch's gradient. The
            # optimizer all-reduces (sums) what it gets after its own
            # clipping, so each replica hands it its share of the clipped sum.
            gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
            gradients = [g / self._replicas for g in self._clipped(gradients)]
        self.optimizer.apply_gradients(
            zip(gradients, self._model.trainable_variables, strict=True)
        )
        return loss

    def _distributed_step(self, x, y):
        losses = self._strategy.run(self._replica_step, args=(x, y))
        return self._strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def _clipped(self, gradients):
        """Clip to global norm `clip_norm`, measured without loss scaling."""
        scale = 1.0
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            scale = tf.cast(self.optimizer.dynamic_scale, "float32")
        unscaled = [g / scale for g in gradients]
        clipped, _ = tf.clip_by_global_norm(unscaled, self._clip_norm)
        return [g * scale for g in clipped]


def _batch_size(x):
    return tf.shape(tf.nest.flatten(x)[0])[0]


def train_step(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    loss_fn: Callable,
    *,
    jit_compile: bool | str = True,
    clip_norm: float | None = None,
) -> TrainStep:
    """An XLA-compiled training step for custom training loops.

    The step runs the forward pass, the loss, the gradients, optional
    global-norm clipping and the optimizer update. Under `mixed_float16` the
    optimizer is wrapped in `keras.optimizers.LossScaleOptimizer` (unless it
    is one). Created inside a strategy's scope, the step runs each replica
    with `strategy.run` on per-replica batches (from
    `strategy.experimental_distribute_dataset`), each replica's loss divided
    by the global batch size; there XLA compiles each replica's forward and
    backward pass and the all-reduce and update run outside it.

    ```python
    step = kerasnorm.training.train_step(
        model, keras.optimizers.Adam(1e-3), keras.losses.MeanSquaredError(),
        clip_norm=1.0)
    for x, y in dataset:
        loss = step(x, y)
    ```

    Args:
        model: a built `keras.Model`.
        optimizer: a Keras optimizer; built here if it is not.
        loss_fn: a `keras.losses.Loss` (its per-example values, from
            `loss_fn.call`, are averaged over the global batch whatever its
            `reduction`) or `loss_fn(y_true, y_pred)` returning per-example
            losses (batch first; other axes are averaged) or their mean over
            the replica's batch. `y_pred` is cast to float32 first.
        jit_compile: whether to compile the step with XLA; `"norms"`
            compiles only the normalization layers with XLA (see
            `compile`). Defaults to `True`.
        clip_norm: clip the gradients to this global norm (of the global
            batch's gradient under a strategy). Defaults to `None`.

    Returns:
        `step(x, y) -> loss`, a `TrainStep`.
    """
    if not (isinstance(jit_compile, bool) or jit_compile == "norms"):
        raise ValueError(
            "`jit_compile` must be True, False or 'norms'. "
            f"Received: jit_compile={jit_compile!r}"
        )
    if jit_compile == "norms":
        _norm_xla.require_norm_layers(model, "jit_compile=True or False")
    if not callable(loss_fn):
        raise ValueError(
            "`loss_fn` must be a callable: a `keras.losses.Loss` or "
            f"`loss_fn(y_true, y_pred)`. Received: loss_fn={loss_fn!r}"
        )
    if clip_norm is not None:
        check_positive_number(clip_norm, "clip_norm")
    if not model.built:
        raise ValueError(
            "`model` must be built before `train_step` (give it a keras.Input "
            f"or call it on a batch). Received: model={model.name!r}, unbuilt"
        )
    if model.dtype_policy.name == "mixed_float16" and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return TrainStep(model, optimizer, loss_fn, jit_compile, clip_norm)
