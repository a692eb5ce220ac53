"""The operators of a `.tflite` file's first subgraph, for tests that read
what the weights pass wrote (LiteRT's flatbuffer tools; the caller skips
where they are missing)."""

import pytest


def decode_ops(content):
    """`(schema, [(builtin code, op, graph, model)])` of `content`'s first
    subgraph (the decode graph of a generative file)."""
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
    fu = pytest.importorskip("ai_edge_litert.tools.flatbuffer_utils")
    model = fu.read_model_from_bytearray(bytearray(content))
    graph = model.subgraphs[0]
    ops = [
        (
            fu.get_builtin_code_from_operator_code(model.operatorCodes[op.opcodeIndex]),
            op,
            graph,
            model,
        )
        for op in graph.operators
    ]
    return schema, ops


def cache_writes(content):
    """How many `DYNAMIC_UPDATE_SLICE`s the decode graph of `content` has,
    asserting each writes a graph input (a cache) to a graph output: the
    step's last ops, which nothing in it reads."""
    schema, ops = decode_ops(content)
    writes = 0
    for code, op, graph, _ in ops:
        if code != schema.BuiltinOperator.DYNAMIC_UPDATE_SLICE:
            continue
        writes += 1
        assert int(op.inputs[0]) in {int(i) for i in graph.inputs}, "not a cache input"
        assert int(op.outputs[0]) in {int(i) for i in graph.outputs}, "read in the step"
    return writes
