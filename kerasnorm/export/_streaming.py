"""Streaming exports: one time step per call, the recurrent states carried by
the caller (`to_tflite(..., streaming=True)`, `to_saved_model(...,
streaming=True)`).

A sequence model `(batch, time, features) -> ...` whose recurrent layers run
forward over time, with layers around them that act on each time step on its
own, is the same function as a step `(x_t, states_{t-1}) -> (y_t, states_t)`
run from zero states. The step is built here from the model's own layers: the
per-step layers are called on a length-1 sequence `x_t[:, None]` (so their
axes mean what they meant in the sequence model), and each recurrent layer is
replaced by one call of its cell, with the layer's own weight objects. The
step has no loop, so every quantize mode, int8 included, converts it.

A layer whose output at step t depends on other steps (a convolution over
time, attention, pooling over time, a backward or bidirectional recurrent
layer, statistics over the time axis) cannot be split that way and is refused
by name. A recurrent layer with `return_sequences=False` ends the time axis:
what follows it sees the last output, and the step computes, at every step,
what the sequence model outputs for the sequence ending there.
"""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm._compat import keras_layers
from kerasnorm._core import check_choice
from kerasnorm.export import _artifacts
from kerasnorm.export import _model
from kerasnorm.export import _parity
from kerasnorm.export import _verify
from kerasnorm.export import litert
from kerasnorm.export._artifacts import ExportConversionError
from kerasnorm.export._artifacts import ExportResult
from kerasnorm.export._artifacts import ExportVerificationError
from kerasnorm.export._folding import fold_batchnorm
from kerasnorm.export._parity import Verification
from kerasnorm.norms._base import AxesNormBase
from kerasnorm.norms._base import ChannelNormBase
from kerasnorm.norms.weight_norm import WeightNorm

# Sequence length of the random verification sequences when the model's
# time axis is undefined and no inputs are given.
DEFAULT_STEPS = 16

_ELEMENTWISE = (
    keras.layers.Activation,
    keras.layers.ReLU,
    keras.layers.LeakyReLU,
    keras.layers.ELU,
    keras.layers.Dropout,
    keras.layers.SpatialDropout1D,
    keras.layers.GaussianNoise,
    keras.layers.GaussianDropout,
    keras.layers.AlphaDropout,
    keras.layers.Identity,
    keras.layers.Add,
    keras.layers.Subtract,
    keras.layers.Multiply,
    keras.layers.Average,
    keras.layers.Maximum,
    keras.layers.Minimum,
)
_CONVOLUTIONS = (
    keras.layers.Conv1D,
    keras.layers.Conv1DTranspose,
    keras.layers.SeparableConv1D,
    keras.layers.DepthwiseConv1D,
)
_ATTENTION = (
    keras.layers.MultiHeadAttention,
    keras.layers.GroupQueryAttention,
    keras.layers.Attention,
    keras.layers.AdditiveAttention,
)
_POOLING = (
    keras.layers.GlobalAveragePooling1D,
    keras.layers.GlobalMaxPooling1D,
    keras.layers.AveragePooling1D,
    keras.layers.MaxPooling1D,
    # Keras 3.15's, not in Keras 3.10.
    *keras_layers("AdaptiveAveragePooling1D", "AdaptiveMaxPooling1D"),
)
_TIME_AXIS = 1


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One recurrent state of the step: its signature name and width."""

    name: str  # `state_<layer>_<i>`
    layer: keras.layers.RNN
    index: int
    size: int


@dataclasses.dataclass
class _Value:
    """A tensor of the step graph; `per_step` tells a time step `(batch, 1,
    ...)` of a sequence tensor from the result of a `return_sequences=False`
    layer `(batch, ...)`. `tensor` is None while the model is only checked."""

    tensor: object
    per_step: bool


class StepPlan:
    """The step function of a sequence model, checked: what it takes and gives.

    Raises `ExportConversionError` naming the first layer that mixes time
    steps, and `ValueError` for a model that is not a sequence model.
    """

    def __init__(self, model: keras.Model):
        _model.check_model(model)
        self.model = model
        self.graph = functional_of(model)
        if self.graph is None:
            raise ValueError(
                "streaming=True needs a Functional or Sequential model, whose "
                "layers can be called one time step at a time. Received: a "
                f"{type(model).__name__}"
            )
        if len(model.inputs) != 1 or len(model.inputs[0].shape) != 3:
            shapes = [tuple(x.shape) for x in model.inputs]
            raise ValueError(
                "streaming=True needs a model with one sequence input of shape "
                f"(batch, time, features). Received input shape(s) {shapes}"
            )
        sequence = model.inputs[0]
        if sequence.shape[-1] is None:
            raise ValueError(
                "streaming=True needs the feature size of the input defined. "
                f"Received input shape {tuple(sequence.shape)}"
            )
        self.steps = sequence.shape[_TIME_AXIS]  # None: any length
        self.frame_shape = (int(sequence.shape[-1]),)
        self.dtype = keras.backend.standardize_dtype(sequence.dtype)
        self.states: list[StateSpec] = []
        self._seen = set()
        outputs = self._walk(None, None)
        self.per_step_outputs = [value.per_step for value in outputs]

    def initial_states(self, batch):
        """Zero states for `batch` streams, in `states` order."""
        return [np.zeros((batch, s.size), "float32") for s in self.states]

    def step(self, frame, states):
        """`(outputs, new_states)` of one time step: `frame` is `(batch,
        features)`, `states` a list in `self.states` order."""
        by_layer = {}
        for spec, state in zip(self.states, states, strict=True):
            by_layer.setdefault(id(spec.layer), []).append(state)
        new = {}
        outputs = self._walk(frame, (by_layer, new))
        values = [v.tensor[:, 0] if v.per_step else v.tensor for v in outputs]
        new_states = [new[id(s.layer)][s.index] for s in self.states]
        return values, new_states

    def _walk(self, frame, states):
        """Run (states given) or check (`frame` None) the graph, one step."""
        start = {id(self.graph.inputs[0]): _Value(frame, True)}
        if frame is not None:
            start[id(self.graph.inputs[0])].tensor = ops.expand_dims(frame, 1)
        values = self._run_graph(self.graph, start, states)
        return [values[id(t)] for t in keras.tree.flatten(self.graph.outputs)]

    def _run_graph(self, graph, values, states):
        for node in graph_nodes(graph):
            ins = [values[id(t)] for t in node.inputs]
            inner = functional_of(node.operation)
            if inner is not None:
                sub = {
                    id(t): v
                    for t, v in zip(keras.tree.flatten(inner.inputs), ins, strict=True)
                }
                sub = self._run_graph(inner, sub, states)
                outs = [sub[id(t)] for t in keras.tree.flatten(inner.outputs)]
            else:
                outs = self._call(node, ins, states)
            for tensor, value in zip(node.outputs, outs, strict=True):
                values[id(tensor)] = value
        return values

    def _call(self, node, ins, states):
        layer = node.operation
        if isinstance(layer, keras.layers.RNN):
            return [self._recurrent(layer, ins, states)]
        per_step = [v.per_step for v in ins]
        if not any(per_step):
            # After the time axis ended every layer sees whole-sequence values.
            problem = None
        elif not all(per_step):
            problem = (
                "combines a time step with the output of a return_sequences="
                "False layer, which depends on the whole sequence"
            )
        else:
            problem = mixing_problem(layer)
        if problem:
            _refuse(layer, problem)
        if states is None:
            return [_Value(None, any(per_step)) for _ in node.outputs]
        args = [v.tensor for v in ins]
        result = layer(args if len(args) > 1 else args[0], training=False)
        results = keras.tree.flatten(result)
        return [_Value(t, any(per_step)) for t in results]

    def _recurrent(self, layer, ins, states):
        problem = recurrent_problem(layer)
        if problem is None and len(ins) != 1:
            problem = "is called with initial states; the step starts from zeros"
        if problem is None and not ins[0].per_step:
            problem = (
                "runs over the output of a return_sequences=False layer, "
                "which depends on the whole sequence"
            )
        if problem is None and states is None and id(layer) in self._seen:
            problem = "is called more than once; each call would need its own state"
        if problem:
            _refuse(layer, problem)
        sizes = [int(s) for s in keras.tree.flatten(layer.cell.state_size)]
        if states is None:
            self._seen.add(id(layer))
            self.states.extend(
                StateSpec(
                    f"{litert.STATE_PREFIX}{_artifacts.safe_name(layer.name)}_{i}",
                    layer,
                    i,
                    size,
                )
                for i, size in enumerate(sizes)
            )
            return _Value(None, layer.return_sequences)
        by_layer, new = states
        structure = (
            layer.cell.state_size
            if keras.tree.is_nested(layer.cell.state_size)
            else [layer.cell.state_size]
        )
        previous = keras.tree.pack_sequence_as(structure, by_layer[id(layer)])
        output, next_states = layer.cell(ins[0].tensor[:, 0], previous, training=False)
        new[id(layer)] = keras.tree.flatten(next_states)
        if layer.return_sequences:
            output = ops.expand_dims(output, 1)
        return _Value(output, layer.return_sequences)


def _refuse(layer, problem):
    raise ExportConversionError(
        f"Cannot export layer {layer.name!r} ({type(layer).__name__}) as a "
        f"streaming step: it {problem}. A streaming step sees one time step "
        "per call; export the model without streaming=True for whole "
        "sequences."
    )


def recurrent_problem(layer):
    """Why recurrent `layer` cannot run one step per call, or None."""
    if layer.go_backwards:
        return (
            "runs with go_backwards=True, from the last time step to the "
            "first: its first output needs the whole sequence"
        )
    if layer.return_state:
        return (
            "returns its states (return_state=True); the streaming step "
            "returns every state as a signature output already"
        )
    if layer.stateful:
        return (
            "is stateful: its state carries across calls inside the model; "
            "export a stateless copy (same weights) and let the app carry the "
            "step's state outputs"
        )
    return None


def mixing_problem(layer):
    """Why a non-recurrent `layer` on a time step mixes time steps, or None."""
    for classes, rule in _RULES:
        if isinstance(layer, classes):
            return rule(layer)
    return (
        "is not a layer known to act on each time step on its own (known: "
        "Dense, activations, Dropout, merges, feature-axis norms, "
        "TimeDistributed, recurrent layers)"
    )


def _no_problem(layer):
    return None


def _convolution_problem(layer):
    if tuple(layer.kernel_size) == (1,) and tuple(layer.strides) == (1,):
        return None
    return (
        f"convolves over time (kernel_size={tuple(layer.kernel_size)}, "
        f"strides={tuple(layer.strides)}): each output needs neighbouring "
        "time steps"
    )


def _axes_problem(axis, verb):
    axes = [axis] if isinstance(axis, int) else list(axis)
    if any(a % 3 == _TIME_AXIS for a in axes):
        return f"{verb} over the time axis (axis={axis})"
    return None


# The first rule whose classes match decides; a layer no rule matches is
# refused (a layer kerasnorm does not know may look at any time step).
_RULES = (
    (
        keras.layers.Bidirectional,
        lambda layer: (
            "is bidirectional: its backward half starts from the last time "
            "step, so every output needs the whole sequence"
        ),
    ),
    # Dense acts on the last axis; TimeDistributed's layer sees one step.
    ((*_ELEMENTWISE, keras.layers.Dense, keras.layers.TimeDistributed), _no_problem),
    (WeightNorm, lambda layer: mixing_problem(layer.layer)),
    (_CONVOLUTIONS, _convolution_problem),
    (_ATTENTION, lambda layer: "attends over the time steps of the sequence"),
    (_POOLING, lambda layer: "pools over the time axis"),
    (
        ChannelNormBase,
        lambda layer: (
            "computes its statistics over the time axis (the spatial axes of "
            "a (batch, time, channels) input)"
        ),
    ),
    (
        (AxesNormBase, keras.layers.LayerNormalization, keras.layers.UnitNormalization),
        lambda layer: _axes_problem(layer.axis, "normalizes"),
    ),
    (keras.layers.Softmax, lambda layer: _axes_problem(layer.axis, "takes a softmax")),
    # At inference a per-feature affine map, unless its feature axis is time.
    (
        keras.layers.BatchNormalization,
        lambda layer: _axes_problem(layer.axis, "has its statistics per position"),
    ),
    (keras.layers.Concatenate, lambda layer: _axes_problem(layer.axis, "concatenates")),
)


def _tflite_modes():
    """`to_tflite`'s quantize modes, read at call time: `_tflite` imports this
    module, and a mode added there applies here too."""
    from kerasnorm.export._tflite import QUANTIZE_MODES

    return QUANTIZE_MODES


def to_tflite(
    model,
    path,
    *,
    fold,
    quantize,
    representative_data,
    int8_io,
    calibration_samples,
    batch_size,
    overwrite,
    verify_inputs,
    tolerance,
    progress,
    verbose,
):
    """`to_tflite(..., streaming=True)`; its docstring says what is written."""
    from kerasnorm.export._tflite import VERIFY_SAMPLES

    path = _check_tflite_arguments(path, quantize, representative_data, int8_io)
    StepPlan(model)  # refuse before any work, naming the user's layer
    _artifacts.refuse_existing(path, overwrite)
    calibration = None
    if representative_data is not None:
        calibration = _artifacts.as_input_list(
            model, representative_data, "representative_data"
        )[0]
    if verify_inputs is None and calibration is not None:
        verify_inputs = calibration[: max(batch_size, VERIFY_SAMPLES)]
    sequences = _verify_sequences(model, verify_inputs)

    report = None
    exported = model
    if fold:
        exported, report = fold_batchnorm(model, return_report=True)
    plan = StepPlan(exported)
    kwargs = _converter_options(quantize, int8_io)
    if quantize in ("int8", "int16x8"):
        kwargs["representative_dataset"] = _calibration_feed(
            plan, calibration, calibration_samples, batch_size, progress
        )
    try:
        step = _concrete_step(plan, batch_size)
        if quantize == "int16x8":
            from kerasnorm.export import _unroll

            step = _unroll.square_as_mul(step)
        content = litert.convert(
            exported,
            function=step,
            verbose=verbose,
            **kwargs,
        )
    except Exception as err:
        raise ExportConversionError(
            f"TFLite conversion of the streaming step failed: {str(err)[:2000]}"
        ) from err
    if tolerance is None:
        tolerance = _parity.DEFAULT_TOLERANCE[quantize]
    with _artifacts.staged(path, directory=False, suffix=".tflite") as tmp:
        with open(tmp, "wb") as f:
            f.write(content)
        runner = litert.StreamingRunner(content)
        check = _check(
            model,
            plan,
            sequences,
            _tflite_stream(runner),
            kind="tflite",
            artifact=tmp,
            label=path,
            ops=litert.op_counts(content),
            tolerance=tolerance,
            criterion=_parity.CRITERION[quantize],
            latency_ms=_step_latency(runner, sequences),
        )
    return ExportResult(
        path=path,
        kind="tflite",
        quantize=quantize,
        size_bytes=len(content),
        fold_report=report,
        verification=check,
    )


def _check_tflite_arguments(path, quantize, representative_data, int8_io):
    path = os.fspath(path)
    if not path.endswith(".tflite"):
        raise ValueError(f"path should end in '.tflite'. Received: path={path!r}")
    check_choice(quantize, _tflite_modes(), "quantize")
    if quantize not in _STEP_MODES:
        raise ValueError(
            f"streaming=True supports quantize={list(_STEP_MODES)}. "
            f"Received: quantize={quantize!r}"
        )
    if os.path.isdir(path):
        raise ValueError(f"path is a directory: {path!r}. Give a .tflite file path.")
    if quantize in ("int8", "int16x8") and representative_data is None:
        raise ValueError(
            f"quantize={quantize!r} calibrates activation ranges and needs "
            "representative_data (a few hundred typical sequences). Received: "
            "representative_data=None"
        )
    if int8_io and quantize != "int8":
        raise ValueError(
            f'int8_io=True needs quantize="int8". Received: quantize={quantize!r}'
        )
    return path


# The modes whose converter settings `_converter_options` knows: a mode
# `to_tflite` learns later is refused here rather than written unquantized.
_STEP_MODES = (None, "float16", "dynamic", "int8", "int16x8")


def _converter_options(quantize, int8_io):
    kwargs = {}
    if quantize is not None:
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        kwargs["supported_types"] = [tf.float16]
    if quantize in ("int8", "int16x8"):
        kwargs["full_integer"] = True
    if quantize == "int16x8":
        kwargs["int16_activations"] = True
    if quantize == "int8":
        if int8_io:
            kwargs["inference_input_type"] = tf.int8
            kwargs["inference_output_type"] = tf.int8
    return kwargs


def to_saved_model(model, target, *, fold, overwrite, verify_inputs, tolerance):
    """`to_saved_model(..., streaming=True)` into version directory `target`."""
    StepPlan(model)
    _artifacts.refuse_existing(target, overwrite)
    sequences = _verify_sequences(model, verify_inputs)
    report = None
    exported = model
    if fold:
        exported, report = fold_batchnorm(model, return_report=True)
    plan = StepPlan(exported)
    archive = keras.export.ExportArchive()
    archive.track(exported)
    archive.add_endpoint(
        litert.SIGNATURE_KEY, _step_function(plan), input_signature=_specs(plan, None)
    )
    with _artifacts.staged(target, directory=True) as tmp:
        archive.write_out(
            tmp,
            verbose=False,
            options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
        )
        function = tf.saved_model.load(tmp).signatures[litert.SIGNATURE_KEY]
        check = _check(
            model,
            plan,
            sequences,
            _saved_model_stream(plan, function),
            kind="saved_model",
            artifact=tmp,
            label=target,
            ops=_verify.graph_op_counts(function),
            tolerance=tolerance,
            criterion="max",
            latency_ms=_verify.median_ms(
                lambda: function(**_feed(plan, sequences[:1, 0])), 30
            ),
        )
    return ExportResult(
        path=target,
        kind="saved_model",
        quantize=None,
        size_bytes=check.size_bytes,
        fold_report=report,
        verification=check,
    )


def _specs(plan, batch):
    specs = [tf.TensorSpec((batch, *plan.frame_shape), plan.dtype, name=litert.FRAME)]
    specs += [
        tf.TensorSpec((batch, s.size), "float32", name=s.name) for s in plan.states
    ]
    return specs


def _step_function(plan):
    """The signature function: named outputs `output_<i>` and the states."""

    def serve(x, *states):
        outputs, new_states = plan.step(x, list(states))
        named = {f"output_{i}": y for i, y in enumerate(outputs)}
        for spec, state in zip(plan.states, new_states, strict=True):
            named[spec.name] = state
        return named

    return serve


def _concrete_step(plan, batch_size):
    function = tf.function(
        _step_function(plan), input_signature=_specs(plan, batch_size)
    )
    return function.get_concrete_function()


def _feed(plan, frame, states=None):
    states = plan.initial_states(len(frame)) if states is None else states
    feed = {litert.FRAME: tf.constant(frame)}
    feed.update(
        {s.name: tf.constant(v) for s, v in zip(plan.states, states, strict=True)}
    )
    return feed


def _verify_sequences(model, verify_inputs):
    if verify_inputs is not None:
        return _artifacts.as_input_list(model, verify_inputs, "verify_inputs")[0]
    return _parity.sample_inputs(model, 8, sizes=(DEFAULT_STEPS,))[0]


def _states_forward(plan, sequences):
    """Every step's frame and incoming states over `sequences`, run through
    the float step: `(frames, states)`, each `(time * batch, ...)`."""
    step = tf.function(lambda x, states: plan.step(x, states))
    states = [tf.constant(s) for s in plan.initial_states(len(sequences))]
    frames, seen = [], [[] for _ in plan.states]
    for t in range(sequences.shape[1]):
        frames.append(sequences[:, t])
        for kept, state in zip(seen, states, strict=True):
            kept.append(np.asarray(state))
        _, states = step(tf.constant(sequences[:, t]), states)
    return np.concatenate(frames), [np.concatenate(s) for s in seen]


def _calibration_feed(plan, sequences, samples, batch_size, progress):
    """int8 calibration samples of the step: frames with the states the float
    model reaches there, spread evenly over the sequences and their steps."""
    frames, states = _states_forward(plan, sequences)
    n = min(len(frames), samples) // batch_size * batch_size
    if n == 0:
        raise ValueError(
            f"representative_data has {len(frames)} time steps, fewer than the "
            f"batch size {batch_size}."
        )
    chosen = np.linspace(0, len(frames) - 1, n).round().astype(int)

    def generate():
        bar = None
        if progress:
            print(f"Calibrating int8 on {n} time steps:")
            bar = keras.utils.Progbar(n, unit_name="step")
        for i in range(0, n, batch_size):
            rows = chosen[i : i + batch_size]
            feed = {litert.FRAME: frames[rows].astype("float32")}
            for spec, state in zip(plan.states, states, strict=True):
                feed[spec.name] = state[rows]
            yield feed
            if bar is not None:
                bar.update(i + batch_size)

    return generate


def _tflite_stream(runner):
    def run(sequences):
        batch = runner.batch_size
        n = len(sequences) // batch * batch
        if n == 0:
            raise ValueError(
                f"verification needs at least {batch} sequences (the file's "
                "batch size)."
            )
        chunks = []
        for i in range(0, n, batch):
            runner.reset()
            chunks.append(runner.run(sequences[i : i + batch]))
        return [np.concatenate(parts) for parts in zip(*chunks, strict=True)]

    return run


def _saved_model_stream(plan, function):
    def run(sequences):
        states = plan.initial_states(len(sequences))
        steps = []
        for t in range(sequences.shape[1]):
            result = function(**_feed(plan, sequences[:, t], states))
            states = [result[s.name].numpy() for s in plan.states]
            steps.append(
                [
                    result[f"output_{i}"].numpy()
                    for i in range(len(plan.per_step_outputs))
                ]
            )
        return [np.stack(parts, axis=1) for parts in zip(*steps, strict=True)]

    return run


def _step_latency(runner, sequences):
    frame = sequences[: runner.batch_size, 0]
    latency = _verify.median_ms(lambda: runner.step(frame), 30)
    runner.reset()
    return latency


def _check(
    model,
    plan,
    sequences,
    stream,
    *,
    kind,
    artifact,
    label,
    ops,
    tolerance,
    criterion,
    latency_ms,
):
    """Run the step artifact over `sequences` from zero states and compare
    every step's outputs with the sequence model's (the last step's, for
    outputs after a return_sequences=False layer)."""
    stepped = stream(sequences)
    sequences = sequences[: len(stepped[0])]
    expected = [
        np.asarray(y, "float32")
        for y in keras.tree.flatten(model(sequences, training=False))
    ]
    got = [
        y if per_step else y[:, -1]
        for y, per_step in zip(stepped, plan.per_step_outputs, strict=True)
    ]
    abs_err, max_rel, rms_rel = _parity.errors(got, expected)
    result = Verification(
        artifact=label,
        kind=kind,
        size_bytes=_artifacts.path_size(artifact),
        ops=ops,
        max_abs_error=abs_err,
        max_rel_error=max_rel,
        rms_rel_error=rms_rel,
        tolerance=tolerance,
        criterion=criterion,
        latency_ms=latency_ms,
        samples=len(sequences),
    )
    if not result.passed:
        raise ExportVerificationError(
            f"Streaming parity check failed for {label}: the step run over "
            f"{sequences.shape[1]} time steps from zero states differs from "
            f"the sequence model by a {criterion} error of "
            f"{result.checked_error:.3e} of the output scale, above the "
            f"tolerance {tolerance:.3g}. {result}"
        )
    return result
