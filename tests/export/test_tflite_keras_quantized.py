"""A model Keras quantized (`model.quantize(...)`) is refused by `to_tflite`
by name, before anything is written (the converter cannot lower Keras'
int8 products and lowers its int4 ones to a file that computes something
else; `to_litert_lm` writes a decoder LM's own integers)."""

import os

import keras
import pytest

from kerasnorm.export import to_tflite

pytestmark = pytest.mark.tf_only


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_keras_quantized_model_is_refused_by_name(tmp_path, mode):
    pytest.importorskip("ai_edge_litert")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, name="hidden"),
            keras.layers.Dense(8),
        ]
    )
    try:
        model.quantize(mode)
    except ValueError as error:  # Keras 3.10 has no int4
        if "Invalid quantization mode" not in str(error):
            raise
        pytest.skip(f"this Keras cannot quantize to {mode!r}: {error}")
    with pytest.raises(
        ValueError, match=f"layer 'hidden' .* quantized by Keras to '{mode}'"
    ):
        to_tflite(model, tmp_path / "q.tflite")
    assert not os.listdir(tmp_path)
