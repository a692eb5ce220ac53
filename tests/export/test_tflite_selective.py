"""`quantize_selectively`: int8 files that XNNPACK runs as one partition.

Per norm, the plain full-integer file splits into several partitions (the
problem) and the selective file runs as one (the fix), with its logits as
close to Keras' as an int8 file's; the partitions come from LiteRT's
interpreter (`delegation`), the reference logits from the Keras model.
"""

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import to_tflite
from kerasnorm.export.tflite.selective import FLOAT_OPS
from kerasnorm.export.tflite.selective import quantize_selectively
from kerasnorm.export.tflite.selective import statistics_nodes
from kerasnorm.export.verify.delegation import delegation

pytestmark = pytest.mark.tf_only

L = keras.layers
NORMS = {
    "LayerNorm": lambda: kerasnorm.LayerNorm(),
    "RMSNorm": lambda: kerasnorm.RMSNorm(),
    "GroupNorm": lambda: kerasnorm.GroupNorm(4),
    "InstanceNorm": lambda: kerasnorm.InstanceNorm(),
}


def _conv_net(norm):
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same")(inputs)
    skip = L.ReLU()(norm()(x))
    x = L.Add()([L.Conv2D(8, 3, padding="same")(skip), skip])
    x = L.ReLU()(norm()(x))
    return keras.Model(inputs, L.Dense(4)(L.GlobalAveragePooling2D()(x)))


def _encoder():
    inputs = keras.Input((8, 16))
    x = kerasnorm.TransformerEncoderBlock(
        num_heads=2, key_dim=8, intermediate_dim=16, num_layers=1
    )(inputs)
    return keras.Model(inputs, L.Dense(4)(L.GlobalAveragePooling1D()(x)))


def _rms_rel(want, got):
    return float(np.sqrt(np.mean((want - got) ** 2) / np.mean(want**2)))


def _files(model, tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(32, *model.inputs[0].shape[1:])).astype("float32")
    float_path, int8_path = tmp_path / "f.tflite", tmp_path / "i.tflite"
    # Fixed shapes: a dynamic batch's shape arithmetic runs outside XNNPACK.
    to_tflite(model, str(float_path), batch_size=1)
    # The full-integer file (every op int8), what quantize="int8" wrote
    # before the fast file became its default.
    to_tflite(
        model,
        str(int8_path),
        quantize="int8",
        int8_io=True,
        representative_data=data,
        batch_size=1,
    )
    fast = quantize_selectively(
        float_path.read_bytes(),
        lambda: ({"input_0": data[i : i + 1]} for i in range(len(data))),
    )
    return data, int8_path.read_bytes(), fast


def _predict(content, x):
    from kerasnorm.export import litert

    runner = litert.Runner(content)
    return np.concatenate([runner.predict(x[i : i + 1])[0] for i in range(len(x))])


@pytest.mark.parametrize("norm", list(NORMS))
def test_each_norm_runs_as_one_partition(norm, tmp_path):
    keras.utils.set_random_seed(0)
    model = _conv_net(NORMS[norm])
    data, plain, fast = _files(model, tmp_path)
    assert delegation(plain).partitions > 1
    report = delegation(fast.content)
    assert report.fully_delegated, report
    # Two norms: each keeps its own statistics and its normalization
    # ((x - mean) * rsqrt: SUB, MUL) in float, nothing else (the squares are
    # a SQUARE, or a MUL of the centred values by themselves).
    assert fast.float_ops["RSQRT"] == 2
    assert fast.float_ops["MUL"] >= 2  # x * rsqrt (InstanceNorm: also -mean * rsqrt)
    # GroupNorm's statistics also average each group's channels: a
    # FULLY_CONNECTED on (batch, C), reshaped back (`_core.lowering`).
    group_average = {"FULLY_CONNECTED", "RESHAPE"} if norm == "GroupNorm" else set()
    assert (
        set(fast.float_ops)
        <= {"ADD", "MEAN", "NEG", "RSQRT", "SUB", "MUL"}
        | {
            "SQUARE",
            "SQUARED_DIFFERENCE",
            "MUL",
        }
        | group_average
    )
    want = np.asarray(model(data[:16]))
    assert _rms_rel(want, _predict(fast.content, data[:16])) < 0.05
    assert len(fast.content) < len(plain) * 1.2


def test_encoder_attention_stays_in_the_partition(tmp_path):
    keras.utils.set_random_seed(0)
    model = _encoder()
    data, plain, fast = _files(model, tmp_path)
    assert set(delegation(plain).undelegated) & set(FLOAT_OPS)
    assert delegation(fast.content).fully_delegated
    assert {"BATCH_MATMUL", "SOFTMAX"} <= set(fast.float_ops)
    want = np.asarray(model(data[:16]))
    assert _rms_rel(want, _predict(fast.content, data[:16])) < 0.08


def test_statistics_stop_at_the_norm(tmp_path):
    # The second norm follows a residual Add: its statistics chain must not
    # reach back into the Add, or the residual would run in float.
    keras.utils.set_random_seed(0)
    model = _conv_net(NORMS["LayerNorm"])
    path = tmp_path / "f.tflite"
    to_tflite(model, str(path))
    nodes = statistics_nodes(path.read_bytes())
    assert len(nodes) == 2 * 4  # per norm: squares, mean, + epsilon, rsqrt
    assert all("layer_norm" in name for name in nodes), nodes


def test_int8_io_gives_int8_inputs_and_outputs(tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    keras.utils.set_random_seed(0)
    model = _conv_net(NORMS["LayerNorm"])
    path = tmp_path / "f.tflite"
    to_tflite(model, str(path))
    data = np.random.default_rng(0).normal(size=(8, 8, 8, 3)).astype("float32")
    fast = quantize_selectively(
        path.read_bytes(),
        lambda: ({"input_0": data[i : i + 1]} for i in range(len(data))),
        int8_io=True,
    )
    interpreter = Interpreter(model_content=fast.content)
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert interpreter.get_output_details()[0]["dtype"] == np.int8
    assert delegation(fast.content).fully_delegated


def test_instance_norm_over_token_embeddings_centres_in_float(tmp_path):
    """Fuzzed graph 3010 (`export/fuzz_graphs.py`: token ids into an
    `Embedding(mask_zero=True)`, two InstanceNorms over time, masked average
    pooling) was refused at int8 with rms 0.37: InstanceNorm's
    `x * m + (beta - mean * m)` subtracted two int8 products where a
    channel's spread is small against its mean. The fast int8 file now
    centres first and keeps `(x - mean) * m` in float: it passes, and a raw
    LiteRT run of the file agrees with Keras."""
    from export.fuzz_export import raw_run
    from export.fuzz_graphs import SAMPLES
    from export.fuzz_graphs import sequence_graph
    from kerasnorm.export.tflite.selective import kept_float_nodes

    model, x, _ = sequence_graph(3010)
    path = tmp_path / "m.tflite"
    result = to_tflite(
        model,
        path,
        quantize="int8",
        representative_data=x,
        verify_inputs=x,
        calibration_samples=SAMPLES,
    )
    assert result.verification.rms_rel_error < 0.1
    want = model.predict(x, verbose=0)
    got = raw_run(path, x)
    scale = np.sqrt(np.mean(want**2))
    assert np.sqrt(np.mean((got - want) ** 2)) / scale < 0.1
    kept = kept_float_nodes(path.read_bytes())
    # Each norm's centred input (`sub_1`; `sub` is the variance's, fused into
    # its float SQUARED_DIFFERENCE) and its product by the root (`mul_2`).
    for op in ("sub_1", "mul_2"):
        assert len([n for n in kept if n.endswith(f"/{op}")]) == 2, kept
