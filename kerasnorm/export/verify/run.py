"""Running an artifact on the verification inputs: a `.tflite` file with the
LiteRT interpreter, a SavedModel with TensorFlow, whole or one step per call
over sequences from zero states. Each artifact runs once per export; its
outputs are compared with every model that must agree with it."""

from __future__ import annotations

import collections
import dataclasses
import os
import time

import numpy as np
import tensorflow as tf

from kerasnorm.export._common.names import step_output_names
from kerasnorm.export._common.staging import path_size
from kerasnorm.export.litert.convert import SIGNATURE_KEY
from kerasnorm.export.litert.runner import Runner
from kerasnorm.export.litert.runner import StreamingRunner
from kerasnorm.export.litert.runner import op_counts
from kerasnorm.export.streaming.step import feed
from kerasnorm.export.verify.delegation import Delegation
from kerasnorm.export.verify.delegation import delegation
from kerasnorm.export.verify.fresh import check_in_fresh_process

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
    runs whole batches only), in the model's output order."""

    kind: str  # "tflite" or "saved_model"
    outputs: list
    inputs: list
    ops: dict
    latency_ms: float
    size_bytes: int
    # XNNPACK's partitions of a `.tflite` file; None for a SavedModel.
    delegation: Delegation | None = None


def artifact_kind(artifact):
    artifact = os.fspath(artifact)
    if artifact.endswith(".tflite"):
        return "tflite"
    if os.path.isdir(artifact):
        return "saved_model"
    raise ValueError(
        "artifact should be a .tflite file or a SavedModel directory. "
        f"Received: artifact={artifact!r}"
    )


def run_whole(artifact, inputs, names, latency_runs=30):
    """Run a whole-model artifact on flat `inputs`; `names` is
    `(input names, output names)` of its signature. A SavedModel is also
    run in another process, as a server loads it, and must give the same
    outputs (`fresh`)."""
    artifact = os.fspath(artifact)
    kind = artifact_kind(artifact)
    in_names, out_names = names
    split = None
    if kind == "tflite":
        with open(artifact, "rb") as f:
            content = f.read()
        runner = Runner(content)
        batch = runner.batch_size
        n = len(inputs[0]) // batch * batch
        if n == 0:
            raise ValueError(
                f"verify needs at least {batch} samples for {artifact} (its "
                "batch size)."
            )
        inputs = [x[:n] for x in inputs]
        chunks = [
            _tflite_call(
                runner, in_names, out_names, [x[i : i + batch] for x in inputs]
            )
            for i in range(0, n, batch)
        ]
        outputs = [np.concatenate(parts) for parts in zip(*chunks, strict=True)]
        first = [x[:batch] for x in inputs]
        latency = median_ms(
            lambda: _tflite_call(runner, in_names, out_names, first), latency_runs
        )
        ops = op_counts(content)
        split = delegation(content)
    else:
        path, fn = _signature(artifact)
        named = {n: tf.constant(x) for n, x in zip(in_names, inputs, strict=True)}
        result = fn(**named)
        outputs = [result[n].numpy() for n in out_names]
        # Where it will run: a server's process (`fresh`).
        check_in_fresh_process(
            path,
            dict(zip(in_names, inputs, strict=True)),
            dict(zip(out_names, outputs, strict=True)),
            label=artifact,
        )
        one = {n: x[:1] for n, x in named.items()}
        latency = median_ms(lambda: fn(**one), latency_runs)
        ops = graph_op_counts(fn)
    return Run(kind, outputs, inputs, ops, latency, path_size(artifact), split)


def run_stream(artifact, step, sequences, latency_runs=30):
    """Run a streaming step artifact over `sequences` from zero states;
    every step's outputs stacked over time. A SavedModel's first step also
    runs in another process (`fresh`)."""
    artifact = os.fspath(artifact)
    kind = artifact_kind(artifact)
    split = None
    if kind == "tflite":
        with open(artifact, "rb") as f:
            content = f.read()
        runner = StreamingRunner(content)
        batch = runner.batch_size
        n = len(sequences) // batch * batch
        if n == 0:
            raise ValueError(
                f"verification needs at least {batch} sequences (the file's "
                "batch size)."
            )
        sequences = sequences[:n]
        chunks = []
        for i in range(0, n, batch):
            runner.reset()
            chunks.append(runner.run(sequences[i : i + batch]))
        outputs = [np.concatenate(parts) for parts in zip(*chunks, strict=True)]
        frame = sequences[:batch, 0]
        latency = median_ms(lambda: runner.step(frame), latency_runs)
        runner.reset()
        ops = op_counts(content)
        split = delegation(content)
    else:
        path, function = _signature(artifact)
        names = step_output_names(len(step.per_step_outputs))
        states = step.initial_states(len(sequences))
        steps = []
        for t in range(sequences.shape[1]):
            feeds = feed(step, sequences[:, t], states)
            result = function(**feeds)
            if t == 0:
                # The first step where it will run: a server's process.
                check_in_fresh_process(
                    path,
                    {k: np.asarray(v) for k, v in feeds.items()},
                    {k: v.numpy() for k, v in result.items()},
                    label=artifact,
                )
            states = [result[s.name].numpy() for s in step.states]
            steps.append([result[name].numpy() for name in names])
        outputs = [np.stack(parts, axis=1) for parts in zip(*steps, strict=True)]
        latency = median_ms(
            lambda: function(**feed(step, sequences[:1, 0])), latency_runs
        )
        ops = graph_op_counts(function)
    # An output after a return_sequences=False layer: the sequence model
    # gives the last step's.
    outputs = [
        y if per_step else y[:, -1]
        for y, per_step in zip(outputs, step.per_step_outputs, strict=True)
    ]
    return Run(kind, outputs, [sequences], ops, latency, path_size(artifact), split)


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
