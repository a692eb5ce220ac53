"""`kerasnorm.export.litert.lowering.decoder_graph`: each op it rewrites
computes what TensorFlow's own computes (numpy as the reference), at open
shapes, without the op it replaces; a selection that may guard a
non-finite branch is left alone."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasnorm.export.litert.lowering import decoder_graph
from kerasnorm.export.litert.runner import run
from kerasnorm.export.verify.delegation import delegation

pytestmark = pytest.mark.tf_only

RNG = np.random.default_rng(0)


def traced(function, *arrays, float_file=True):
    """`(outputs, op types of the graph)` of `function` traced inside
    `decoder_graph` at fully open shapes, run on `arrays`."""
    specs = [tf.TensorSpec([None] * a.ndim, tf.as_dtype(a.dtype)) for a in arrays]
    with decoder_graph(float_file):
        concrete = tf.function(function).get_concrete_function(*specs)
    ops = {op.type for op in concrete.graph.get_operations()}
    return concrete(*[tf.constant(a) for a in arrays]), ops


INDICES = [
    (slice(None), None, slice(None), slice(None)),
    (slice(None), None, None, slice(None), slice(None)),
    (Ellipsis, None),
    (None, Ellipsis, 1),
    (slice(1, None), None, 0),
    (None,),
]


@pytest.mark.parametrize("index", INDICES, ids=str)
def test_new_axes_index_is_numpy_and_needs_no_strided_slice_with_new_axes(index):
    x = RNG.standard_normal((2, 3, 4)).astype("float32")
    got, _ = traced(lambda t: t[index], x)
    np.testing.assert_array_equal(got, x[index])


def test_new_axes_convert_to_builtins_at_an_open_shape():
    with decoder_graph():
        concrete = tf.function(lambda m: m[:, None, :, :] + 0).get_concrete_function(
            tf.TensorSpec((None, None, None), tf.int32)
        )
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    assert converter.convert()  # TensorFlow's own index needs Flex here


@pytest.mark.parametrize("axis", [0, 2, -1, -2])
def test_stack_is_numpy_without_pack(axis):
    a, b = (RNG.standard_normal((2, 3, 4)).astype("float32") for _ in range(2))
    got, ops = traced(lambda x, y: keras.ops.stack((-y, x), axis=axis), a, b)
    np.testing.assert_array_equal(got, np.stack((-b, a), axis=axis))
    assert "Pack" not in ops


@pytest.mark.parametrize("repeats, axis", [(2, 2), (3, 1), (4, -1)])
def test_repeat_is_numpy_without_tile(repeats, axis):
    x = RNG.standard_normal((2, 5, 3, 4)).astype("float32")
    got, ops = traced(lambda t: keras.ops.repeat(t, repeats, axis=axis), x)
    np.testing.assert_array_equal(got, np.repeat(x, repeats, axis=axis))
    assert "Tile" not in ops


def test_softmax_mask_is_arithmetic_and_exact():
    softmax = keras.layers.Softmax()
    scores = RNG.standard_normal((2, 2, 5, 5)).astype("float32")
    mask = RNG.random((2, 1, 5, 5)) > 0.4
    mask[0, 0, 2] = False  # a row with no key: zeros, as Keras writes it
    got, ops = traced(lambda s, m: softmax(s, mask=m), scores, mask)
    np.testing.assert_array_equal(got, softmax(scores, mask=mask))
    assert "SelectV2" not in ops and "Select" not in ops
    # An int8-calibrated file keeps Keras' own graph (a selection from Keras
    # 3.11 on; Keras 3.10's Softmax adds its mask as a bias itself).
    _, ops = traced(lambda s, m: softmax(s, mask=m), scores, mask, float_file=False)
    specs = [tf.TensorSpec([None] * 4, tf.float32), tf.TensorSpec([None] * 4, tf.bool)]
    plain = tf.function(lambda s, m: softmax(s, mask=m)).get_concrete_function(*specs)
    assert ops == {op.type for op in plain.graph.get_operations()}


def test_a_guarding_selection_outside_a_masking_layer_stays_one():
    x = np.array([[-1.0, 0.0, 2.0]], "float32")
    got, ops = traced(lambda t: keras.ops.where(t > 0, keras.ops.log(t), 0.0), x)
    np.testing.assert_array_equal(got, np.float32([[0.0, 0.0, np.log(2.0)]]))
    assert "SelectV2" in ops


@pytest.mark.parametrize(
    "index",
    [
        (Ellipsis, slice(None, None, 2)),
        (Ellipsis, slice(1, None, 2)),
        (slice(None), slice(2, None, 3), slice(1, 3)),
        (slice(0, None, 4),),
    ],
    ids=str,
)
def test_a_step_along_one_axis_is_reshapes_in_one_xnnpack_partition(index):
    """GPT-OSS's interleaved halves (`x[..., ::2]`, `x[..., 1::2]`) and other
    steps that divide the axis: numpy's values, at a static shape with no
    strided slice left, in one partition with nothing outside; at an open
    shape too."""
    x = RNG.standard_normal((4, 6, 4)).astype("float32")
    got, _ = traced(lambda t: t[index], x)
    np.testing.assert_array_equal(got, x[index])
    with decoder_graph():
        concrete = tf.function(lambda t: t[index] * 2.0).get_concrete_function(
            tf.TensorSpec(x.shape, tf.float32)
        )
    for op in concrete.graph.get_operations():
        if op.type == "StridedSlice":
            assert set(tf.get_static_value(op.inputs[3])) == {1}
    content = tf.lite.TFLiteConverter.from_concrete_functions(
        [concrete], tf.Module()
    ).convert()
    split = delegation(content)
    assert split.partitions == 1 and not split.undelegated, split
    np.testing.assert_array_equal(run(content, [x])[0], 2 * x[index])
