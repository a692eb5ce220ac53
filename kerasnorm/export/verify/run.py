"""Running an artifact on the verification inputs: a `.tflite` file with the
LiteRT interpreter, a SavedModel with TensorFlow, whole or one step per call
over sequences from zero states. Each artifact runs once per export; its
outputs are compared with every model that must agree with it, and a
SavedModel's first call is kept (`Run.fresh`) for the verifier to repeat in
another process."""

from __future__ import annotations

import collections
import dataclasses
import os
import time

import numpy as np
import tensorflow as tf

from kerasnorm.export.inputs.second_shape import SECOND_SHAPE_SAMPLES
from kerasnorm.export.inputs.second_shape import batch_for_second
from kerasnorm.export.litert.runner import Runner
from kerasnorm.export.litert.runner import StreamingRunner
from kerasnorm.export.litert.runner import op_counts
from kerasnorm.export.naming.names import FRAME
from kerasnorm.export.naming.names import SIGNATURE_KEY
from kerasnorm.export.options.formats import format_of_artifact
from kerasnorm.export.staging.atomic import path_size
from kerasnorm.export.streaming.step import feed
from kerasnorm.export.verify.child import first_run
from kerasnorm.export.verify.delegation import Delegation
from kerasnorm.export.verify.delegation import delegation

# Samples per call when a `.tflite` file's batch is dynamic.
VERIFY_BATCH = 32
# Graph plumbing that says nothing about the work an artifact does.
_PLUMBING = {
    "Const",
    "Identity",
    "IdentityN",
    "NoOp",
    "Placeholder",
    "PartitionedCall",
    "StatefulPartitionedCall",
    "ReadVariableOp",
    "VarHandleOp",
    "_Arg",
    "_Retval",
}


@dataclasses.dataclass
class Run:
    """An artifact's outputs on `inputs` (flat, as run: a `.tflite` file
    runs whole batches only), in the model's output order; `more`: the
    `(inputs, outputs)` of each further shape it ran at (a dynamic
    artifact's second shape); `shapes`: the input shapes of every call
    shape, one tuple of the inputs' shapes each."""

    kind: str  # "tflite" or "saved_model"
    outputs: list
    inputs: list
    ops: dict
    latency_ms: float
    size_bytes: int
    # XNNPACK's partitions of a `.tflite` file; None for a SavedModel.
    delegation: Delegation | None = None
    more: list = dataclasses.field(default_factory=list)
    shapes: tuple = ()
    # A SavedModel's first call, `(directory, feeds, outputs)` by signature
    # name, which must give the same outputs in another process
    # (`fresh.check_in_fresh_process`); None for a `.tflite` file.
    fresh: tuple | None = None


def artifact_kind(artifact):
    """What results call `artifact` (`Verification.kind`): its format's
    `kind`, found by its layout (`formats.format_of_artifact`)."""
    return format_of_artifact(artifact).kind


@dataclasses.dataclass
class _Whole:
    """What a runtime gives `run_whole`: the call on a batch of flat
    inputs, the inputs and outputs run, the artifact's input shapes (None
    where dynamic), its fixed batch (None: dynamic), the batch run, the
    latency, op counts, XNNPACK's partitions and a SavedModel's first call."""

    call: object
    inputs: list
    outputs: list
    shapes: list
    fixed: int | None
    batch: int
    latency: float
    ops: dict
    split: Delegation | None = None
    fresh: tuple | None = None


def _whole_litert(artifact, inputs, names, latency_runs):
    in_names, out_names = names
    # A file LiteRT aborts on is found in a child process (`child`).
    first_run(
        artifact, {n: x[:VERIFY_BATCH] for n, x in zip(in_names, inputs, strict=True)}
    )
    with open(artifact, "rb") as f:
        content = f.read()
    runner = Runner(content)
    shapes = [runner.input_shapes[n] for n in in_names]
    fixed = runner.batch_size
    batch = fixed or min(len(inputs[0]), VERIFY_BATCH)

    def call(arrays):
        return _tflite_call(runner, in_names, out_names, arrays)

    return _whole(
        artifact,
        call,
        inputs,
        shapes,
        fixed,
        batch,
        latency_runs,
        op_counts(content),
        split=delegation(content),
    )


def _whole_tensorflow(artifact, inputs, names, latency_runs):
    in_names, out_names = names
    path, fn = _signature(artifact)
    specs = fn.structured_input_signature[1]
    shapes = [tuple(specs[n].shape.as_list()) for n in in_names]
    fixed = shapes[0][0] if shapes else None

    def call(arrays):
        named = {n: tf.constant(x) for n, x in zip(in_names, arrays, strict=True)}
        result = fn(**named)
        return [result[n].numpy() for n in out_names]

    whole = _whole(
        artifact,
        call,
        inputs,
        shapes,
        fixed,
        fixed or len(inputs[0]),
        latency_runs,
        graph_op_counts(fn),
    )
    whole.fresh = (
        path,
        {n: x[: whole.batch] for n, x in zip(in_names, whole.inputs, strict=True)},
        {n: y[: whole.batch] for n, y in zip(out_names, whole.outputs, strict=True)},
    )
    return whole


def _whole(artifact, call, inputs, shapes, fixed, batch, latency_runs, ops, split=None):
    """The `_Whole` of a runtime's `call`: run over `inputs` in batches of
    `batch` (a last, smaller one where the batch is dynamic), and its
    latency on the fixed batch or one sample."""
    inputs, outputs = _batched(call, inputs, batch, artifact, fixed is None)
    first = [x[: fixed or 1] for x in inputs]
    latency = median_ms(lambda: call(first), latency_runs)
    return _Whole(call, inputs, outputs, shapes, fixed, batch, latency, ops, split)


# How each runtime a format row names (`Format.runtime`) runs a whole model.
_WHOLE = {"litert": _whole_litert, "tensorflow": _whole_tensorflow}


def run_whole(artifact, inputs, names, latency_runs=30, second=None):
    """Run a whole-model artifact on flat `inputs`; `names` is
    `(input names, output names)` of its signature. `second(shapes)`
    (`shapes`: the artifact's input shapes, None where dynamic) gives the
    inputs of a second shape to run at too (`second_shape.second_inputs`),
    or None. A SavedModel's first call is kept in `Run.fresh`."""
    artifact = os.fspath(artifact)
    layout = format_of_artifact(artifact)
    whole = _WHOLE[layout.runtime](artifact, inputs, names, latency_runs)
    call, inputs, batch, fixed = whole.call, whole.inputs, whole.batch, whole.fixed
    run = Run(
        layout.kind,
        whole.outputs,
        inputs,
        whole.ops,
        whole.latency,
        path_size(artifact),
        whole.split,
        fresh=whole.fresh,
    )
    run.shapes = (tuple(x[:batch].shape for x in inputs),)
    extra = None if second is None else second(whole.shapes)
    if extra is not None:
        batch = fixed or batch_for_second(batch)
        extra = _at_least(extra, batch)
        extra, extra_outputs = _batched(call, extra, batch, artifact)
        run.more.append((extra, extra_outputs))
        run.shapes += (tuple(x[:batch].shape for x in extra),)
    return run


def _batched(call, inputs, batch, artifact, partial=False):
    """`(inputs, outputs)`: `call` over batches of `batch` samples of
    `inputs`, the outputs concatenated; the samples left over are dropped,
    or with `partial` (a dynamic batch) run as a last, smaller batch."""
    n = len(inputs[0]) if partial else len(inputs[0]) // batch * batch
    if n == 0:
        raise ValueError(
            f"verify needs at least {batch} samples for {artifact} (its batch size)."
        )
    inputs = [x[:n] for x in inputs]
    chunks = [call([x[i : i + batch] for x in inputs]) for i in range(0, n, batch)]
    return inputs, [np.concatenate(parts) for parts in zip(*chunks, strict=True)]


def _at_least(arrays, batch):
    """`arrays` with their samples repeated up to at least `batch`."""
    count = len(arrays[0])
    if count >= batch:
        return arrays
    reps = -(-batch // count)
    return [np.concatenate([x] * reps) for x in arrays]


@dataclasses.dataclass
class _Stream:
    """What a runtime gives `run_stream`: the call over a batch of
    sequences, the fixed batch (None: dynamic), the batch run, the latency
    of one step, op counts, XNNPACK's partitions, and the first step's
    `(path, feeds, outputs)` once a call has run (a SavedModel's)."""

    call: object
    fixed: int | None
    batch: int
    latency: float
    ops: dict
    split: Delegation | None = None
    first: list = dataclasses.field(default_factory=list)


def _stream_litert(artifact, step, sequences, names, latency_runs):
    first_run(artifact, {FRAME: sequences[:VERIFY_BATCH, 0]})
    with open(artifact, "rb") as f:
        content = f.read()
    runner = StreamingRunner(content)
    fixed = runner.batch_size

    def call(batch_of_sequences):
        runner.reset()
        return runner.run(batch_of_sequences[0])

    batch = fixed or min(len(sequences), VERIFY_BATCH)
    frame = sequences[: fixed or 1, 0]
    runner.reset()
    latency = median_ms(lambda: runner.step(frame), latency_runs)
    runner.reset()
    return _Stream(call, fixed, batch, latency, op_counts(content), delegation(content))


def _stream_tensorflow(artifact, step, sequences, names, latency_runs):
    path, function = _signature(artifact)
    fixed = function.structured_input_signature[1][FRAME].shape[0]
    first = []

    def call(batch_of_sequences):
        (batch_of_sequences,) = batch_of_sequences
        states = step.initial_states(len(batch_of_sequences))
        steps = []
        for t in range(batch_of_sequences.shape[1]):
            feeds = feed(step, batch_of_sequences[:, t], states)
            result = function(**feeds)
            if not first:  # the first step of the first call
                first.append(
                    (
                        path,
                        {k: np.asarray(v) for k, v in feeds.items()},
                        {k: v.numpy() for k, v in result.items()},
                    )
                )
            states = [result[s.name].numpy() for s in step.states]
            steps.append([result[name].numpy() for name in names])
        return [np.stack(parts, axis=1) for parts in zip(*steps, strict=True)]

    batch = fixed or len(sequences)
    latency = median_ms(
        lambda: function(**feed(step, sequences[: fixed or 1, 0])), latency_runs
    )
    return _Stream(call, fixed, batch, latency, graph_op_counts(function), first=first)


# How each runtime a format row names (`Format.runtime`) runs a step.
_STREAM = {"litert": _stream_litert, "tensorflow": _stream_tensorflow}


def run_stream(artifact, step, sequences, names, latency_runs=30):
    """Run a streaming step artifact over `sequences` from zero states;
    every step's outputs (signature `names`, the states aside) stacked over
    time. A step with a dynamic batch runs a second batch size too
    (`Run.more`). A SavedModel's first step is kept in `Run.fresh`."""
    artifact = os.fspath(artifact)
    layout = format_of_artifact(artifact)
    stream = _STREAM[layout.runtime](artifact, step, sequences, names, latency_runs)
    call, batch, fixed = stream.call, stream.batch, stream.fixed
    (sequences,), outputs = _batched(call, [sequences], batch, artifact, fixed is None)
    run = Run(
        layout.kind,
        _last(step, outputs),
        [sequences],
        stream.ops,
        stream.latency,
        0,
        stream.split,
    )
    run.size_bytes = path_size(artifact)
    run.shapes = ((sequences[:batch].shape,),)
    run.fresh = stream.first[0] if stream.first else None
    if fixed is None:
        second = batch_for_second(batch)
        extra = _at_least([sequences[:SECOND_SHAPE_SAMPLES]], second)
        extra, extra_outputs = _batched(call, extra, second, artifact)
        run.more.append((extra, _last(step, extra_outputs)))
        run.shapes += ((extra[0][:second].shape,),)
    return run


def _last(step, outputs):
    """An output after a return_sequences=False layer: the sequence model
    gives the last step's."""
    return [
        y if per_step else y[:, -1]
        for y, per_step in zip(outputs, step.per_step_outputs, strict=True)
    ]


def _tflite_call(runner, in_names, out_names, arrays):
    result = runner.named(dict(zip(in_names, arrays, strict=True)))
    return [result[name] for name in out_names]


def _signature(path):
    if not os.path.exists(os.path.join(path, "saved_model.pb")):
        versions = [d for d in os.listdir(path) if d.isdigit()]
        if not versions:
            raise ValueError(
                f"{path!r} is neither a SavedModel nor a TF Serving base directory."
            )
        path = os.path.join(path, max(versions, key=int))
    return path, tf.saved_model.load(path).signatures[SIGNATURE_KEY]


def median_ms(fn, runs):
    """The median wall time of `runs` calls of `fn` in milliseconds, after
    one untimed call (tracing, allocation)."""
    fn()
    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def graph_op_counts(concrete_function):
    """Op types in a traced function and the functions it calls, plumbing
    aside. Functions only a gradient refers to (a SavedModel keeps its custom
    gradients) are not called when serving and not counted."""
    graph_def = concrete_function.graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}
    counts = collections.Counter()
    seen, nodes = set(), list(graph_def.node)
    while nodes:
        node = nodes.pop()
        if node.op not in _PLUMBING:
            counts[node.op] += 1
        for name in _called(node, library):
            if name not in seen:
                seen.add(name)
                nodes.extend(library[name].node_def)
    return dict(sorted(counts.items()))


def _called(node, library):
    """The library functions `node` calls: as its op, or in a function
    attribute (`PartitionedCall`'s `f`, a `While`'s `cond` and `body`)."""
    names = [node.op] if node.op in library else []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return [name for name in names if name in library]
