"""The generative export (`to_litert_lm`) and the decoder block's cached call.

The reference is always the model's own full forward pass without a cache:
cached logits at position p equal the full pass's row p.
"""

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import ExportVerificationError
from kerasnorm.export import litert
from kerasnorm.export import to_litert_lm
from tests.export import lm_models
from tests.support.once import once

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def trained():
    """A Pre-LN RMSNorm rotary decoder trained on the rule (once per test
    process)."""
    return once("litert_lm.trained", _trained)


def _trained():
    keras.utils.set_random_seed(0)
    return lm_models.train(lm_models.kerasnorm_decoder(), steps=200)


@pytest.mark.parametrize("norm_position", ["pre", "post", "deepnorm"])
@pytest.mark.parametrize("rope", [None, 10000.0])
def test_block_cached_call_equals_full_call(norm_position, rope):
    block = kerasnorm.TransformerDecoderBlock(
        num_heads=2,
        key_dim=8,
        intermediate_dim=32,
        norm_position=norm_position,
        norm_type="rms",
        num_layers=2,
        rope_max_wavelength=rope,
    )
    x = np.random.default_rng(0).normal(size=(2, 7, 16)).astype("float32")
    full = np.asarray(block(x))
    cache = np.zeros((2, 2, 9, 2, 8), "float32")
    y, cache = block(
        x[:, :4], self_attention_cache=cache, self_attention_cache_update_index=0
    )
    rows = [np.asarray(y)]
    for t in range(4, 7):
        y, cache = block(
            x[:, t : t + 1],
            self_attention_cache=cache,
            self_attention_cache_update_index=t,
        )
        rows.append(np.asarray(y))
    np.testing.assert_allclose(np.concatenate(rows, 1), full, atol=2e-5)
    # Rows past the sequence were never written.
    assert not np.asarray(cache)[:, :, 7:].any()


def test_rotary_positions_change_the_output_and_round_trip_config():
    x = np.random.default_rng(1).normal(size=(1, 5, 16)).astype("float32")
    plain = kerasnorm.TransformerDecoderBlock(2, 8, 32, norm_type="rms")
    rotary = kerasnorm.TransformerDecoderBlock(
        2, 8, 32, norm_type="rms", rope_max_wavelength=10000.0
    )
    plain.build(x.shape)
    rotary.build(x.shape)
    rotary.set_weights(plain.get_weights())
    out_plain, out_rotary = np.asarray(plain(x)), np.asarray(rotary(x))
    # Position 0 is not rotated: the first row attends to itself alone.
    np.testing.assert_allclose(out_rotary[:, 0], out_plain[:, 0], atol=1e-5)
    assert np.abs(out_rotary[:, 1:] - out_plain[:, 1:]).max() > 1e-3
    again = kerasnorm.TransformerDecoderBlock.from_config(rotary.get_config())
    assert again.rope_max_wavelength == 10000.0
    with pytest.raises(ValueError, match="rope_max_wavelength"):
        kerasnorm.TransformerDecoderBlock(2, 8, 32, rope_max_wavelength=-1.0)


@pytest.mark.slow
def test_float32_file_generates_as_the_full_forward_pass(trained, tmp_path):
    prompts = lm_models.rule_sequences(2, seed=7)[:, :5]
    path = tmp_path / "lm.tflite"
    result = to_litert_lm(
        trained,
        path,
        max_sequence_length=24,
        prefill_lengths=(4, 8),
        verify_inputs=prompts,
    )
    assert set(result.signatures) == {"prefill_4", "prefill_8", "decode"}
    assert result.check.max_error <= 1e-4
    assert result.check.agreement == 1.0
    assert not result.check.invented_prompts
    assert result.cache_shape == (1, 2, 24, 16)
    assert not any(op.startswith("Flex") for op in result.op_counts)
    # The file's own greedy continuation, from Python, against Keras'.
    generator = litert.Generator(path.read_bytes())
    prompt = prompts[0].tolist()
    got = generator.generate(prompt, 10)
    sequence = list(prompt)
    for _ in range(10):
        sequence.append(int(np.argmax(trained(np.array([sequence]))[0, -1])))
    assert got == sequence[len(prompt) :]
    # The model learnt the rule: its continuation follows it.
    rule = lm_models.rule_sequences(2, seed=7)[0, 5:15].tolist()
    assert np.mean(np.array(got) == np.array(rule)) >= 0.8


@pytest.mark.slow
def test_engine_style_padding_with_zero_positions(trained, tmp_path):
    """LiteRT-LM pads a short prompt's tokens and positions with 0: the
    rows still land past the prompt and stay hidden."""
    path = tmp_path / "lm.tflite"
    to_litert_lm(trained, path, max_sequence_length=16, prefill_lengths=(8,))
    runner = litert.Generator(path.read_bytes())
    prompt = lm_models.rule_sequences(1, seed=3)[0, :5]
    interp = runner._runners
    caches = {n: np.zeros(s, np.float32) for n, s in runner._cache_shapes.items()}
    tokens = np.zeros((1, 8), np.int32)
    tokens[0, :4] = prompt[:4]
    positions = np.zeros(8, np.int32)
    positions[:4] = np.arange(4)
    out = interp["prefill"](tokens=tokens, input_pos=positions, **caches)
    caches = {n: out[n] for n in runner.cache_names}
    out = interp["decode"](
        tokens=prompt[None, 4:5].astype(np.int32),
        input_pos=np.array([4], np.int32),
        **caches,
    )
    want = np.asarray(trained(prompt[None]))[0, -1]
    np.testing.assert_allclose(
        out["logits"][0, 0], want, atol=1e-4 * np.abs(want).max()
    )


@pytest.mark.parametrize("position", [0, 3, 5])
def test_a_decode_step_attends_as_over_the_written_cache(position):
    """A decode step's attention (the caches as they came, the new row
    apart) against numpy's softmax attention over the caches with the row
    written, and its caches against that write (`update_cache`)."""
    from kerasnorm._core import attention

    rng = np.random.default_rng(position)
    b, g, r, length, d = 1, 2, 3, 6, 4
    keys = rng.standard_normal((b, g, length, d)).astype("float32")
    values = rng.standard_normal((b, g, length, d)).astype("float32")
    query = rng.standard_normal((b, 1, g * r, d)).astype("float32")
    key = rng.standard_normal((b, 1, g, d)).astype("float32")
    value = rng.standard_normal((b, 1, g, d)).astype("float32")
    positions = np.asarray([position], "int32")
    out, key_cache, value_cache = attention.cached_attention(
        query, key, value, keys, values, positions, 0.5
    )
    written_k, written_v = keys.copy(), values.copy()
    written_k[:, :, position] = key[:, 0]
    written_v[:, :, position] = value[:, 0]
    np.testing.assert_array_equal(np.asarray(key_cache), written_k)
    np.testing.assert_array_equal(np.asarray(value_cache), written_v)
    want = np.zeros((g * r, d))
    for head in range(g * r):
        k = written_k[0, head // r, : position + 1].astype("float64")
        v = written_v[0, head // r, : position + 1].astype("float64")
        scores = 0.5 * k @ query[0, 0, head].astype("float64")
        w = np.exp(scores - scores.max())
        want[head] = (w / w.sum()) @ v
    np.testing.assert_allclose(np.asarray(out)[0, 0], want, rtol=1e-5, atol=1e-6)


def test_generator_refuses_a_sequence_past_the_context(tmp_path):
    """An untrained decoder: the default tier's one export (float32, checked)."""
    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(layers=1, width=16)
    path = tmp_path / "lm.tflite"
    to_litert_lm(model, path, max_sequence_length=8, prefill_lengths=(4,))
    generator = litert.Generator(path.read_bytes())
    with pytest.raises(ValueError, match="max_sequence_length=8"):
        generator.generate([1, 2, 3, 4, 5, 6], 5)
    # Sampling: top_k=1 is greedy.
    assert generator.generate([1, 2, 3], 4, top_k=1, seed=0) == generator.generate(
        [1, 2, 3], 4
    )


def test_bad_inputs(tmp_path):
    trained = lm_models.kerasnorm_decoder(layers=1, width=16)
    with pytest.raises(ValueError, match="verify_inputs prompt has 30 tokens"):
        to_litert_lm(
            trained,
            tmp_path / "a.tflite",
            max_sequence_length=16,
            verify_inputs=[list(range(1, 31))],
        )
    with pytest.raises(ValueError, match="tokenizer="):
        to_litert_lm(trained, tmp_path / "a.litertlm", max_sequence_length=16)
    with pytest.raises(ValueError, match="quantize"):
        to_litert_lm(
            trained, tmp_path / "a.tflite", max_sequence_length=16, quantize="int8"
        )
    with pytest.raises(ValueError, match="prefill_lengths"):
        to_litert_lm(
            trained,
            tmp_path / "a.tflite",
            max_sequence_length=16,
            prefill_lengths=(32,),
        )
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 16)(tokens)
    x = kerasnorm.TransformerEncoderBlock(2, 8, 32)(x)
    encoder = keras.Model(tokens, keras.layers.Dense(10)(x), name="encoder_lm")
    with pytest.raises(ValueError, match="not a causal decoder"):
        to_litert_lm(encoder, tmp_path / "a.tflite", max_sequence_length=16)
    x = keras.layers.Embedding(10, 16)(tokens)
    x = keras.layers.Conv1D(16, 3, padding="causal", name="mixer")(x)
    x = kerasnorm.TransformerDecoderBlock(2, 8, 32)(x)
    conv = keras.Model(tokens, keras.layers.Dense(10)(x))
    with pytest.raises(ValueError, match=r"'mixer' .* has no cached path"):
        to_litert_lm(conv, tmp_path / "a.tflite", max_sequence_length=16)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_file_that_differs_is_not_written(trained, tmp_path, monkeypatch):
    from kerasnorm.export.litert_lm import check

    monkeypatch.setattr(check, "FLOAT32_TOLERANCE", 1e-12)
    with pytest.raises(ExportVerificationError, match="Nothing was written"):
        to_litert_lm(trained, tmp_path / "a.tflite", max_sequence_length=16)
    assert not list(tmp_path.iterdir())
