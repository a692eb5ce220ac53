"""TensorFlow's, LiteRT's and tf_keras' private APIs kerasnorm uses (see
`kerasnorm._compat`). TensorFlow is imported inside each function, so the
layers import on backends without it."""

import contextlib


def convert_variables_to_constants(concrete_function):
    """Freeze a concrete function's variables into constants.

    `tensorflow.python.framework.convert_to_constants` (TF 2.21.0): the only
    way to hand LiteRT's converter a graph with no resource variables;
    `tf.lite.TFLiteConverter.from_concrete_functions` does the same but keeps
    variable ops for stateful models.
    """
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    return convert_variables_to_constants_v2(concrete_function)


def write_buffers_after_flatbuffer(converter):
    """Have `converter` write the weights after the flatbuffer, found by
    offset, not inside it.

    `TFLiteConverter._experimental_use_buffer_offset` (TF 2.21.0): the one
    way past the flatbuffer's 2 GB limit, and the converter then skips two
    Python round trips of the whole model through flatbuffer objects (the
    buffer de-duplication the exporter already did, and the conversion
    metadata), each a copy of every weight. LiteRT reads such files as any
    other.
    """
    converter._experimental_use_buffer_offset = True


def interpreter_ops(interpreter):
    """The op list of a LiteRT interpreter: dicts with `op_name`, `index`, ...

    `Interpreter._get_ops_details` (ai-edge-litert 2.3): the public interpreter
    lists tensors but not ops, and the op names are how an export proves it has
    no Flex (TensorFlow) ops.
    """
    return interpreter._get_ops_details()


def tf_keras_dropout_rnn_cell_mixin():
    """`tf_keras`'s `DropoutRNNCellMixin` (tf-keras 2.19 to 2.21, private).

    `tf_keras.layers.RNN` resets a cell's cached dropout masks at each call
    only for cells that inherit it, and `tf_keras` exports it nowhere; the
    legacy cells need it to work in `tf_keras.layers.RNN` as Keras' own do.
    """
    from tf_keras.src.layers.rnn.dropout_rnn_cell_mixin import DropoutRNNCellMixin

    return DropoutRNNCellMixin


def get_tf_keras_autocast(layer):
    """Whether a `tf_keras` layer casts its inputs to its compute dtype.

    `Layer._autocast` (tf-keras 2.19 to 2.21): what Keras 3 exposes as
    `layer.autocast`; `tf_keras` sets it from the constructor's `autocast`
    keyword only and has no public accessor.
    """
    return layer._autocast


def set_tf_keras_autocast(layer, value):
    """Set what `get_tf_keras_autocast` reads (tf-keras 2.19 to 2.21)."""
    layer._autocast = value


def set_tf_keras_dropout_generator(cell, generator):
    """Give a cell over `tf_keras`'s `DropoutRNNCellMixin` the object its
    dropout masks are drawn from: `generator.dropout(inputs, rate)`.

    `DropoutRNNCellMixin._random_generator` (tf-keras 2.19 to 2.21): the mixin's
    documented but underscore-named protocol; the cells of `tf_keras` set it
    in their constructors, and a cell of another library has to do the same.
    """
    cell._random_generator = generator


def tflite_calibrated(content, dataset):
    """A float `.tflite` flatbuffer with the activation ranges `dataset`
    reaches recorded in it, ready for `tflite_quantize_calibrated`.

    `tensorflow.lite.python.optimize.calibrator` (TF 2.21): the step
    `TFLiteConverter` runs between conversion and quantization; the public
    converter fuses the two, and keeping chosen ops in float needs the ranges
    of the converted file and its own quantizer call.

    Args:
        content: float32 flatbuffer bytes.
        dataset: a callable returning an iterator of samples, each a
            `(signature key, {input name: array})` pair.
    """
    from tensorflow.lite.python.optimize import calibrator

    content = calibrator.add_intermediate_tensors(content)
    return calibrator.Calibrator(content).calibrate(dataset)


def tflite_quantize_calibrated(
    calibrated, *, float_ops=(), float_nodes=(), io_type=None
):
    """Quantize a `tflite_calibrated` flatbuffer to int8, leaving the ops
    of the types `float_ops` and those writing the tensors `float_nodes`
    in float (with DEQUANTIZE/QUANTIZE around them).

    `tensorflow.lite.python.convert.mlir_quantize` (TF 2.21), the quantizer
    `TFLiteConverter` and `tf.lite.experimental.QuantizationDebugger` call;
    its `denylisted_ops`/`denylisted_nodes` are what the debugger's options
    pass, without the debugger's float and debug copies of the model.
    `io_type` (`tf.int8`) makes the model's inputs and outputs int8 too.
    """
    from tensorflow.lite.python import convert

    io = (
        {}
        if io_type is None
        else {
            "input_data_type": io_type,
            "output_data_type": io_type,
        }
    )
    return convert.mlir_quantize(
        calibrated,
        fully_quantize=io_type is not None,
        denylisted_ops=list(float_ops) or None,
        denylisted_nodes=list(float_nodes) or None,
        **io,
    )


def op_creation_callback(callback):
    """A context manager: `callback(op_type, op_name)` runs as each op is
    created in a graph traced inside it (on this thread).

    `tensorflow.python.framework.op_callbacks` (TF 2.19 to 2.21), what
    `tf.debugging.experimental.enable_dump_debug_info` uses: the one hook at
    op creation, where the Keras layer that creates the op is known
    (`calling_layers`); a traced graph only keeps TensorFlow's name scopes.
    """
    import contextlib

    from tensorflow.python.framework import op_callbacks

    def hook(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if op_name is not None:
            callback(op_type, op_name)

    @contextlib.contextmanager
    def installed():
        op_callbacks.add_op_callback(hook)
        try:
            yield
        finally:
            op_callbacks.remove_op_callback(hook)

    return installed()


@contextlib.contextmanager
def new_axes_as_expand_dims():
    """While active, indexing a tensor of known rank with `None` (a new
    axis: `mask[:, None, :, :]`) is the index without the new axes, then
    one `tf.expand_dims` per new axis; with nothing else to slice, the
    expansions alone.

    The two compute the same tensor. TensorFlow writes the index as one
    `StridedSlice` with a `new_axis_mask`, which the TFLite converter lowers
    to its builtin only when the input's shape is fully known: at an open
    batch or length it needs the Flex runtime (keras-hub's decoder
    attention masks, `attention_mask[:, None, :, :]`). `EXPAND_DIMS` is a
    builtin at any shape.

    The hook is `tf.Tensor.__getitem__`, which TensorFlow installs itself
    (`tensor_getitem_override._slice_helper`, TF 2.19 and 2.21); TensorFlow
    offers no public way to choose how an index lowers. The attribute is
    restored on exit, also on an error. An index this does not rewrite
    (a tensor index, two ellipses, an unknown rank) takes TensorFlow's own.
    """
    import tensorflow as tf

    def getitem(original, tensor, index):
        split = _new_axes(index, tensor.shape.rank)
        if split is None:
            return original(tensor, index)
        kept, new_axes = split
        out = tensor
        if any(item != slice(None) for item in kept):
            out = original(tensor, kept)
        for axis in new_axes:
            out = tf.expand_dims(out, axis)
        return out

    with _getitem_replaced(getitem):
        yield


def _new_axes(index, rank):
    """`(index without its new axes, the new axes' positions in the
    result)` of a numpy-style `index` of a rank-`rank` tensor; None where
    it has no new axis or is not plain Python ints, slices, `None` and one
    ellipsis."""
    items = index if isinstance(index, tuple) else (index,)
    if rank is None or not any(item is None for item in items):
        return None
    plain = all(
        item is None
        or item is Ellipsis
        or isinstance(item, slice)
        or (isinstance(item, int) and not isinstance(item, bool))
        for item in items
    )
    if not plain or sum(item is Ellipsis for item in items) > 1:
        return None
    consumed = sum(item is not None and item is not Ellipsis for item in items)
    if consumed > rank:
        return None
    rest = (slice(None),) * (rank - consumed)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + rest + items[at + 1 :]
    else:
        items = items + rest
    kept, new_axes, position = [], [], 0
    for item in items:
        if item is None:
            new_axes.append(position)
            position += 1
        else:
            kept.append(item)
            position += isinstance(item, slice)
    return tuple(kept), new_axes


@contextlib.contextmanager
def strided_slices_as_reshapes():
    """While active, indexing a tensor with a step along one axis of known
    size that the step divides (`x[..., ::2]`, `x[..., 1::2]`: GPT-OSS's
    experts read their interleaved gate and up halves so) is that axis
    reshaped to `(size // step, step)`, the one column taken by a unit-step
    slice, and reshaped back.

    The two compute the same tensor. TensorFlow writes the index as a
    `StridedSlice` with strides, which XNNPACK does not delegate; reshapes
    and unit-step slices it does. The hook is `tf.Tensor.__getitem__`, as
    `new_axes_as_expand_dims`'s (TF 2.19 and 2.21). An index this does not
    rewrite (a step on two axes or on a dynamic one, a start past the first
    step, integers, new axes, a shape with two dynamic sizes) takes the
    index it found installed.
    """
    import tensorflow as tf

    def getitem(original, tensor, index):
        plan = _strided(index, tensor.shape)
        if plan is None:
            return original(tensor, index)
        rest, axis, start, step = plan
        shape = tensor.shape.as_list()
        size = shape[axis] // step
        split = [*shape[:axis], size, step, *shape[axis + 1 :]]
        out = tf.reshape(tensor, [-1 if d is None else d for d in split])
        out = original(out, (slice(None),) * (axis + 1) + (slice(start, start + 1),))
        kept = [*shape[:axis], size, *shape[axis + 1 :]]
        out = tf.reshape(out, [-1 if d is None else d for d in kept])
        if all(item == slice(None) for item in rest):
            return out
        return original(out, tuple(rest))

    with _getitem_replaced(getitem):
        yield


@contextlib.contextmanager
def _getitem_replaced(getitem):
    """While active, `tf.Tensor.__getitem__(tensor, index)` is
    `getitem(original, tensor, index)`, `original` the one found installed;
    restored on exit, also on an error."""
    import tensorflow as tf

    original = tf.Tensor.__getitem__
    tf.Tensor.__getitem__ = lambda tensor, index: getitem(original, tensor, index)
    try:
        yield
    finally:
        tf.Tensor.__getitem__ = original


def _strided(index, shape):
    """`(index with its step removed, axis, start, step)` of an `index` of
    slices and one ellipsis with a step on one axis (see
    `strided_slices_as_reshapes`); None otherwise."""
    items = index if isinstance(index, tuple) else (index,)
    rank = shape.rank
    if rank is None or not all(
        item is Ellipsis or isinstance(item, slice) for item in items
    ):
        return None
    if (
        sum(item is Ellipsis for item in items) > 1
        or len(items) - (Ellipsis in items) > rank
    ):
        return None
    rest = (slice(None),) * (rank - len(items) + (Ellipsis in items))
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + rest + items[at + 1 :]
    else:
        items = items + rest
    stepped = [i for i, item in enumerate(items) if item.step not in (None, 1)]
    sizes = shape.as_list()
    if len(stepped) != 1 or sum(size is None for size in sizes) > 1:
        return None
    axis = stepped[0]
    item, size = items[axis], sizes[axis]
    step, start = item.step, 0 if item.start is None else item.start
    if (
        not _plain_int(step)
        or size is None
        or step < 2
        or size % step
        or not _plain_int(start)
        or not 0 <= start < step
        or not (item.stop is None or (_plain_int(item.stop) and item.stop >= size))
    ):
        return None
    return (*items[:axis], slice(None), *items[axis + 1 :]), axis, start, step


def _plain_int(value):
    return isinstance(value, int) and not isinstance(value, bool)
