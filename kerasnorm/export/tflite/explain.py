"""A conversion error that names the op, the layer(s) it comes from and what
to do, in one sentence; the converter's own text in its `details`.

`ops_in_error(text)` reads the TensorFlow op types a converter message is
about; `model.op_layers` maps them, and the graph nodes its MLIR
locations name, to the Keras layers that created them.
"""

from __future__ import annotations

import re

from kerasnorm.export.litert.convert import concrete_function
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.op_layers import OUTSIDE
from kerasnorm.export.model.op_layers import PROCESS_BOUND_OPS
from kerasnorm.export.model.op_layers import converter_nodes
from kerasnorm.export.model.op_layers import layer_list
from kerasnorm.export.model.op_layers import recording
from kerasnorm.export.numerics.errors import ExportConversionError
from kerasnorm.export.numerics.precision import compute_dtype
from kerasnorm.export.numerics.precision import half_precision_layers

_ERF_OPS = ("Erf", "Erfc")

_UNSUPPORTED = (
    r"(?:TF Select ops|Flex ops): ([\w, ]+)",
    r"'tf\.(\w+)' op is neither a custom op nor a flex op",
    r"failed to legalize operation 'tf\.(\w+)'",
    r"^\s*tf\.(\w+) \{",
)
_FAILED_OP = r"'tf\.(\w+)' op ([^\n]+)"


def ops_in_error(text) -> tuple[list[str], list[str]]:
    """`(unsupported, failed)`: the TensorFlow op types a converter message
    says it cannot express, and those it says it failed on (a shape or
    rank it rejects), each once, in order."""
    unsupported = []
    for pattern in _UNSUPPORTED:
        for match in re.findall(pattern, text, re.M):
            for op in match.split(","):
                if op.strip() and op.strip() not in unsupported:
                    unsupported.append(op.strip())
    failed = []
    for op, what in re.findall(_FAILED_OP, text):
        if op not in unsupported and op not in failed and "neither" not in what:
            failed.append(op)
    return unsupported, failed


def explain(model, batch_size, err, *, ops=None, quantize=None, what=None):
    """The `ExportConversionError` for a failed conversion of `model`
    (traced at `batch_size`): its message one sentence naming the op(s),
    the layer(s) that produce them (all of them) and what to do; the
    converter's text in `details`.

    `ops`: the `model.op_layers` recording of the trace that was
    converted (else the model is traced again here); `quantize`: the mode,
    which some advice depends on; `what`: what was converted, for the
    message (default `"the model"`)."""
    # The runtime's error reporter joins its lines with no separator.
    raw = re.sub(r"(?<=\S)(Node number \d+)", r" \1", str(err))
    unsupported, failed = ops_in_error(raw)
    if ops is None and (unsupported or failed):
        ops = _trace(model, batch_size)
    half = half_precision_layers(model) if unsupported else []
    if half:
        return ExportConversionError(_half_message(model, half, unsupported), raw)
    if unsupported:
        layers = _layers(model, batch_size, ops, raw, unsupported)
        return ExportConversionError(
            _unsupported_message(unsupported, layers, quantize, what), raw
        )
    if failed:
        layers = _layers(model, batch_size, ops, raw, failed)
        problem = re.search(_FAILED_OP, raw).group(2).strip()
        where = f" in {_where(layers, failed)}" if any(layers.values()) else ""
        return ExportConversionError(
            f"The TFLite converter failed on {'/'.join(failed)}{where} "
            f"({_short(problem)}): try another batch_size (batch_size=2), "
            "fold=False or another quantize mode, or export a SavedModel "
            "(the converter's text is in the exception's details, and "
            "verbose=True prints it).",
            raw,
        )
    return ExportConversionError(
        f"The TFLite converter failed on {what or 'the model'} "
        f"({_short(_last_error(raw))}): try another quantize mode, "
        "fold=False or batch_size=2, or export a SavedModel (the converter's "
        "text is in the exception's details, and verbose=True prints it).",
        raw,
    )


def _trace(model, batch_size):
    try:
        with recording(model) as ops:
            concrete_function(model, batch_size)
    except Exception:
        return None
    return ops


def _layers(model, batch_size, ops, raw, op_types):
    """`{op type: [layers]}`: by the nodes the converter's locations name
    where it names them, else every layer that creates the op type (by
    name scope for a model whose layers Keras 3 does not call)."""
    found = {op: [] for op in op_types}
    if ops is not None:
        by_node = ops.layers_of_nodes(converter_nodes(raw))
        by_type = ops.layers_using(op_types)
        # An op the converter made itself (a Transpose it inserted) is in
        # no trace: the nodes its locations name are where it came from.
        anywhere = list(dict.fromkeys(x for xs in by_node.values() for x in xs))
        for op in op_types:
            found[op] = by_node.get(op) or by_type.get(op) or anywhere
    if not any(layer != OUTSIDE for layers in found.values() for layer in layers):
        try:
            scoped = _by_scope(model, batch_size, op_types)
        except Exception:
            scoped = {}
        for op in op_types:
            found[op] = scoped.get(op) or found[op]
    return found


def _where(layers, op_types):
    """`layer(s) 'a' and 'b' (Erfc), 'c' (FFT2D)`; `the model` when no
    layer is known."""
    parts = []
    named = [op for op in op_types if layers.get(op)]
    for op in named:
        listed = layer_list(layers[op])
        parts.append(listed if len(named) == 1 else f"{listed} ({op})")
    if not parts:
        return "the model"
    if all(layers[op] == [OUTSIDE] for op in named):
        return OUTSIDE
    count = sum(len(layers[op]) for op in named)
    return ("layer " if count == 1 else "layers ") + ", ".join(parts)


def _unsupported_message(op_types, layers, quantize, what):
    where = _where(layers, op_types)
    if where == "the model" and what:
        where = what
    ops = ", ".join(op_types)
    if any(op in PROCESS_BOUND_OPS for op in op_types):
        advice = (
            "a tf.py_function / tf.numpy_function is a call back into this "
            "Python process, which no TFLite runtime (nor a SavedModel loaded "
            "elsewhere) can make: write the layer with TensorFlow or keras.ops "
            "operations"
        )
    elif all(op in _ERF_OPS for op in op_types):
        advice = (
            "TFLite has no builtin for an erf except inside the GELU pattern "
            "its converter fuses into its GELU op: write the activation as "
            "keras.activations.gelu (exact, or approximate=True; "
            "activation='gelu' in kerasnorm's blocks converts in every mode) "
            "or use activation='relu'"
        )
    else:
        advice = (
            "they need the Flex (select TF ops) runtime, which stock LiteRT "
            "does not ship: replace the layer with ops TFLite has builtins "
            "for, or export a SavedModel"
        )
    return f"TFLite builtins cannot express {ops}, used by {where}: {advice}."


def _half_message(model, half, op_types):
    where = "layer(s) " + ", ".join(repr(name) for name in half)
    # Under a mixed policy the ops are float16 / bfloat16 ops, for which
    # TFLite has no builtin kernels; the op names alone read as if the op
    # itself were unsupported.
    return (
        f"Cannot export {where} to TFLite with builtin ops only: they "
        f"compute in {compute_dtype(model)} (their dtype policy), and TFLite's "
        f"builtin {', '.join(sorted(op_types))} have no kernels for that "
        "type. Export it with export_dtype='float32' (the default), which "
        "rebuilds it in float32 with the same weights; quantize='float16' "
        "then stores half-size weights."
    )


def _last_error(raw):
    """What a converter message says, in a line: the text after the MLIR
    location of its last error, else its last `...Error: text` line, else
    its first line."""
    raw = re.sub(r"\x1b\[[0-9;]*m", "", raw)
    for line in reversed(raw.splitlines()):
        if "error:" not in line:
            continue
        text = line.split("error:", 1)[1]
        if "loc(" in text:
            text = text.rsplit("): ", 1)[-1] if "): " in text else ""
        if text.strip():
            return text.strip()
    errors = re.findall(r"^\s*\w*(?:Error|Exception): (.+)$", raw, re.M)
    if errors:
        return errors[-1].strip()
    lines = [line.strip() for line in raw.splitlines() if line.strip()]
    return lines[0] if lines else "no message"


def _short(text, limit=200):
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def layers_creating(model, op_types, batch_size=1) -> dict[str, list[str]]:
    """`{op type: [layer paths]}`: every layer of `model` (traced at
    `batch_size`, as `to_tflite` traces it) that creates one of `op_types`,
    sublayers as `'block/ffn/dense'`. What a refusal before conversion
    names (an op a mode cannot convert)."""
    with recording(model) as ops:
        concrete_function(model, batch_size)
    found = ops.layers_using(op_types)
    if not found:
        found = _by_scope(model, batch_size, op_types)
    return found


def _by_scope(model, batch_size, op_types):
    """The old way, for a model whose layers Keras 3 does not call (a
    `tf_keras` model): the graph's name scopes."""
    names = {layer.name for layer in all_layers(model)}
    found: dict[str, list[str]] = {}
    graph = concrete_function(model, batch_size).graph
    for op in graph.get_operations():
        if op.type not in op_types:
            continue
        for scope in reversed(op.name.split("/")[:-1]):
            base = re.sub(r"_\d+$", "", scope)
            name = scope if scope in names else base if base in names else None
            if name:
                layers = found.setdefault(op.type, [])
                if name not in layers:
                    layers.append(name)
                break
    return found
