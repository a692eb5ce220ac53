"""`to_tflite(quantize="int8")` writes the fast int8 file: one XNNPACK
partition per norm, the norms' statistics in float, its error within the
int8 tolerance; `int8_io=True` keeps the full-integer file.

Each file is checked twice: by `to_tflite`'s own verification (which must
report the partitions) and here against the Keras model through
`litert.Runner`, an independent run of the file.
"""

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import DEFAULT_TOLERANCE
from kerasnorm.export import litert
from kerasnorm.export import to_tflite
from kerasnorm.export.litert.runner import interpreter as litert_interpreter
from kerasnorm.export.verify.delegation import delegation

pytestmark = pytest.mark.tf_only

L = keras.layers


def _conv(norm):
    def build():
        inputs = keras.Input((8, 8, 3))
        x = L.ReLU()(norm()(L.Conv2D(8, 3, padding="same")(inputs)))
        return keras.Model(inputs, L.Dense(4)(L.GlobalAveragePooling2D()(x)))

    return build


def _lstm():
    inputs = keras.Input((6, 4))
    return keras.Model(inputs, L.Dense(4)(kerasnorm.LayerNormLSTM(8)(inputs)))


def _pre_ln():
    inputs = keras.Input((8, 16))
    x = kerasnorm.TransformerEncoderBlock(
        num_heads=2, key_dim=8, intermediate_dim=16, num_layers=1
    )(inputs)
    return keras.Model(inputs, L.Dense(4)(L.GlobalAveragePooling1D()(x)))


# name -> (model, ops kept in float that must be there, partitions, ops
# outside them). The unrolled LSTM's sequence UNPACK has no XNNPACK kernel:
# it stays outside in the float32 file too (2 partitions there as well).
NORM_STATS = {"RSQRT", "MEAN"}
MODELS = {
    "LayerNorm": (_conv(kerasnorm.LayerNorm), NORM_STATS, 1, {}),
    "RMSNorm": (_conv(kerasnorm.RMSNorm), NORM_STATS, 1, {}),
    "GroupNorm": (_conv(lambda: kerasnorm.GroupNorm(4)), NORM_STATS, 1, {}),
    "InstanceNorm": (_conv(kerasnorm.InstanceNorm), NORM_STATS, 1, {}),
    "LayerNormLSTM": (_lstm, NORM_STATS, 2, {"UNPACK": 1}),
    "Pre-LN block": (_pre_ln, {"RSQRT", "BATCH_MATMUL", "SOFTMAX"}, 1, {}),
}


def _data(model, n, seed):
    shape = model.inputs[0].shape[1:]
    return np.random.default_rng(seed).normal(size=(n, *shape)).astype("float32")


@pytest.mark.parametrize("name", list(MODELS))
def test_fast_int8_is_one_partition_within_tolerance(name, tmp_path):
    build, kept, partitions, outside = MODELS[name]
    keras.utils.set_random_seed(0)
    model = build()
    data, test = _data(model, 64, 0), _data(model, 16, 1)
    path = tmp_path / "fast.tflite"
    # The fast file at a fixed shape: a dynamic batch's shape arithmetic
    # runs outside XNNPACK (docs/guides/export.md, "Shapes").
    result = to_tflite(
        model,
        str(path),
        quantize="int8",
        representative_data=data,
        verify_inputs=test,
        batch_size=1,
    )
    content = path.read_bytes()
    check = result.verification
    assert check.delegation == delegation(content)
    assert check.delegation.partitions == partitions, check.delegation
    assert check.delegation.undelegated == outside, check.delegation
    assert kept <= set(result.float_ops), result.float_ops
    # The matmuls and convolutions stay int8 (but GroupNorm's group averages
    # of its statistics, tests/export/test_tflite_int8_group_norm.py).
    linear = {"CONV_2D"} if name == "GroupNorm" else {"CONV_2D", "FULLY_CONNECTED"}
    assert not linear & set(result.float_ops)
    assert f"XNNPACK: {check.delegation}" in str(check)
    want = np.asarray(model(test))
    got = litert.Runner(content).predict(test)[0]
    rms = float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))
    assert rms <= DEFAULT_TOLERANCE["int8"]
    np.testing.assert_allclose(rms, check.rms_rel_error, rtol=1e-3)


def test_int8_io_keeps_the_full_integer_file(tmp_path):
    keras.utils.set_random_seed(0)
    model = MODELS["LayerNorm"][0]()
    data = _data(model, 64, 0)
    path = tmp_path / "full.tflite"
    result = to_tflite(
        model, str(path), quantize="int8", int8_io=True, representative_data=data
    )
    interpreter = litert_interpreter(path.read_bytes())
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert result.float_ops == ()
    # Every op int8: the norm's statistics fall out of XNNPACK.
    assert result.verification.delegation.partitions > 1
    assert "RSQRT" in result.verification.delegation.undelegated


def test_float_files_report_their_partitions(tmp_path):
    keras.utils.set_random_seed(0)
    model = MODELS["LayerNorm"][0]()
    result = to_tflite(model, str(tmp_path / "f.tflite"))
    assert result.float_ops == ()
    assert result.verification.delegation.fully_delegated
