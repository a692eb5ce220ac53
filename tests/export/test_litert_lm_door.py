"""`format="litert_lm"` through the one door (`kerasnorm.export.export`)
and `kerasnorm export --format litert_lm`: the same checked generative file
`to_litert_lm` writes."""

import os

import keras
import numpy as np
import pytest

from kerasnorm.export import EXPORT_FORMATS
from kerasnorm.export import GenerativeExport
from kerasnorm.export import export
from kerasnorm.export import litert
from kerasnorm.export.litert_lm.export import LITERT_LM_QUANTIZE_MODES
from kerasnorm_cli import arguments
from kerasnorm_cli import command as main
from kerasnorm_cli.exits import EXIT_USAGE
from tests.export import lm_models
from tests.export.flatbuffer_ops import cache_writes

pytestmark = pytest.mark.tf_only

# What a decode step computes outside XNNPACK: from `tokens` and `input_pos`
# before the first layer, and the cache writes after the last (the update,
# its start packed and sliced from `input_pos`).
INPUT_OPS = {"GATHER", "LESS", "ADD", "SELECT", "GREATER", "CAST", "ONE_HOT", "RESHAPE"}
WRITE_OPS = {"DYNAMIC_UPDATE_SLICE", "PACK", "STRIDED_SLICE", "EQUAL"}


@pytest.fixture(scope="module")
def decoder():
    keras.utils.set_random_seed(0)
    return lm_models.kerasnorm_decoder(layers=1, width=16)


def test_the_door_writes_what_to_litert_lm_writes(decoder, tmp_path):
    """`to_litert_lm` is the door with `format="litert_lm"`; the door's
    file is the checked generative file, with its decode step's report."""
    path = tmp_path / "door.tflite"
    result = export(
        decoder, path, format="litert_lm", max_sequence_length=8, prefill_lengths=(4,)
    )
    assert isinstance(result, GenerativeExport)
    assert result.path == str(path) and os.listdir(tmp_path) == ["door.tflite"]
    assert result.signatures == {"prefill": 4, "decode": 1}
    assert result.cache_shape == (1, 2, 8, 8) and result.num_layers == 1
    assert result.check.prompts == 2 and result.check.invented_prompts
    # The decode step is one XNNPACK partition: outside it only the ops on
    # the inputs, computed before it (the token lookup and Keras' negative
    # index guard, the causal mask's and the cache row's masks), and the
    # cache writes after it.
    assert result.delegation.partitions == 1, result.delegation
    assert set(result.delegation.undelegated) <= INPUT_OPS | WRITE_OPS, (
        result.delegation
    )
    assert cache_writes(path.read_bytes()) == 2  # one layer's key and value
    assert result.decode_ms > 0
    # The file against the model's full forward pass, independently of the
    # export's own check: the prefill's last row (its only logits by
    # default), then a decode step.
    generator = litert.Generator(path.read_bytes())
    assert not generator.all_rows
    ids = [3, 5, 9, 1]
    want = np.asarray(decoder(np.asarray([[*ids, 7]], np.int32), training=False))[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(generator.prefill(ids), want[3:4], atol=1e-4 * scale)
    np.testing.assert_allclose(generator.decode(7), want[4], atol=1e-4 * scale)


def test_the_door_refuses_what_the_format_does_not_take(decoder, tmp_path):
    assert "litert_lm" in EXPORT_FORMATS
    with pytest.raises(TypeError, match="format='litert_lm' takes no option 'fold'"):
        export(decoder, tmp_path / "a.tflite", format="litert_lm", fold=False)
    with pytest.raises(ValueError, match="max_sequence_length="):
        export(decoder, tmp_path / "a.tflite", format="litert_lm")
    with pytest.raises(ValueError, match=r"'\.litertlm' or '\.tflite'"):
        export(decoder, tmp_path / "a.keras", format="litert_lm", max_sequence_length=8)
    with pytest.raises(ValueError, match="quantize"):
        export(
            decoder,
            tmp_path / "a.tflite",
            format="litert_lm",
            max_sequence_length=8,
            quantize="int8",
        )
    assert not list(tmp_path.iterdir())


def test_the_command_lines_quantize_modes_are_the_formats():
    assert arguments.GENERATIVE_QUANTIZE_MODES == tuple(
        m for m in LITERT_LM_QUANTIZE_MODES if m is not None
    )


def test_kerasnorm_export_format_litert_lm(decoder, tmp_path, capsys):
    model = tmp_path / "lm.keras"
    decoder.save(model)
    out = tmp_path / "out"
    argv = ["export", str(model), "--out", str(out), "--format", "litert_lm"]
    code = main([*argv, "--max-sequence-length", "8", "--prefill-lengths", "4"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert os.listdir(out) == ["lm.tflite"]
    assert "lm.tflite: signatures prefill, decode" in text
    assert "XNNPACK, decode:" in text
    row = next(line for line in text.splitlines() if line.startswith("lm.tflite "))
    assert "greedy tokens equal" in row and "2 prompts invented" in row
    assert row.rstrip().endswith("ok")
    # The file generates as the saved model's full forward pass.
    generator = litert.Generator((out / "lm.tflite").read_bytes())
    prompt = [3, 5, 9]
    generated = generator.generate(prompt, 3)
    sequence = list(prompt)
    for _ in range(3):
        logits = np.asarray(decoder(np.asarray([sequence], np.int32)))[0, -1]
        sequence.append(int(np.argmax(logits)))
    assert generated == sequence[3:]

    # Refusals before any work: each names the flag.
    for extra, message in (
        ([], "needs --max-sequence-length"),
        (["--max-sequence-length", "8", "--quantize", "int8"], "--quantize int8"),
        (["--max-sequence-length", "8", "--tflite"], "alone"),
        (["--max-sequence-length", "8", "--streaming"], "--streaming does not"),
    ):
        assert main([*argv, "--force", *extra]) == EXIT_USAGE
        assert message in capsys.readouterr().err
    tflite = ["export", str(model), "--out", str(out), "--tflite"]
    assert main([*tflite, "--max-sequence-length", "8"]) == EXIT_USAGE
    assert "applies to --format litert_lm only" in capsys.readouterr().err
