"""The adapter file LiteRT-LM's engine loads with
`LoraConfig(lora_path=...)`: a `.tflite` flatbuffer holding tensors only.

As litert-torch writes one (`LoRA.to_tflite`, `generative/layers/lora.py`):
one subgraph named `lora_params` with one float32 tensor per adapter input
(named as the base file's input), each in a buffer of its own after an
empty buffer 0; the model's description `lora_params`; one metadata entry
`lora_rank` whose `buffer` field is the rank itself (not a buffer index:
the engine reads the number there); file identifier `TFL3`.
"""

from __future__ import annotations

import numpy as np

SUBGRAPH = "lora_params"
RANK_METADATA = "lora_rank"


def adapter_bytes(tensors, rank):
    """The adapter flatbuffer of `tensors` (`{input name: float32
    array}`) at `rank`."""
    from kerasnorm.export.weights.quantize import weights_schema

    schema, fu = weights_schema()
    model = schema.ModelT()
    model.version = 3
    model.description = SUBGRAPH
    model.buffers = [schema.BufferT()]
    subgraph = schema.SubGraphT()
    subgraph.name = SUBGRAPH
    subgraph.tensors, subgraph.inputs, subgraph.outputs = [], [], []
    subgraph.operators = []
    for name, value in tensors.items():
        value = np.ascontiguousarray(value, np.float32)
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(value.tobytes(), np.uint8)
        model.buffers.append(buffer)
        tensor = schema.TensorT()
        tensor.name = name
        tensor.shape = np.asarray(value.shape, np.int32)
        tensor.type = schema.TensorType.FLOAT32
        tensor.buffer = len(model.buffers) - 1
        subgraph.tensors.append(tensor)
    model.subgraphs = [subgraph]
    metadata = schema.MetadataT()
    metadata.name = RANK_METADATA
    metadata.buffer = int(rank)
    model.metadata = [metadata]
    model.operatorCodes = []
    return bytes(fu.convert_object_to_bytearray(model))


def read_adapter(content):
    """`(rank, {name: float32 array})` of an adapter flatbuffer."""
    from kerasnorm.export.weights.quantize import weights_schema

    schema, _ = weights_schema()
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(content, 0))
    if len(model.subgraphs or []) != 1 or _text(model.subgraphs[0].name) != SUBGRAPH:
        raise ValueError(
            f"not a LoRA adapter file: it has no single {SUBGRAPH!r} subgraph"
        )
    ranks = [m.buffer for m in model.metadata or [] if _text(m.name) == RANK_METADATA]
    if len(ranks) != 1:
        raise ValueError(f"not a LoRA adapter file: no {RANK_METADATA!r} metadata")
    tensors = {}
    for tensor in model.subgraphs[0].tensors:
        data = model.buffers[tensor.buffer].data
        value = np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.float32)
        tensors[_text(tensor.name)] = value.reshape(tuple(tensor.shape))
    return int(ranks[0]), tensors


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
