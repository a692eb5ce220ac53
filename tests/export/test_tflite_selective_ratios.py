"""The fast int8 file of a token model (LayerNorm over the channels of a
(batch, tokens, channels) tensor) is one XNNPACK partition.

ViT-, MLP-Mixer- and gMLP-style models with the `beta` a trained norm
ends with (|beta| ~ 1e-3, set here, against outputs of a few units): the
int8 beta add's constant-to-output scale ratio falls under the 2**-10
XNNPACK's int8 ADD takes, and before `xnnpack_refused` each such ADD ran
outside the partition (4 partitions, 3 ADDs outside, for each model
here). The partitions come from LiteRT's interpreter (`delegation`), the
reference outputs from the Keras model.
"""

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm._compat import tflite_calibrated
from kerasnorm._compat import tflite_quantize_calibrated
from kerasnorm.export import DEFAULT_TOLERANCE
from kerasnorm.export import litert
from kerasnorm.export import to_tflite
from kerasnorm.export.litert.runner import interpreter as litert_interpreter
from kerasnorm.export.tflite.selective import FLOAT_OPS
from kerasnorm.export.tflite.selective import SIGNATURE_KEY
from kerasnorm.export.tflite.selective import statistics_nodes
from kerasnorm.export.tflite.selective import xnnpack_refused
from kerasnorm.export.verify.delegation import delegation

pytestmark = pytest.mark.tf_only

L = keras.layers
TOKENS, CHANNELS = 16, 24


def _head(x, inputs):
    x = kerasnorm.LayerNorm()(x)
    return keras.Model(inputs, L.Dense(4)(L.GlobalAveragePooling1D()(x)))


def _token_mix(x):
    x = L.Permute((2, 1))(x)
    return L.Permute((2, 1))(L.Dense(TOKENS)(x))


def _vit():
    inputs = keras.Input((TOKENS, CHANNELS))
    x = L.Dense(32)(inputs)
    h = kerasnorm.LayerNorm()(x)
    x = x + L.MultiHeadAttention(2, 16)(h, h)
    h = kerasnorm.LayerNorm()(x)
    x = x + L.Dense(32)(L.Dense(64, activation="relu")(h))
    return _head(x, inputs)


def _mixer():
    inputs = keras.Input((TOKENS, CHANNELS))
    x = L.Dense(32)(inputs)
    x = x + _token_mix(kerasnorm.LayerNorm()(x))
    h = kerasnorm.LayerNorm()(x)
    x = x + L.Dense(32)(L.Dense(64, activation="relu")(h))
    return _head(x, inputs)


def _gmlp():
    inputs = keras.Input((TOKENS, CHANNELS))
    x = L.Dense(32)(inputs)
    h = L.Dense(64, activation="relu")(kerasnorm.LayerNorm()(x))
    u, v = h[..., :32], h[..., 32:]
    x = x + L.Dense(32)(u * _token_mix(kerasnorm.LayerNorm()(v)))
    return _head(x, inputs)


MODELS = {"ViT": _vit, "MLP-Mixer": _mixer, "gMLP": _gmlp}


def _trained_like(build):
    keras.utils.set_random_seed(0)
    model = build()
    rng = np.random.default_rng(1)
    for layer in model.layers:
        if isinstance(layer, kerasnorm.LayerNorm):
            layer.beta.assign(1e-3 * rng.standard_normal(layer.beta.shape))
    return model


def _data(n, seed):
    rng = np.random.default_rng(seed)
    return (4 * rng.standard_normal((n, TOKENS, CHANNELS))).astype("float32")


@pytest.mark.parametrize("name", list(MODELS))
def test_token_model_fast_int8_is_one_partition(name, tmp_path):
    model = _trained_like(MODELS[name])
    data, test = _data(64, 0), _data(16, 1)
    path = tmp_path / "fast.tflite"
    result = to_tflite(
        model,
        str(path),
        quantize="int8",
        representative_data=data,
        verify_inputs=test,
        batch_size=1,
    )
    content = path.read_bytes()
    report = delegation(content)
    assert report.fully_delegated, report
    assert result.verification.delegation == report
    assert xnnpack_refused(content) == []
    # The beta adds run in float inside the partition; the matmuls stay int8.
    assert "ADD" in result.float_ops, result.float_ops
    assert "FULLY_CONNECTED" not in result.float_ops
    want = np.asarray(model(test))
    got = litert.Runner(content).predict(test)[0]
    rms = float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))
    assert rms <= DEFAULT_TOLERANCE["int8"]


def test_refused_ops_are_the_ones_litert_leaves_out(tmp_path):
    """`xnnpack_refused` read from the scales agrees with LiteRT's own split
    on the file quantized without its second pass."""
    model = _trained_like(_vit)
    float_path = tmp_path / "f.tflite"
    # The norms whole, as the fast int8 writer converts them: a float32
    # file's fold would take their affines into the next Dense.
    to_tflite(model, str(float_path), batch_size=1, fold=False)
    float_content = float_path.read_bytes()
    signature = litert_interpreter(float_content).get_signature_runner(SIGNATURE_KEY)
    (name,) = signature.get_input_details()
    data = _data(32, 0)
    calibrated = tflite_calibrated(
        float_content, lambda: ((SIGNATURE_KEY, {name: x[None]}) for x in data)
    )
    first = tflite_quantize_calibrated(
        calibrated, float_ops=FLOAT_OPS, float_nodes=statistics_nodes(float_content)
    )
    refused = xnnpack_refused(first)
    report = delegation(first)
    # One beta add per LayerNorm (3 here) is refused, and nothing else.
    assert len(refused) == 3
    assert report.undelegated == {"ADD": len(refused)}, report
    assert report.partitions == 1 + len(refused)
