"""Run an exported artifact and compare it with the Keras model."""

from __future__ import annotations

import collections
import os
import time

import keras
import numpy as np

from kerasnorm._core import check_choice
from kerasnorm.export import _artifacts
from kerasnorm.export import _model
from kerasnorm.export import litert
from kerasnorm.export._arguments import UNSET
from kerasnorm.export._arguments import renamed
from kerasnorm.export._artifacts import ExportVerificationError
from kerasnorm.export._parity import CRITERION
from kerasnorm.export._parity import DEFAULT_TOLERANCE
from kerasnorm.export._parity import Verification
from kerasnorm.export._parity import errors
from kerasnorm.export._parity import float64_recheck

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


def verify(
    model: keras.Model,
    artifact: str | os.PathLike,
    verify_inputs=None,
    *,
    quantize: str | None = None,
    tolerance: float | None = None,
    samples: int = 8,
    latency_runs: int = 30,
    raise_on_failure: bool = True,
    inputs=UNSET,
) -> Verification:
    """Run `artifact` and compare its outputs with `model`'s.

    Args:
        model: the Keras model the artifact was exported from (unfolded is
            fine: folding must not change the function).
        artifact: a `.tflite` file (run with the LiteRT interpreter), a
            SavedModel directory, or a TF Serving base directory (the highest
            version is used); its `serving_default` signature is called.
        verify_inputs: model inputs (an array, a list of arrays, a dict by
            input name or a `tf.data.Dataset`), batch first; all of them are
            run. Defaults to `samples` random samples (`fold_batchnorm` says
            how they are made).
        quantize: the quantize mode the artifact was exported with; it
            chooses what is checked: max |artifact - keras| / max |keras|
            for `None` and `"float16"`, and rms(artifact - keras) /
            rms(keras) for `"dynamic"`, `"int8"` and `"int16x8"` (see
            `DEFAULT_TOLERANCE` for why). Defaults to `None`.
        tolerance: the largest allowed error of that kind. Defaults to
            `DEFAULT_TOLERANCE[quantize]`.
        samples: how many random samples when `verify_inputs` is None.
            Defaults to `8`.
        latency_runs: calls timed for the median latency (batch of one TFLite
            call, or one sample for a SavedModel). Defaults to `30`.
        raise_on_failure: raise `ExportVerificationError` when the error
            exceeds `tolerance`. Defaults to `True`.
        inputs: deprecated alias of `verify_inputs` (warns).

    Returns:
        A `Verification`: errors, op counts, size in bytes, latency per call.
    """
    verify_inputs = renamed("verify", "verify_inputs", verify_inputs, "inputs", inputs)
    check_choice(quantize, tuple(CRITERION), "quantize")
    return check(
        model,
        artifact,
        verify_inputs,
        tolerance=DEFAULT_TOLERANCE[quantize] if tolerance is None else tolerance,
        criterion=CRITERION[quantize],
        samples=samples,
        latency_runs=latency_runs,
        raise_on_failure=raise_on_failure,
    )


def check(
    model,
    artifact,
    inputs,
    *,
    tolerance,
    criterion,
    samples=8,
    latency_runs=30,
    raise_on_failure=True,
    label=None,
):
    """`verify`, reporting the artifact as `label`: the exporters run it on a
    temporary path and name the final one, where the file would have gone."""
    _model.check_model(model)
    artifact = os.fspath(artifact)
    inputs = _artifacts.check_inputs(model, inputs, samples)
    if artifact.endswith(".tflite"):
        kind = "tflite"
        got, ops, latency = _run_tflite(artifact, inputs, latency_runs)
    elif os.path.isdir(artifact):
        kind = "saved_model"
        got, ops, latency = _run_saved_model(model, artifact, inputs, latency_runs)
    else:
        raise ValueError(
            "artifact should be a .tflite file or a SavedModel directory. "
            f"Received: artifact={artifact!r}"
        )
    label = artifact if label is None else os.fspath(label)
    expected = [
        np.asarray(y, "float32")
        for y in keras.tree.flatten(model(inputs if len(inputs) > 1 else inputs[0]))
    ]
    if len(got) != len(expected):
        raise ExportVerificationError(
            f"{label} has {len(got)} outputs, the model {len(expected)}."
        )
    abs_err, max_rel, rms_rel = errors(got, expected)
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
        latency_ms=latency,
        samples=len(inputs[0]),
    )
    if criterion == "max" and result.checked_error > tolerance:
        float64_recheck(
            result, model, _artifacts.as_model_inputs(model, inputs), got, expected
        )
    if raise_on_failure and not result.passed:
        raise ExportVerificationError(
            f"Export parity check failed for {label}: the {criterion} error is "
            f"{result.checked_error:.3e} of the output scale, above the "
            f"tolerance {tolerance:.3g}. {result}"
        )
    return result


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


def _run_tflite(path, inputs, latency_runs):
    with open(path, "rb") as f:
        content = f.read()
    runner = litert.Runner(content)
    batch = runner.batch_size
    n = len(inputs[0]) // batch * batch
    if n == 0:
        raise ValueError(
            f"verify needs at least {batch} samples for {path} (its batch size)."
        )
    chunks = [runner([x[i : i + batch] for x in inputs]) for i in range(0, n, batch)]
    outputs = [np.concatenate(parts) for parts in zip(*chunks, strict=True)]
    first = [x[:batch] for x in inputs]
    latency = median_ms(lambda: runner(first), latency_runs)
    if n < len(inputs[0]):
        inputs[:] = [x[:n] for x in inputs]
    return outputs, litert.op_counts(content), latency


def _saved_model_dir(path):
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = [d for d in os.listdir(path) if d.isdigit()]
    if not versions:
        raise ValueError(
            f"{path!r} is neither a SavedModel nor a TF Serving base directory."
        )
    return os.path.join(path, max(versions, key=int))


def _run_saved_model(model, path, inputs, latency_runs):
    import tensorflow as tf

    loaded = tf.saved_model.load(_saved_model_dir(path))
    fn = loaded.signatures["serving_default"]
    in_names = _artifacts.input_names(model)
    out_names = _artifacts.output_names(model)
    feed = {n: tf.constant(x) for n, x in zip(in_names, inputs, strict=True)}
    result = fn(**feed)
    outputs = [result[n].numpy() for n in out_names]
    one = {n: x[:1] for n, x in feed.items()}
    latency = median_ms(lambda: fn(**one), latency_runs)
    return outputs, graph_op_counts(fn), latency


def graph_op_counts(concrete_function):
    """Op types in a traced function and the functions it calls, plumbing aside."""
    graph_def = concrete_function.graph.as_graph_def()
    counts = collections.Counter(n.op for n in graph_def.node if n.op not in _PLUMBING)
    for function in graph_def.library.function:
        counts.update(n.op for n in function.node_def if n.op not in _PLUMBING)
    return dict(sorted(counts.items()))
