"""`compile`: `model.compile` with XLA on CPUs and under tf.distribute."""

import contextlib
import logging
import re
import time
import warnings

import keras

from kerasnorm import _compat
from kerasnorm.training import _norm_xla
from kerasnorm.training import _replica
from kerasnorm.training._measure import JitMeasurement
from kerasnorm.training._measure import median_step_times

logger = logging.getLogger("kerasnorm.training")

# Timed rounds of `_STEPS_PER_ROUND` steps per mode, after the first step
# (compilation) and one warm-up step; up to `_MAX_ROUNDS` when the fastest
# two modes are within `_SEPARATION` of each other.
_ROUNDS = 5
_MAX_ROUNDS = 11
_SEPARATION = 0.05
_STEPS_PER_ROUND = 2
# The values of `jit_compile` besides True and False.
_NAMED_MODES = ("norms", "measure")

_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_UNSUPPORTED_OP = re.compile(r"XLA_\w+_JIT: (\w+) \(")


class XLACompileError(RuntimeError):
    """A model's training step that XLA cannot compile.

    Attributes:
        layer: the layer whose op XLA has no kernel for, or `None` when the
            error could not be traced back to a layer.
    """

    def __init__(self, message: str, layer: keras.Layer | None = None):
        super().__init__(message)
        self.layer = layer


def compile(
    model: keras.Model,
    *,
    optimizer,
    loss,
    metrics=None,
    jit_compile: bool | str = "measure",
    fallback: bool = False,
    sample: tuple | None = None,
    **kwargs,
) -> keras.Model:
    """`model.compile` with XLA available on CPUs and under a strategy.

    Keras' default `jit_compile="auto"` turns XLA off on CPU-only machines and
    under any `tf.distribute` strategy, and its `jit_compile=True` fails under
    a multi-device `MirroredStrategy`. Here `True` turns XLA on wherever the
    model trains: on one device Keras compiles the whole step; under a
    strategy with several replicas each replica's forward and backward pass
    is compiled and the all-reduce and optimizer update run outside XLA.

    A third mode, `"norms"`, compiles only the normalization layers with XLA
    (kerasnorm's and Keras' `LayerNormalization`, `RMSNormalization`,
    `GroupNormalization`, `BatchNormalization`; each its own XLA program,
    forward and backward) and leaves the rest of the step to TensorFlow's
    kernels: for conv nets, whose convolutions XLA:CPU runs slower than
    TensorFlow's oneDNN kernels while it fuses the normalizations' many
    small ops.

    With `sample` (a batch `(x, y)` or `(x, y, sample_weight)` of the size
    you train with), the step is compiled once before this returns, so a
    layer XLA cannot compile is named here rather than deep inside `fit`.
    The weights, the optimizer state and the metrics are left as they were.

    ```python
    model = kerasnorm.training.compile(
        model, optimizer="adam", loss="mse", sample=(x[:64], y[:64]))
    model.jit_compile_measurement  # both step times and the choice
    model.fit(x, y, batch_size=64)
    ```

    Args:
        model: a `keras.Model`, created under the strategy's scope when it
            trains under one.
        optimizer: as in `model.compile`.
        loss: as in `model.compile`.
        metrics: as in `model.compile`. Defaults to `None`.
        jit_compile: `True`, `False` or `"norms"` forces a mode.
            `"measure"` times a few training steps on `sample` in each mode
            (`"norms"` only for a model with a normalization layer),
            interleaved after warm-up, keeps the fastest, logs the
            times on the `kerasnorm.training` logger and stores a
            `JitMeasurement` as `model.jit_compile_measurement`; without
            `sample` it cannot measure and turns XLA on. Defaults to
            `"measure"`.
        fallback: when XLA cannot compile the step on `sample`, warn
            (naming the layer) and train without XLA instead of raising
            `XLACompileError`. Defaults to `False`.
        sample: a batch to check and, with `"measure"`, to time the step on.
            Defaults to `None`.
        **kwargs: passed on to `model.compile` (`steps_per_execution`, ...).

    Returns:
        `model`, compiled; `model.jit_compile` says whether Keras compiles
        the whole step with XLA, `jit_compile_mode(model)` which of the three
        modes is in use.

    Raises:
        XLACompileError: XLA cannot compile the step on `sample` and
            `fallback` is `False`.
    """
    if not (
        isinstance(jit_compile, bool)
        or (isinstance(jit_compile, str) and jit_compile in _NAMED_MODES)
    ):
        raise ValueError(
            "`jit_compile` must be True, False, 'norms' or 'measure'. "
            f"Received: jit_compile={jit_compile!r}"
        )
    if not isinstance(fallback, bool):
        raise ValueError(f"`fallback` must be a bool. Received: fallback={fallback!r}")
    if jit_compile == "norms":
        _norm_xla.require_norm_layers(model, "jit_compile=True, False or 'measure'")
    if kwargs.get("run_eagerly") and jit_compile is not False:
        raise ValueError(
            "`run_eagerly=True` runs no compiled step; pass jit_compile=False "
            f"with it. Received: jit_compile={jit_compile!r}"
        )
    if sample is not None and not (isinstance(sample, tuple) and len(sample) in (2, 3)):
        raise ValueError(
            "`sample` must be a tuple (x, y) or (x, y, sample_weight). "
            f"Received: sample of type {type(sample).__name__}"
        )
    measure = jit_compile == "measure"
    if measure and sample is None:
        logger.info(
            "kerasnorm.training.compile: no sample to measure on; model '%s' "
            "trains with XLA.",
            model.name,
        )
    model.compile(
        optimizer=optimizer,
        loss=loss,
        metrics=metrics,
        jit_compile=jit_compile is True or measure,
        **kwargs,
    )
    _norm_xla.disable(model)
    if jit_compile == "norms":
        _norm_xla.enable(model)
    if _replica.is_distributed(model):
        _replica.install(model)
    if sample is not None and jit_compile is not False:
        _check_and_choose(model, sample, jit_compile, fallback)
    return model


def jit_compile_mode(model: keras.Model) -> bool | str:
    """The XLA mode `model` trains in: `True` (the whole step), `False` or
    `"norms"` (the normalization layers only)."""
    if _norm_xla.is_enabled(model):
        return "norms"
    return bool(model.jit_compile)


def _check_and_choose(model, sample, jit_compile, fallback, timer=time.perf_counter):
    """Compile the step on `sample`; with "measure", keep the fastest mode."""
    functions = {}

    def use(mode):
        model.jit_compile = mode is True
        if mode == "norms":
            _norm_xla.enable(model)
        else:
            _norm_xla.disable(model)

    # The mode (`use`) matters only while a train function is traced: each
    # mode's is traced in its first step, and the timed rounds only switch
    # between the traced functions.
    def run(mode, steps=1):
        model.train_function = functions[mode]
        for _ in range(steps):
            model.train_on_batch(*sample)

    def first_step(mode):
        use(mode)
        model.make_train_function(force=True)
        functions[mode] = model.train_function
        start = timer()
        run(mode)
        seconds = timer() - start
        run(mode)  # warm-up: the first run after compiling allocates
        return seconds

    measure = jit_compile == "measure"
    first = True if measure else jit_compile
    with _state_restored(model, sample), _quiet_retracing():
        try:
            first_seconds = {first: first_step(first)}
        except Exception as error:
            _xla_failed(model, error, fallback, lambda: first_step(False))
            return
        if not measure:
            return
        modes = [True, False] + (["norms"] if _norm_xla.norm_layers(model) else [])
        for mode in modes[1:]:
            first_seconds[mode] = first_step(mode)
        times, rounds = median_step_times(
            lambda mode: run(mode, _STEPS_PER_ROUND),
            _ROUNDS,
            timer,
            modes=modes,
            max_rounds=_MAX_ROUNDS,
            separation=_SEPARATION,
        )
        choice = min(modes, key=times.get)
        use(choice)
        model.train_function = functions[choice]
        model.jit_compile_measurement = JitMeasurement(
            jit_compile=choice,
            xla_step_seconds=times[True] / _STEPS_PER_ROUND,
            no_xla_step_seconds=times[False] / _STEPS_PER_ROUND,
            xla_first_step_seconds=first_seconds[True],
            no_xla_first_step_seconds=first_seconds[False],
            norms_step_seconds=_per_step(times.get("norms")),
            norms_first_step_seconds=first_seconds.get("norms"),
            rounds=rounds,
        )
    logger.info(
        "kerasnorm.training.compile: model '%s': %s",
        model.name,
        model.jit_compile_measurement,
    )


def _per_step(seconds):
    return None if seconds is None else seconds / _STEPS_PER_ROUND


def _xla_failed(model, error, fallback, run_without_xla):
    """Name the layer that broke XLA; raise, or warn and train without XLA."""
    # A step that also fails without XLA is broken for another reason, and
    # that error is the one to see.
    run_without_xla()
    layer, path = offending_layer(model, str(error))
    op = _UNSUPPORTED_OP.search(str(error))
    op = f"op {op.group(1)}" if op else "an op"
    if layer is None:
        where = (
            f"The training step of model '{model.name}' cannot be compiled "
            f"with XLA ({op}; no layer could be named from the error: "
            f"{str(error).strip().splitlines()[0]})."
        )
    else:
        where = (
            f"Layer '{'/'.join(path)}' ({type(layer).__name__}) of model "
            f"'{model.name}' cannot be compiled with XLA: XLA has no kernel "
            f"for its {op}."
        )
    if not fallback:
        raise XLACompileError(
            f"{where} Make the layer XLA-compatible, pass fallback=True to "
            "train without XLA, or jit_compile=False.",
            layer,
        ) from error
    warnings.warn(f"{where} Training without XLA (fallback=True).", stacklevel=4)
    model.jit_compile = False
    _norm_xla.disable(model)


def offending_layer(model, message):
    """The layer that created the op an XLA error names, and its path.

    TensorFlow names every op after the Keras name scopes of the layers that
    called it (`model_1/block_1/dense_1/MatMul`, with `_N` suffixes when a
    scope is entered again); the scopes are matched against the names of the
    model's sublayers, one level at a time.
    """
    match = _NODE.search(message)
    if match is None:
        return None, []
    layer, path = model, []
    for scope in match.group(1).split("/")[:-1]:
        child = _sublayer_named(layer, scope)
        if child is not None:
            layer = child
            path.append(child.name)
    return (layer, path) if path else (None, [])


def _sublayer_named(layer, scope):
    children = _compat.sublayers(layer)
    for name in (scope, re.sub(r"_\d+$", "", scope)):
        for child in children:
            if child.name == name:
                return child
    return None


@contextlib.contextmanager
def _quiet_retracing():
    """Without TensorFlow's warning that "N out of the last M calls ...
    triggered tf.function retracing": each mode's train function is traced
    once, on purpose."""
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tf_logger.setLevel(level)


@contextlib.contextmanager
def _state_restored(model, sample):
    """Leave weights, optimizer state and metrics as before the block."""
    with model.distribute_strategy.scope():
        if not model.built:
            model(sample[0])
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        variables = list(model.weights) + list(model.optimizer.variables)
        values = [keras.ops.convert_to_numpy(v) for v in variables]
        try:
            yield
        finally:
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)
            model.reset_metrics()
