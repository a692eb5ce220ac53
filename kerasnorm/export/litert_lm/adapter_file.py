"""The adapter file LiteRT-LM's engine loads with
`LoraConfig(lora_path=...)`: a `.tflite` flatbuffer holding tensors only.

As litert-torch writes one (`LoRA.to_tflite`, `generative/layers/lora.py`):
one subgraph named `lora_params` with one float32 tensor per adapter input
(named as the base file's input), each in a buffer of its own after an
empty buffer 0; the model's description `lora_params`; one metadata entry
`lora_rank` whose `buffer` field is the rank itself (not a buffer index:
the engine reads the number there); file identifier `TFL3`.

The tensors' bytes lie after the flatbuffer, each buffer found by its
`offset` and `size`: LiteRT-LM 0.18.1's reader takes a buffer's bytes from
there, and an inline buffer (offset and size 0) reads as the whole file
("LoRA tensor size mismatch for CPU tensor: 128 vs. 7564"). The engine maps
each tensor's pages, so the file ends on a page: its length a multiple of
`PAGE` (16 KiB, the largest page of Android's arm64 kernels; 0.18.1
refuses a file that ends inside the last page mapped: "the file size is not
a multiple of the OS alignment requirement (4096)").
"""

from __future__ import annotations

import numpy as np

SUBGRAPH = "lora_params"
ALIGNMENT = 16  # each tensor's offset in the file
PAGE = 2**14
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
    datas = []
    for name, value in tensors.items():
        datas.append(np.ascontiguousarray(value, np.float32).tobytes())
        buffer = schema.BufferT()
        # A placeholder offset as wide as the real one (the flatbuffer's
        # length must not move when it is set).
        buffer.offset, buffer.size = 1, len(datas[-1])
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
    head = len(fu.convert_object_to_bytearray(model))
    end, offsets = head, []
    for data in datas:
        end = -(-end // ALIGNMENT) * ALIGNMENT
        offsets.append(end)
        end += len(data)
    for buffer, offset in zip(model.buffers[1:], offsets, strict=True):
        buffer.offset = offset
    pieces = [bytes(fu.convert_object_to_bytearray(model))]
    if len(pieces[0]) != head:
        raise AssertionError("the adapter's flatbuffer moved with its offsets")
    for data, offset in zip(datas, offsets, strict=True):
        pieces += [bytes(offset - head - sum(map(len, pieces[1:]))), data]
    pieces.append(bytes(-end % PAGE))
    return b"".join(pieces)


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
        buffer = model.buffers[tensor.buffer]
        data = content[buffer.offset : buffer.offset + buffer.size]
        value = np.frombuffer(bytes(data), np.float32)
        tensors[_text(tensor.name)] = value.reshape(tuple(tensor.shape))
    return int(ranks[0]), tensors


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
