"""The fallbacks of `kerasnorm._compat`, each taken on purpose.

Every private hook kerasnorm uses exists from the oldest supported Keras to
the newest (the oldest-stack pass of .ci/run runs the layer tests on the
floor versions); where a hook has a second route, `_compat` detects the
feature and falls back. Each test here removes the primary hook and checks
that the fallback gives what the primary gave.
"""

import types

import keras
import numpy as np
import pytest

from kerasnorm import _compat
from kerasnorm._compat import keras_private
from kerasnorm._compat import keras_tracing


def test_backend_rnn_falls_back_to_the_backend_module(monkeypatch):
    primary = keras_private._backend_rnn()
    assert primary is _compat.backend_rnn
    monkeypatch.delattr(keras_private._keras_backend, "rnn")
    assert keras_private._backend_rnn() is primary


def test_inner_loop_hook_is_required_loudly():
    keras_private._require_inner_loop(keras.layers.RNN)

    class WithoutHook:
        pass

    with pytest.raises(ImportError, match=r"WithoutHook\.inner_loop"):
        keras_private._require_inner_loop(WithoutHook)


def test_keras_mask_without_keras_reader(monkeypatch):
    embedding = keras.layers.Embedding(5, 2, mask_zero=True)
    symbolic = embedding(keras.Input((3,), dtype="int32"))
    eager = embedding(np.array([[1, 0, 2]], dtype="int32"))
    primary = [_compat.keras_mask(symbolic), _compat.keras_mask(eager)]
    assert primary[0] is not None
    np.testing.assert_array_equal(np.asarray(primary[1]), [[True, False, True]])
    monkeypatch.delattr(keras_private._keras_backend, "get_keras_mask")
    assert _compat.keras_mask(symbolic) is primary[0]
    np.testing.assert_array_equal(
        np.asarray(_compat.keras_mask(eager)), np.asarray(primary[1])
    )
    assert _compat.keras_mask(np.zeros(2)) is None


class _Holder(keras.layers.Layer):
    """Sublayers in every place Keras' tracker looks: an attribute, a list, a
    dict, and an RNN whose cell is itself a sublayer."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)
        self.stack = [keras.layers.Dense(3), keras.layers.Dropout(0.1)]
        self.named = {"rnn": keras.layers.RNN(keras.layers.LSTMCell(2))}
        self.shared = self.dense

    def call(self, x):
        return self.dense(x)


@pytest.mark.parametrize("recursive", [False, True])
def test_sublayers_without_flatten_layers(monkeypatch, recursive):
    holder = _Holder()
    model = keras.Sequential([keras.Input((4,)), holder])
    for layer in (holder, model):
        primary = _compat.sublayers(layer, recursive=recursive)
        assert len(primary) == len({id(x) for x in primary})
        with monkeypatch.context() as patch:
            for cls in {type(x) for x in [layer, *primary]}:
                patch.setattr(cls, "_flatten_layers", None, raising=False)
            fallback = _compat.sublayers(layer, recursive=recursive)
        assert {id(x) for x in fallback} == {id(x) for x in primary}
    names = {type(x).__name__ for x in _compat.sublayers(holder, recursive=True)}
    assert names == {"Dense", "Dropout", "RNN", "LSTMCell"}


def test_loss_tracker_without_the_attribute():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(loss="mse", metrics=["mae"])
    primary = _compat.loss_tracker(model)
    assert isinstance(primary, keras.metrics.Mean) and primary.name == "loss"
    # What a Keras without `_loss_tracker` still lists: the model's metrics.
    renamed = types.SimpleNamespace(metrics=list(model.metrics))
    assert _compat.loss_tracker(renamed) is primary


@pytest.mark.tf_only
@pytest.mark.parametrize("step", [(0,), (0, 1)], ids=["keras-3.10", "keras-3.15"])
def test_build_from_local_batch_reads_either_epoch_iterator(step):
    """Keras 3.10's TensorFlow epoch iterator yields `(step, batches)`, 3.15's
    `(begin, end, batches)`: the model is built from the first batch in both."""
    import tensorflow as tf

    built = []
    model = types.SimpleNamespace(
        distribute_strategy=tf.distribute.get_strategy(),
        _symbolic_build=lambda data_batch: built.append(data_batch),
    )
    _compat.build_from_local_batch(model)
    batch = (np.ones((2, 3), "float32"), np.zeros((2, 1), "float32"))
    model._maybe_symbolic_build(iterator=[(*step, iter([batch, None]))])
    model._maybe_symbolic_build(data_batch=batch)
    assert len(built) == 2
    for data_batch in built:
        np.testing.assert_array_equal(data_batch[0], batch[0])
        np.testing.assert_array_equal(data_batch[1], batch[1])


def test_layer_config_keeps_output_padding(monkeypatch):
    layer = keras.layers.Conv2DTranspose(3, 3, strides=2, output_padding=1)
    x = np.ones((1, 4, 4, 2), "float32")
    expected_shape = layer(x).shape
    assert expected_shape == (1, 10, 10, 3)
    # Keras 3.10's config, which has no `output_padding`.
    full = layer.get_config()
    without = {k: v for k, v in full.items() if k != "output_padding"}
    monkeypatch.setattr(type(layer), "get_config", lambda self: dict(without))
    rebuilt = type(layer).from_config(_compat.layer_config(layer))
    assert rebuilt(x).shape == expected_shape
    assert tuple(rebuilt.output_padding) == tuple(layer.output_padding)


def test_einsum_matrix_fans_detection_matches_the_initializer():
    config = keras.initializers.VarianceScaling().get_config()
    assert _compat.einsum_dense_uses_matrix_fans() == ("input_axes" in config)


@pytest.mark.parametrize("keras_computes_fans", [True, False])
def test_attention_kernels_are_xavier_over_matrix_fans(
    monkeypatch, keras_computes_fans
):
    """Query/key/value kernels (256, 4, 16) and the output kernel (4, 16, 256)
    start with std sqrt(2 / (256 + 64)), whether Keras' `EinsumDense` works
    out those fans (3.15) or the block redraws the kernels (3.10: a
    convolution's fans would give std 0.0198)."""
    import kerasnorm

    if not keras_computes_fans:
        monkeypatch.setattr(_compat, "einsum_dense_uses_matrix_fans", lambda: False)
    elif not _compat.einsum_dense_uses_matrix_fans():
        pytest.skip(f"keras {keras.__version__}'s EinsumDense has no matrix fans")
    keras.utils.set_random_seed(3)
    block = kerasnorm.TransformerEncoderBlock(4, 16, 32, norm_position="post")
    block.build((None, 5, 256))
    kernels = [w for w in block.self_attention.weights if len(w.shape) == 3]
    assert [tuple(k.shape) for k in kernels] == [(256, 4, 16)] * 3 + [(4, 16, 256)]
    for kernel in kernels:
        w = np.asarray(kernel.numpy())
        assert abs(w.mean()) < 0.01
        np.testing.assert_allclose(w.std(), (2 / 320) ** 0.5, rtol=0.03)


def test_keras_layers_lists_only_what_this_keras_has(monkeypatch):
    assert _compat.keras_layers("Dense", "LSTM") == (
        keras.layers.Dense,
        keras.layers.LSTM,
    )
    # A layer this Keras lacks, as Keras 3.10 lacks AdaptiveAveragePooling1D.
    monkeypatch.delattr(keras.layers, "Dense")
    assert _compat.keras_layers("Dense", "LSTM") == (keras.layers.LSTM,)


def test_calling_layers_without_keras_scope_stack_is_empty(monkeypatch):
    """`calling_layers` reads Keras' name-scope stack; without one (a Keras
    that keeps none) no op is attributed to a layer, and the messages that
    name layers fall back to graph scopes (`tflite.explain._by_scope`)."""
    layer = keras.layers.Dense(2, name="d")
    seen = []

    class Probe(keras.layers.Layer):
        def call(self, x):
            seen.append([lay.name for lay in _compat.calling_layers()])
            return layer(x)

    Probe(name="probe")(np.ones((1, 2), "float32"))
    assert seen == [["probe"]]
    monkeypatch.setattr(keras_tracing, "_scope_stack", lambda: None)
    seen.clear()
    Probe(name="probe_2")(np.ones((1, 2), "float32"))
    assert seen == [[]]


def _matmul_graph_ops(fn, shape):
    """The op types of `fn`'s graph traced on a float32 input of `shape`."""
    import tensorflow as tf

    function = tf.function(fn, input_signature=[tf.TensorSpec(shape, "float32")])
    graph = function.get_concrete_function().graph
    return {op.type for op in graph.get_operations()}


@pytest.mark.tf_only
@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 5, 3, 4)])
def test_matmul_as_one_product_computes_the_tensordot(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    w = rng.standard_normal((4, 6)).astype("float32")
    dense = keras.layers.Dense(6, use_bias=False)
    dense.build(shape)
    dense.kernel.assign(w)
    outside = np.asarray(dense(x))
    with _compat.matmul_as_one_product() as replaced:
        assert replaced
        inside = np.asarray(dense(x))
        ops = _matmul_graph_ops(dense, (None, *shape[1:]))
    np.testing.assert_allclose(inside, x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outside, x @ w, rtol=1e-5, atol=1e-5)
    # One product and no shape arithmetic at the dynamic batch.
    assert "BatchMatMulV2" in ops and not {"Shape", "GatherV2", "Prod"} & ops, ops
    # Keras 3.15 writes `tf.tensordot` (shape arithmetic at the open batch);
    # 3.10 writes `tf.matmul` itself, the graph the hook gives.
    outside_ops = _matmul_graph_ops(dense, (None, *shape[1:]))
    assert {"Shape", "GatherV2", "Prod"} <= outside_ops or (
        "BatchMatMulV2" in outside_ops and "Prod" not in outside_ops
    ), outside_ops


@pytest.mark.tf_only
def test_matmul_as_one_product_leaves_other_products_to_keras():
    """Integer products (Keras' int32 accumulation), batch products, a rank-2
    product and a product of two dtypes go to Keras' own `matmul`."""
    rng = np.random.default_rng(1)
    a8 = rng.integers(-5, 5, (2, 3, 4)).astype("int8")
    b8 = rng.integers(-5, 5, (4, 2)).astype("int8")
    a = rng.standard_normal((2, 3, 4)).astype("float32")
    b = rng.standard_normal((2, 4, 5)).astype("float32")
    m = rng.standard_normal((3, 4)).astype("float32")
    w16 = rng.standard_normal((4, 2)).astype("float16")
    pairs = ((a8, b8), (a, b), (m, a[0].T), (a, w16))
    want = [keras.ops.matmul(*pair) for pair in pairs]
    with _compat.matmul_as_one_product():
        got = [keras.ops.matmul(*pair) for pair in pairs]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert want[0].dtype == "int32"


@pytest.mark.tf_only
def test_matmul_as_one_product_restores_keras_on_error():
    original = keras_private._keras_backend.numpy.matmul
    with pytest.raises(RuntimeError, match="inside"):
        with _compat.matmul_as_one_product():
            assert keras_private._keras_backend.numpy.matmul is not original
            raise RuntimeError("inside")
    assert keras_private._keras_backend.numpy.matmul is original


@pytest.mark.tf_only
def test_matmul_as_one_product_without_the_hook_replaces_nothing(monkeypatch):
    monkeypatch.delattr(keras_private._keras_backend.numpy, "matmul")
    with _compat.matmul_as_one_product() as replaced:
        assert not replaced
    assert not hasattr(keras_private._keras_backend.numpy, "matmul")


@pytest.mark.tf_only
def test_backend_replaced_hooks_another_backend_module_and_restores_it():
    """`keras.ops.top_k` (`backend.math`) calls the replacement with Keras'
    own function while active; a name the module lacks is skipped."""
    math = keras_private._keras_backend.math
    original = math.top_k
    calls = []

    def top_k(own, x, k, sorted=True):
        calls.append(k)
        return own(x, k, sorted)

    x = np.float32([[3.0, 1.0, 2.0]])
    with _compat.backend_replaced("math", top_k=top_k, no_such_op=top_k) as names:
        values, _ = keras.ops.top_k(x, 2)
    assert names == ["top_k"] and calls == [2]
    np.testing.assert_array_equal(values, [[3.0, 2.0]])
    assert math.top_k is original and not hasattr(math, "no_such_op")
