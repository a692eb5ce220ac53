"""How a generative file's decode step runs: its XNNPACK partitions and the
ops left outside them, and its latency per token.

The decode signature is written first (`write.write_generative`), so it is
the file's main graph, the one the interpreter lists ops for
(`verify.delegation` reads the split from there, the other signatures left
undelegated). The latency is timed on the decode signature alone
(`decode_only`): XNNPACK packs the weights of every signature a runtime
allocates, and a weight-only int8 file's twice over (dequantized, then
packed), memory for nothing where one signature runs."""

from __future__ import annotations

import time

import numpy as np

from kerasnorm.export.litert.generator import Generator
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.verify.delegation import delegation
from kerasnorm.export.weights.buffers import builtin_code
from kerasnorm.export.weights.buffers import read_model
from kerasnorm.export.weights.buffers import write_model
from kerasnorm.export.weights.edits import flatbuffer_schema

DECODE_TIMING_STEPS = 8


def decode_delegation(content):
    """The decode step's `Delegation` (`content`: the file's bytes)."""
    # Listed unallocated: allocating packs every signature's weights.
    inputs = unallocated(content).get_input_details()
    shapes = [tuple(i["shape"]) for i in inputs if "tokens" in i["name"]]
    if shapes != [(1, 1)]:
        raise AssertionError(
            "the generative file's main graph should be its decode step "
            f"(tokens (1, 1)); its token inputs are {shapes}"
        )
    return delegation(content)


def decode_ms(content, steps=DECODE_TIMING_STEPS):
    """The median time of one decode step, in ms, over `steps` steps after
    a one-token prompt (fewer in a short context), on the decode signature
    alone (`decode_only`)."""
    generator = Generator(decode_only(content))
    generator.prefill([1])
    steps = min(steps, generator.max_sequence_length - 1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        generator.decode(1)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


# Ops that call other subgraphs: a file with them keeps all its signatures.
_CALLS = ("WHILE", "IF", "CALL_ONCE", "STABLEHLO_COMPOSITE", "STABLEHLO_WHILE")


def decode_only(content):
    """The generative file `content` with its `decode` signature alone (its
    subgraph, the buffers it reads and the metadata; the same bytes for
    those), or `content` itself when its decode step calls other subgraphs."""
    schema, fu = flatbuffer_schema()
    model, _ = read_model(fu, content)
    keys = [_text(d.signatureKey) for d in model.signatureDefs]
    if "decode" not in keys:
        raise ValueError(f"the file has no decode signature; it has {keys}")
    signature = model.signatureDefs[keys.index("decode")]
    graph = model.subgraphs[signature.subgraphIndex]
    if len(model.subgraphs) == 1:
        return content
    ops = schema.BuiltinOperator
    calls = {getattr(ops, name) for name in _CALLS if hasattr(ops, name)}
    codes = [builtin_code(code) for code in model.operatorCodes]
    if any(codes[op.opcodeIndex] in calls for op in graph.operators):
        return content
    signature.subgraphIndex = 0
    model.signatureDefs, model.subgraphs = [signature], [graph]
    kept = {t.buffer for t in graph.tensors}
    kept |= {m.buffer for m in model.metadata or []}
    for index, buffer in enumerate(model.buffers):
        if index not in kept:
            buffer.data = None
    return write_model(schema, fu, model)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
