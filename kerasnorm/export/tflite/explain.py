"""A conversion error that names the layer(s) TFLite cannot express."""

from __future__ import annotations

import re

from kerasnorm.export._common.errors import ExportConversionError
from kerasnorm.export._common.model import all_layers
from kerasnorm.export._common.precision import compute_dtype
from kerasnorm.export._common.precision import half_precision_layers
from kerasnorm.export.litert.convert import concrete_function


def explain(model, batch_size, err):
    """A conversion error that names the layer(s) TFLite cannot express."""
    # The runtime's error reporter joins its lines with no separator.
    message = re.sub(r"(?<=\S)(Node number \d+)", r" \1", str(err))
    match = re.search(r"(?:TF Select ops|Flex ops): ([\w, ]+)", message)
    if not match:
        return ExportConversionError(f"TFLite conversion failed: {message[:2000]}")
    op_types = {op.strip() for op in match.group(1).split(",")}
    layers = _layers_using(model, batch_size, op_types)
    where = (
        "layer(s) " + ", ".join(repr(name) for name in layers)
        if layers
        else "the model"
    )
    half = half_precision_layers(model)
    if half:
        where = "layer(s) " + ", ".join(repr(name) for name in half)
        half = [compute_dtype(model)]
        # Under a mixed policy the ops are float16 / bfloat16 ops, for which
        # TFLite has no builtin kernels; the op names alone read as if the
        # op itself were unsupported.
        return ExportConversionError(
            f"Cannot export {where} to TFLite with builtin ops only: they "
            f"compute in {' / '.join(half)} (their dtype policy), and TFLite's "
            f"builtin {', '.join(sorted(op_types))} have no kernels for that "
            "type. Export it with export_dtype='float32' (the default), which "
            "rebuilds it in float32 with the same weights; quantize='float16' "
            "then stores half-size weights."
        )
    return ExportConversionError(
        f"Cannot export {where} to TFLite with builtin ops only: they use "
        f"{', '.join(sorted(op_types))}, which needs the Flex (select TF ops) "
        "runtime. Replace the layer or export it as a SavedModel."
    )


def _layers_using(model, batch_size, op_types):
    names = {layer.name for layer in all_layers(model)}
    found = []
    graph = concrete_function(model, batch_size).graph
    for op in graph.get_operations():
        if op.type not in op_types:
            continue
        for scope in reversed(op.name.split("/")[:-1]):
            base = re.sub(r"_\d+$", "", scope)
            name = scope if scope in names else base if base in names else None
            if name and name not in found:
                found.append(name)
                break
    return found
