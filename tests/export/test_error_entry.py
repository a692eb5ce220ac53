"""A refused quantized `.tflite` names the layer its error comes from.

A parity failure names the layer where the quantized file first departs
from its float32 twin (`tflite/entry.py`), a node LiteRT would not prepare
is named by its layer, and the integer files LiteRT aborts on (a norm over
one channel, a tensor that is 0 on every calibration sample) are refused
before anything runs, naming the layer.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm._compat import interpreter_ops
from kerasnorm.export import ExportConversionError
from kerasnorm.export import ExportVerificationError
from kerasnorm.export import to_tflite
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.numerics.errors import with_sentence
from kerasnorm.export.options.export_options import ExportOptions
from kerasnorm.export.options.formats import format_named
from kerasnorm.export.prepare.stage import prepare
from kerasnorm.export.tflite import entry
from kerasnorm.export.tflite.write import write_tflite

pytestmark = pytest.mark.tf_only


def _frames(n=48, steps=16, channels=4, seed=0):
    return (
        np.random.default_rng(seed).normal(size=(n, steps, channels)).astype("float32")
    )


def _culprit_model():
    """Frames into a Dense of one channel, an RMSNorm over that channel
    (`x / sqrt(x^2 + eps)`: the sign of x, which int8 rounding flips near 0),
    then a head. Everything before the norm quantizes well."""
    keras.utils.set_random_seed(0)
    i = keras.Input((16, 4))
    x = keras.layers.Dense(8, activation="relu", name="embed")(i)
    x = keras.layers.Dense(1, name="squeeze")(x)
    x = kerasnorm.RMSNorm(name="culprit")(x)
    x = keras.layers.Dense(8, activation="relu", name="widen")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(i, keras.layers.Dense(2, name="head")(x))


def test_a_failed_int8_check_names_the_layer_where_the_error_enters(tmp_path):
    model = _culprit_model()
    x = _frames()
    path = tmp_path / "m.tflite"
    with pytest.raises(ExportVerificationError) as info:
        to_tflite(model, path, quantize="int8", representative_data=x, verify_inputs=x)
    text = str(info.value)
    _, _, rest = text.partition("above the tolerance")
    assert "The error enters at layer 'culprit'" in rest, text
    # Not a layer downstream, where the error only shows.
    for later in ("widen", "pool", "head"):
        assert f"enters at layer '{later}'" not in text
    assert not path.exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_the_entry_is_where_a_float_twin_departs_not_before(tmp_path):
    """The same model without the norm exports at int8: the layers before
    it, which the hint says are below the tolerance, are."""
    keras.utils.set_random_seed(0)
    model = _culprit_model()
    x = _frames()
    before = keras.Model(model.input, model.get_layer("squeeze").output)
    result = to_tflite(
        before,
        tmp_path / "b.tflite",
        quantize="int8",
        representative_data=x,
        verify_inputs=x,
    )
    assert result.verification.rms_rel_error < 0.1


def test_a_failed_float16_check_names_the_layer_where_the_error_enters(tmp_path):
    """A fuzzed graph (`export/fuzz_graphs.py`, seed 3106: frames of one
    channel, a Dense, attention, an RMSNorm over one channel, max pooling)
    whose float16 file fails its check: the RMSNorm's `rsqrt` of a value
    near 0 is where float16 rounding enters."""
    from export.fuzz_graphs import sequence_graph

    model, x, _ = sequence_graph(3106)
    with pytest.raises(ExportVerificationError) as info:
        to_tflite(model, tmp_path / "m.tflite", quantize="float16", verify_inputs=x)
    assert "The error enters at layer 'rms_norm" in str(info.value), info.value


def test_a_passing_int8_export_has_no_hint(tmp_path):
    keras.utils.set_random_seed(1)
    i = keras.Input((16, 4))
    x = kerasnorm.LayerNorm(name="ln")(keras.layers.Dense(8, name="d")(i))
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(i, keras.layers.Dense(2)(x))
    x = _frames()
    result = to_tflite(
        model,
        tmp_path / "m.tflite",
        quantize="int8",
        representative_data=x,
        verify_inputs=x,
    )
    assert result.verification.rms_rel_error < 0.1


def test_int16x8_keras_layer_normalization_over_one_channel_is_refused_naming_it(
    tmp_path,
):
    """Keras' LayerNormalization over one channel: its int16x8 file holds
    `SUB(x, x)` with a scale of 1e-43, on which LiteRT aborts the process
    allocating the file. Refused before anything runs, naming the layer."""
    keras.utils.set_random_seed(2)
    i = keras.Input((32, 1))
    x = keras.layers.LayerNormalization(name="one_channel")(i)
    x = keras.layers.Conv1D(4, 1, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(i, keras.layers.Dense(2)(x))
    x = _frames(steps=32, channels=1)
    path = tmp_path / "m.tflite"
    with pytest.raises(ExportConversionError, match=r"'one_channel' normalize over"):
        to_tflite(model, path, quantize="int16x8", representative_data=x)
    assert not path.exists()


def test_a_unit_that_never_fires_is_refused_at_int16x8_naming_its_layer(tmp_path):
    """A ReLU unit that is 0 on every calibration sample gets a subnormal
    int16 scale (3.6e-43) that LiteRT aborts on preparing the next op."""
    i = keras.Input((16, 1))
    dead = keras.layers.Dense(
        1,
        activation="relu",
        kernel_initializer="zeros",
        bias_initializer=keras.initializers.Constant(-1.0),
        name="dead",
    )
    x = keras.layers.Dense(4, activation="gelu")(i)
    x = keras.layers.GlobalMaxPooling1D()(dead(x))
    model = keras.Model(i, keras.layers.Dense(2)(x))
    x = _frames(steps=16, channels=1)
    path = tmp_path / "m.tflite"
    with pytest.raises(ExportConversionError, match=r"zero quantization scale.*'dead'"):
        to_tflite(model, path, quantize="int16x8", representative_data=x)
    assert not path.exists()


def test_a_node_litert_would_not_prepare_is_named_by_its_layer(tmp_path):
    """LiteRT's "Node number N (OP) failed to prepare" is named by the layer
    that created op N (here the file's only FULLY_CONNECTED, the Dense
    named 'head')."""
    keras.utils.set_random_seed(3)
    i = keras.Input((16, 4))
    x = keras.layers.Conv1D(4, 3, padding="same", activation="relu")(i)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(i, keras.layers.Dense(2, name="head")(x))
    x = _frames()
    options = ExportOptions.build(
        format_named("litert"), quantize="int16x8", representative_data=x
    )
    prepared = prepare(model, options)
    path = tmp_path / "m.tflite"
    write_tflite(prepared, path)
    ops = interpreter_ops(unallocated(path.read_bytes()))
    (index,) = [k for k, op in enumerate(ops) if op["op_name"] == "FULLY_CONNECTED"]
    err = ExportVerificationError(
        f"LiteRT cannot run {path} (step allocate, delegate XNNPACK): some check "
        f"was not true.Node number {index} (FULLY_CONNECTED) failed to prepare. "
        "The file was not written."
    )
    hinted = entry.with_entry_hint(err, prepared, path)
    assert f"Node {index} (FULLY_CONNECTED) is computed by layer 'head'." in str(hinted)
    # A node number that is not that op: no guess.
    wrong = ExportVerificationError(str(err).replace("(FULLY_CONNECTED)", "(CONV_2D)"))
    assert entry.with_entry_hint(wrong, prepared, path) is wrong


def test_with_sentence_goes_after_the_first_sentence_or_at_the_end():
    err = ExportVerificationError(
        "Parity failed: the rms error 0.2, above the tolerance 0.1. Figures."
    )
    assert str(with_sentence(err, "Hint.")) == (
        "Parity failed: the rms error 0.2, above the tolerance 0.1. Hint. Figures."
    )
    one = ExportVerificationError("LiteRT crashed at the allocate step")
    assert (
        str(with_sentence(one, "Hint.")) == "LiteRT crashed at the allocate step Hint."
    )
    assert type(with_sentence(one, "x")) is ExportVerificationError
