"""One keyword, `verify_inputs`, for the inputs every export check runs on."""

import os

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import fold_batchnorm
from kerasnorm.export import model_inputs
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export import verify
from kerasnorm.export.inputs.data import RANDOM_SAMPLES
from kerasnorm_cli import command as main
from tests.support.helpers import random_inputs

# SavedModel export traces TensorFlow.
pytestmark = pytest.mark.tf_only

L = keras.layers
POSITIONS = 16


@keras.saving.register_keras_serializable(package="tests_export_inputs")
class Positions(L.Layer):
    """A learned position embedding of `POSITIONS` positions (BERT / GPT-2
    style): a longer sequence is an error, as in those models."""

    def build(self, input_shape):
        self.table = self.add_weight(
            shape=(POSITIONS, input_shape[-1]), initializer="random_normal"
        )

    def call(self, x):
        length = keras.ops.shape(x)[1]
        return x + keras.ops.slice(self.table, (0, 0), (length, x.shape[-1]))


def _text_model():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = Positions(name="positions")(L.Embedding(50, 8, name="embed")(tokens))
    x = kerasnorm.TransformerEncoderBlock(num_heads=2, key_dim=4, intermediate_dim=16)(
        x
    )
    x = L.BatchNormalization(name="bn")(L.Dense(4, name="proj")(x))
    model = keras.Model(tokens, L.Dense(3, name="head")(x), name="text")
    bn = model.get_layer("bn")
    bn.moving_mean.assign(np.linspace(-1, 1, 4))
    bn.moving_variance.assign(np.linspace(0.5, 2, 4))
    return model


def _tokens(n=5, length=12, seed=0):
    return np.random.default_rng(seed).integers(0, 50, (n, length)).astype("int32")


def test_text_model_exports_on_the_given_inputs(tmp_path):
    model = _text_model()
    x = _tokens()
    with pytest.raises(Exception, match=r"slice|Slice|size"):
        model(_tokens(length=32))  # what invented length-32 inputs hit
    result = to_saved_model(model, tmp_path / "text", verify_inputs=x)
    report = result.fold_report
    assert [f.batchnorm for f in report.folded] == ["bn"], report
    # The fold's self-check and the parity check ran on the same inputs.
    assert report.check_shapes == [x.shape]
    assert result.verification.samples == len(x)
    again = verify(model, result.path, x)
    assert again.samples == len(x) and again.checked_on == "verify_inputs"


def test_cli_verify_data_reaches_the_fold(tmp_path, capsys):
    model = _text_model()
    model.save(tmp_path / "text.keras")
    np.save(tmp_path / "tokens.npy", _tokens(n=3, length=10))
    code = main(
        [
            "export",
            str(tmp_path / "text.keras"),
            "--out",
            str(tmp_path / "out"),
            "--saved-model",
            "--verify-data",
            str(tmp_path / "tokens.npy"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "folded bn -> proj (after)" in captured.out
    assert "(inputs (3, 10))" in captured.out, captured.out
    assert os.listdir(tmp_path / "out" / "text") == ["1"]


def test_invented_inputs_are_valid_for_the_model():
    # Integers below the embedding's input_dim; the undefined length tried
    # at 32, then at 16, which the position table holds.
    model = _text_model()
    _, report = fold_batchnorm(model, return_report=True)
    assert report.check_shapes == [(2, POSITIONS)], report
    tokens = keras.Input((3,), dtype="int32")
    x = L.Dense(2)(L.Flatten()(L.Embedding(5, 2)(tokens)))
    small = keras.Model(tokens, L.BatchNormalization()(x))
    from kerasnorm.export.inputs.data import sample_inputs
    from kerasnorm.export.model.facts import all_layers

    (sample,) = sample_inputs(small, 200, layers=list(all_layers(small)))
    assert sample.dtype == np.int32 and sample.min() == 0 and sample.max() == 4


@keras.saving.register_keras_serializable(package="tests_export_inputs")
class _NeedsSeven(L.Layer):
    def call(self, x):
        if x.shape[1] not in (None, 7):
            raise ValueError("this layer takes sequences of 7")
        return x


def test_no_size_works_names_the_input_and_dimension():
    inputs = keras.Input((None, 3), name="frames")
    x = L.BatchNormalization()(L.Dense(3)(_NeedsSeven()(inputs)))
    model = keras.Model(inputs, x)
    with pytest.raises(
        ValueError,
        match=r"(?s)inputs that model .* input 'frames' dimension 1 is undefined, "
        r".* every size tried "
        r"\(32, 16, 8, 4, 2, 1\); pass verify_inputs= .* sequences of 7",
    ):
        fold_batchnorm(model)
    folded = fold_batchnorm(model, verify_inputs=random_inputs((2, 7, 3)))
    assert len(folded.layers) < len(model.layers)


def _dense_bn():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((4,)), L.Dense(3), L.BatchNormalization()], name="dense_bn"
    )


def test_the_removed_keyword_names_are_refused(tmp_path):
    # `check_inputs=` and `verify(inputs=)` were removed before 0.1.0: every
    # export function takes `verify_inputs`.
    model = _dense_bn()
    x = random_inputs((6, 4))
    with pytest.raises(TypeError, match="check_inputs"):
        fold_batchnorm(model, return_report=True, check_inputs=x)
    _, report = fold_batchnorm(model, return_report=True, verify_inputs=x)
    assert report.check_shapes == [(6, 4)]
    path = to_tflite(model, tmp_path / "m.tflite", verify_inputs=x).path
    with pytest.raises(TypeError, match="inputs"):
        verify(model, path, inputs=x)
    assert verify(model, path, x).samples == 6  # positional
    assert verify(model, path, verify_inputs=x[:2]).samples == 2


class _Net(keras.Model):
    """A subclassed model: no Input, its graph is its `call`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = L.Dense(3)
        self.bn = L.BatchNormalization()

    def call(self, x, training=False):
        return keras.ops.relu(self.bn(self.dense(x), training=training))


def _called_net():
    keras.utils.set_random_seed(0)
    net = _Net(name="net")
    net(random_inputs((4, 5)))
    net.bn.moving_mean.assign([0.2, -0.1, 0.3])
    return net


def test_subclassed_model_exports_without_folding(tmp_path):
    net = _called_net()
    x = random_inputs((6, 5), seed=1)
    saved = to_saved_model(net, tmp_path / "net", fold=False, verify_inputs=x)
    assert saved.fold_report is None and saved.verification.samples == 6
    import tensorflow as tf

    serve = tf.saved_model.load(saved.path).signatures["serving_default"]
    (y,) = serve(input_0=tf.constant(x)).values()
    np.testing.assert_allclose(y.numpy(), np.asarray(net(x)), rtol=1e-5, atol=1e-6)
    # Without verify_inputs the signature comes from the shapes it was
    # built with, (4, 5): any batch, 5 features.
    lite = to_tflite(net, tmp_path / "net.tflite", fold=False)
    assert lite.verification.samples == RANDOM_SAMPLES
    with pytest.raises(ValueError, match=r"subclassed model's graph .* fold=False"):
        to_tflite(net, tmp_path / "folded.tflite")
    with pytest.raises(ValueError, match=r"Model 'fresh' is not built"):
        to_saved_model(_Net(name="fresh"), tmp_path / "fresh", fold=False)
    assert sorted(os.listdir(tmp_path)) == ["net", "net.tflite"]


def test_subclassed_model_reads_its_input_shapes_by_one_rule(tmp_path):
    # Arrays give the wrapper's Inputs their shapes; a dataset is read
    # against the shapes the model was built with; a mapping is refused
    # before anything is written (a subclassed model's inputs have no names).
    import tensorflow as tf

    net = _called_net()
    x = random_inputs((6, 5), seed=1)
    data = tf.data.Dataset.from_tensor_slices(x).batch(4)
    saved = to_saved_model(net, tmp_path / "net", fold=False, verify_inputs=data)
    assert saved.verification.samples == 6
    assert saved.verification.checked_on == "verify_inputs"
    serve = tf.saved_model.load(saved.path).signatures["serving_default"]
    (y,) = serve(input_0=tf.constant(x)).values()
    np.testing.assert_allclose(y.numpy(), np.asarray(net(x)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"verify_inputs cannot be a mapping"):
        to_saved_model(net, tmp_path / "dict", fold=False, verify_inputs={"x": x})
    with pytest.raises(ValueError, match=r"representative_data cannot be a mapping"):
        to_tflite(
            net,
            tmp_path / "dict.tflite",
            fold=False,
            quantize="int8",
            representative_data={"x": x},
        )
    assert sorted(os.listdir(tmp_path)) == ["net"]


def test_qat_functions_take_verify_inputs_only():
    pytest.importorskip("tf_keras")
    pytest.importorskip("tensorflow_model_optimization")
    from kerasnorm.export import quantize_aware
    from kerasnorm.export import to_tf_keras

    model = _dense_bn()
    x = random_inputs((6, 4))
    assert to_tf_keras(model, verify_inputs=x).count_params() == model.count_params()
    with pytest.raises(TypeError, match="check_inputs"):
        to_tf_keras(model, check_inputs=x)
    with pytest.raises(TypeError, match="check_inputs"):
        quantize_aware(model, check_inputs=x)


def test_model_inputs_reads_unnamed_archives_in_order(tmp_path):
    # np.savez(f, a, b) names the arrays arr_0, arr_1: read in order; a
    # one-input model's one array under any name is its input; inputs that
    # hold different numbers of samples are refused.
    age = keras.Input((3,), name="age")
    city = keras.Input((2,), name="city")
    model = keras.Model([age, city], L.Dense(1)(L.Concatenate()([age, city])))
    a, c = random_inputs((4, 3)), random_inputs((4, 2), seed=1)
    np.savez(tmp_path / "ordered.npz", a, c)
    with np.load(tmp_path / "ordered.npz") as archive:
        got = model_inputs(model, archive, argument="--data")
    assert [x.tolist() for x in got] == [a.tolist(), c.tolist()]
    with pytest.raises(ValueError, match=r"--data has 1 input array\(s\)"):
        model_inputs(model, {"arr_0": a}, argument="--data")
    with pytest.raises(ValueError, match=r"--data is missing model input\(s\)"):
        model_inputs(model, {"first": a, "second": c}, argument="--data")
    with pytest.raises(
        ValueError, match=r"holds different numbers of samples .*\(age: 4, city: 3\)"
    ):
        model_inputs(model, [a, c[:3]])

    one = keras.Sequential([keras.Input((3,)), L.Dense(1)])
    assert model_inputs(one, {"x": a}).tolist() == a.tolist()
