"""`kerasnorm.export.litert.routing`: a mixture of experts' `top_k`, and the
`one_hot` and `take_along_axis` of its indices, in float arithmetic while a
float32 decoder is traced (`lowering.decoder_graph`). The reference is
numpy's stable sort (`tf.math.top_k`'s order: larger first, the lower index
first among equal scores), compared exactly, in TensorFlow and in the
converted file under XNNPACK, which runs it in one partition."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasnorm.export.litert import routing
from kerasnorm.export.litert.lowering import decoder_graph
from kerasnorm.export.litert.runner import run
from kerasnorm.export.verify.delegation import delegation

pytestmark = pytest.mark.tf_only

EXPERTS, K = 8, 3


def _scores():
    rng = np.random.default_rng(0)
    rows = [
        rng.standard_normal(EXPERTS),
        rng.integers(0, 3, EXPERTS),  # many ties
        np.full(EXPERTS, 0.25),  # all tied: the first K, in order
        # Differences near the smallest normal float and past the largest.
        [0.0, 1e-30, -1e-30, 2e-38, 1e30, -1e30, 3.4e38, -3.4e38],
        rng.random(EXPERTS) / 1e3,  # probabilities' scale
    ]
    return np.asarray(rows, "float32")


def _reference(x):
    order = np.argsort(-x, axis=-1, kind="stable")[:, :K]
    picked = np.take_along_axis(x, order, -1)
    return picked, np.eye(EXPERTS, dtype="float32")[order], 0.5 * picked


def _routing(x):
    values, indices = keras.ops.top_k(x, K)
    one_hot = keras.ops.one_hot(indices, EXPERTS)
    return values, one_hot, keras.ops.take_along_axis(0.5 * x, indices, axis=-1)


def _traced(float_file=True):
    # Static shapes, as the decoder's steps are: XNNPACK takes the new axes
    # as a reshape there (not an open shape's `EXPAND_DIMS`).
    spec = tf.TensorSpec((len(_scores()), EXPERTS), tf.float32)
    with decoder_graph(float_file):
        return tf.function(_routing).get_concrete_function(spec)


def test_routing_is_top_k_exactly_in_one_xnnpack_partition(monkeypatch):
    monkeypatch.setattr(routing, "_in_hub_layer", lambda: True)
    x = _scores()
    concrete = _traced()
    for got, want in zip(concrete(tf.constant(x)), _reference(x), strict=True):
        np.testing.assert_array_equal(got, want)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], tf.Module())
    content = converter.convert()
    split = delegation(content)
    assert split.partitions == 1 and not split.undelegated, split
    for a, b in zip(run(content, [x]), _reference(x), strict=True):
        np.testing.assert_array_equal(a, b)


def test_top_k_outside_a_router_or_in_an_int8_file_stays_one(monkeypatch):
    """Outside a keras-hub layer (a sampler's top_k of masked logits may
    see -inf) and in a file the int8 quantizers calibrate, TensorFlow's own
    ops stay."""
    for float_file in (True, False):
        if not float_file:
            monkeypatch.setattr(routing, "_in_hub_layer", lambda: True)
        ops = {op.type for op in _traced(float_file).graph.get_operations()}
        assert {"TopKV2", "OneHot"} <= ops
