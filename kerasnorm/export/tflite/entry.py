"""Where a quantized file's error enters: the layer a failed check names.

A quantized file (`"float16"`, `"dynamic"`, `"int8"`, `"int16x8"`) that
fails its parity check is refused with the error at the model's output;
the layer the rounding hurt is usually far upstream (a norm over one
value, whose sign int8 flips; an InstanceNorm whose shift cancels its
scaled input). `entry_layer` finds it: the file's
float32 twin (the same graph converted unquantized, `tflite.write.
float_twin`, so its tensors carry the same names) and the quantized file
run side by side on the verification inputs, without a delegate and with
every intermediate tensor kept, in a child process (the file just failed;
a crash there must not end the caller's). Tensor by tensor, in the
quantized file's op order, the rms of the difference relative to the
float tensor's rms (floored at a hundredth of the median tensor's, so that
a tensor that is 0 in float does not divide by 0); the first op whose
error is above the check's tolerance (or above half the largest error,
when rounding builds up below it everywhere) is where the error enters,
and the trace the file was converted from names its layer.

A file LiteRT refused to prepare (`"Node number N (OP) failed to
prepare"`) is named the same way, from op N's output tensor.

It costs one more float32 conversion and two runs of a few samples, only
when a check has failed; anything going wrong on the way gives no hint,
never another error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm._compat import interpreter_ops
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.model.op_layers import OUTSIDE
from kerasnorm.export.model.op_layers import tensor_layer
from kerasnorm.export.numerics.errors import with_sentence
from kerasnorm.export.tflite.write import float_twin
from kerasnorm.export.verify.child import FEED_SOURCE

# Samples each file is run on, one at a time (a fixed-batch file takes 1).
SAMPLES = 8
# A child that has not answered by then gives no hint.
TIMEOUT_S = 300
# Tensors whose float rms is below this fraction of the median tensor's are
# compared against that floor instead.
FLOOR = 0.01

_LOCATE_SOURCE = (
    FEED_SOURCE
    + r"""
from ai_edge_litert.interpreter import Interpreter, OpResolverType


def stripped(name):
    # The quantized file's names carry the calls the graph was inlined
    # through; the float file's may not.
    return ";".join(
        part.replace("StatefulPartitionedCall/", "").replace("PartitionedCall/", "")
        for part in name.split(";")
    )


def run(path, given, samples):
    interpreter = Interpreter(
        model_path=path,
        experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    runner = interpreter.get_signature_runner("serving_default")
    details = runner.get_input_details()
    tensors = interpreter.get_tensor_details()
    values = {}
    for i in range(samples):
        runner(**fitted({n: x[i : i + 1] for n, x in given.items()}, details))
        for t in tensors:
            try:
                a = interpreter.get_tensor(t["index"])
            except ValueError:
                continue
            if a is None or a.size == 0 or a.dtype == np.bool_:
                continue
            scale, zero = t["quantization"]
            a = a.astype(np.float64)
            if scale:
                a = (a - zero) * scale
            values.setdefault(t["index"], []).append(a)
    stacked = {}
    for index, parts in values.items():
        try:
            stacked[index] = np.stack(parts)
        except ValueError:
            pass
    names = {t["index"]: t["name"] for t in tensors}
    return interpreter, stacked, names


path_float, path_quantized, feeds = json.loads(sys.stdin.readline())
with np.load(feeds, allow_pickle=False) as archive:
    given = {n: archive[n] for n in archive.files}
samples = min(len(x) for x in given.values())
_, floats, float_names = run(path_float, given, samples)
by_name = {stripped(float_names[i]): a for i, a in floats.items()}
interpreter, quantized_values, names = run(path_quantized, given, samples)
rows = []
# `_compat.interpreter_ops`: the op list LiteRT has only privately.
for op in interpreter._get_ops_details():
    outputs = [int(t) for t in op["outputs"] if int(t) >= 0]
    # A type conversion computes nothing, and its output's name is derived
    # (it may be another tensor's name in the float file).
    if not outputs or op["op_name"] in ("QUANTIZE", "DEQUANTIZE"):
        continue
    name = names[outputs[0]]
    q = quantized_values.get(outputs[0])
    f = by_name.get(stripped(name))
    if q is None or f is None or q.shape != f.shape:
        continue
    diff = float(np.sqrt(np.mean((q - f) ** 2)))
    ref = float(np.sqrt(np.mean(f**2)))
    # The tensors that can name the op's layer: its output, its constants
    # (a kernel, a bias).
    inputs = [names[int(t)] for t in op["inputs"] if int(t) >= 0]
    rows.append([op["op_name"], [name, *inputs[1:]], diff, ref])
print(json.dumps(rows), flush=True)
"""
)

# A tensor of the model's outputs, as the converter names it.
_SIGNATURE_OUTPUT = re.compile(r"(?:^|/)(?:Stateful)?PartitionedCall:(\d+)")
_PREPARE = re.compile(r"Node number (\d+) \((\w+)\) failed to prepare")


def with_entry_hint(err, prepared, path):
    """`err` (a failed check of the file at `path`) with a sentence naming
    the layer where the error enters, after its first sentence, for a
    quantized file (the `.tflite` row's `Format.failure_hint`); `err`
    itself for a float32 file or a streaming step, or when the layer cannot
    be found."""
    if prepared.options.mode.weights is None:
        return err
    if prepared.streaming:
        return err
    text = str(err)
    try:
        if "above the tolerance" in text:
            hint = _parity_hint(prepared, path)
        else:
            hint = _prepare_hint(text, prepared, path)
    except Exception:
        hint = None
    if not hint:
        return err
    return with_sentence(err, hint)


def _parity_hint(prepared, path):
    """The sentence for a parity failure: the layer of the first op whose
    error is above the tolerance (`entry_layer`)."""
    found = entry_layer(prepared, path)
    if found is None:
        return None
    layer, op, error = found
    return (
        f"The error enters at layer {_quoted(layer)} (its {op} op: rms "
        f"{error:.3g} of the float32 file's tensor there, every op before it "
        "below). Change that layer or the range of its input, or export with "
        "quantize='dynamic' (int8 weights, float activations) or None."
    )


def _prepare_hint(text, prepared, path):
    """The sentence for a file LiteRT would not prepare: the layer of the
    node it names."""
    match = _PREPARE.search(text)
    if match is None:
        return None
    index, op = int(match.group(1)), match.group(2)
    with open(path, "rb") as f:
        interpreter = unallocated(f.read())
    details = interpreter_ops(interpreter)
    if index >= len(details) or details[index]["op_name"] != op:
        return None
    outputs = [int(t) for t in details[index]["outputs"] if int(t) >= 0]
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    _, ops = float_twin(prepared)
    inputs = [int(t) for t in details[index]["inputs"] if int(t) >= 0]
    tensors = [names[t] for t in (*outputs, *inputs[1:])]
    layer = _op_layer(tensors, ops, prepared.exported)
    return f"Node {index} ({op}) is computed by layer {_quoted(layer)}."


def entry_layer(prepared, path, tolerance=None):
    """`(layer, op type, error)` where the quantized file at `path` first
    departs from its float32 twin (module docstring), or None."""
    tolerance = prepared.tolerance if tolerance is None else tolerance
    content, ops = float_twin(prepared)
    rows = _compare(content, path, prepared.verify_inputs, prepared.inputs.names)
    if not rows:
        return None
    refs = [ref for _, _, _, ref in rows if ref > 0]
    floor = FLOOR * float(np.median(refs)) if refs else 0.0
    errors = [diff / max(ref, floor, 1e-30) for _, _, diff, ref in rows]
    threshold = min(tolerance, max(errors) / 2)
    for (op, tensors, _, _), error in zip(rows, errors, strict=True):
        if error > threshold:
            return _op_layer(tensors, ops, prepared.exported), op, error
    return None


def _compare(content, path, inputs, names):
    """The child's rows `[op type, tensor names, rms diff, rms float]`, one
    per op of the quantized file, in its order."""
    with tempfile.TemporaryDirectory(prefix="kerasnorm-entry-") as tmp:
        float_path = os.path.join(tmp, "float.tflite")
        with open(float_path, "wb") as f:
            f.write(content)
        feeds = os.path.join(tmp, "inputs.npz")
        np.savez(
            feeds,
            **{n: np.asarray(x)[:SAMPLES] for n, x in zip(names, inputs, strict=True)},
        )
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        done = subprocess.run(
            [sys.executable, "-P", "-c", _LOCATE_SOURCE],
            input=json.dumps([float_path, os.fspath(path), feeds]) + "\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _op_layer(tensors, ops, model):
    """The layer of an op, from the names of its tensors (output first, then
    its constants): the first that a recorded layer created; for an op
    whose output is the model's (named after the signature,
    `PartitionedCall:0`, its kernel maybe `arith.constant2`), the layer
    computing that output of `model`; else the output's name."""
    for name in tensors:
        layer = tensor_layer(name, ops)
        if layer != name:
            return layer
    match = _SIGNATURE_OUTPUT.search(tensors[0])
    layer = match and _output_layer(model, int(match.group(1)))
    return layer or tensors[0]


def _output_layer(model, k):
    """The name of the layer computing output `k` of a Functional (or
    Sequential) `model`, or None."""
    graph = functional_of(model)
    if graph is None or k >= len(graph.outputs):
        return None
    wanted = graph.outputs[k]
    for node in graph_nodes(graph):
        if any(t is wanted for t in node.outputs):
            return getattr(node.operation, "name", None)
    return None


def _quoted(layer):
    return layer if layer == OUTSIDE else repr(layer)
