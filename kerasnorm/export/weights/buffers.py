"""A `.tflite` flatbuffer read with its weights left where they are, and
written with its weights after the flatbuffer, found by offset.

The converter writes a large model's weights after the flatbuffer
(`write.BUFFER_OFFSET_BYTES`); flatbuffer objects (`ModelT`) hold an
inline buffer's bytes. `read_model` gives every buffer's bytes as a view
into the file, copying none; `write_model` writes the objects back with
every buffer after the flatbuffer, so the file is the weights' bytes once
and may pass the flatbuffer's 2 GB limit. Between the two, a pass holds
the file it read, what it adds (quantized weights) and the file it
writes; never a second copy of the weights as Python objects.
"""

from __future__ import annotations

import hashlib

import numpy as np

# The converter aligns the weights after the flatbuffer to 64 bytes;
# kernels read them in place.
ALIGNMENT = 64
# The metadata entry by which LiteRT knows a file's buffers lie after its
# flatbuffer (the converter's, with its value).
LOCATION = b"buffer_location"
OUTSIDE = b"outside flatbuffers"


def read_model(fu, content: bytes):
    """`(model, outside)`: the `ModelT` of `content` (a `.tflite`; `fu`:
    LiteRT's `flatbuffer_utils`), each buffer's `data` a read-only `uint8`
    view into `content`, and whether its buffers lay after the flatbuffer.

    `fu.read_model_from_bytearray` resolves the buffers stored by offset
    to slices of what it is given: of a `memoryview`, views, not copies."""
    model = fu.read_model_from_bytearray(memoryview(content))
    # The ops' tensor indices, which the passes rewrite in place: TensorFlow
    # 2.19's reader (the oldest stack's; LiteRT 1.3 has none) leaves them
    # read-only views into `content`.
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            if op.inputs is not None:
                op.inputs = np.array(op.inputs, np.int32)
            if op.outputs is not None:
                op.outputs = np.array(op.outputs, np.int32)
    for buffer in model.buffers:
        if buffer.data is not None and not isinstance(buffer.data, np.ndarray):
            buffer.data = np.frombuffer(buffer.data, np.uint8)
    outside = any(entry.name == LOCATION for entry in model.metadata or [])
    return model, outside


def write_model(schema, fu, model) -> bytes:
    """`model` (a `ModelT` of `schema`, packed by `fu`, LiteRT's
    `flatbuffer_utils`) as a `.tflite` whose buffers lie after the
    flatbuffer, each aligned to `ALIGNMENT` bytes and found by offset
    (the metadata's buffers stay inline). `model` is spent: its buffers
    hold offsets into the returned file."""
    _mark_outside(schema, model)
    inline = {entry.buffer for entry in model.metadata}
    datas = [
        None if index in inline else buffer.data
        for index, buffer in enumerate(model.buffers)
    ]
    sizes = [0 if d is None else len(d) for d in datas]
    for index, buffer in enumerate(model.buffers):
        if index not in inline:
            # Placeholders the size of the real offsets: the flatbuffer's
            # length does not depend on their values.
            buffer.data = None
            buffer.offset, buffer.size = (1, sizes[index]) if sizes[index] else (0, 0)
    head = len(fu.convert_object_to_bytearray(model))
    offsets = _offsets(head, sizes)
    for buffer, size, offset in zip(model.buffers, sizes, offsets, strict=True):
        if size:
            buffer.offset = offset
    flatbuffer = fu.convert_object_to_bytearray(model)
    if len(flatbuffer) != head:
        raise AssertionError("the flatbuffer's length moved with its offsets")
    pieces, end = [flatbuffer], head
    for data, size, offset in zip(datas, sizes, offsets, strict=True):
        if size:
            pieces += [bytes(offset - end), memoryview(np.ascontiguousarray(data))]
            end = offset + size
    return b"".join(pieces)


def builtin_code(code):
    """The builtin operator of an `OperatorCodeT`: the larger of its two
    fields (codes past 127 live in `builtinCode` only), as LiteRT's
    `flatbuffer_utils.get_builtin_code_from_operator_code` reads it (which
    TensorFlow 2.19's copy of those utilities lacks)."""
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def opcode_index(schema, fu, model, builtin, version=1):
    """The index of `model`'s operator code for `builtin` (a `ModelT` of
    `schema`; `fu`: LiteRT's `flatbuffer_utils`), appended at `version`
    when the file has none yet."""
    for index, code in enumerate(model.operatorCodes):
        if builtin_code(code) == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def share_identical_buffers(model):
    """Point tensors of identical constant buffers at the first; True when
    any was shared."""
    first, remap = {}, {}
    for index, buffer in enumerate(model.buffers):
        data = buffer_bytes(buffer)
        if data is None or data.size < 1024:
            continue
        key = (data.size, hashlib.blake2b(data, digest_size=16).digest())
        for other in first.get(key, []):
            if np.array_equal(buffer_bytes(model.buffers[other]), data):
                remap[index] = other
                break
        else:
            first.setdefault(key, []).append(index)
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            if tensor.buffer in remap:
                tensor.buffer = remap[tensor.buffer]
    for index in remap:
        model.buffers[index].data = None
    return bool(remap)


def buffer_bytes(buffer):
    """A flatbuffer buffer's bytes as uint8, or None when it has none (a
    tensor computed, or data placed after the flatbuffer)."""
    data = buffer.data
    if data is None or len(data) == 0:
        return None
    return np.asarray(data, np.uint8)


def _offsets(start, sizes):
    """Each buffer's offset when they follow one another from `start`,
    aligned."""
    offsets, end = [], start
    for size in sizes:
        end = -(-end // ALIGNMENT) * ALIGNMENT
        offsets.append(end)
        end += size
    return offsets


def _mark_outside(schema, model):
    """Add the `buffer_location` metadata entry unless `model` has it."""
    model.metadata = list(model.metadata or [])
    if any(entry.name == LOCATION for entry in model.metadata):
        return
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(OUTSIDE, np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = LOCATION
    entry.buffer = len(model.buffers) - 1
    model.metadata.append(entry)
