"""Smoothing a decoder before its quantized generative file is written
(`to_litert_lm`'s `smooth`).

- the smoothed keras-hub Llama computes what it computed (every norm read
  by linear products, and the gated feed-forward's down product, rescaled),
  its weights put back exactly afterwards;
- on a Llama whose norms and feed-forward carry an injected outlier channel
  (the same function, moved into a few channels as trained LLMs carry
  them), the `"dynamic"` file written smoothed errs less against the Keras
  model than the one written with `smooth=False`;
- the head: the final norm smoothed into the token table (tied: the
  lookup divided back) computes what it computed, and a weight-only int8
  file of a model whose table carries outlier channels errs less with it;
- bad values are refused by name.
"""

import os

import keras
import numpy as np
import pytest

from kerasnorm.export import to_litert_lm
from kerasnorm.export.fold import smooth as smoothing
from kerasnorm.export.litert_lm.check import reference_logits

pytestmark = pytest.mark.tf_only

CONTEXT = 32


def _llama(outlier=None, tied=False):
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=256,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=64,
        intermediate_dim=128,
        tie_word_embeddings=tied,
    )
    model = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    if outlier is not None:
        for block in backbone.transformer_layers:
            _inject(block, outlier)
    return model


def _inject(block, factor, channel=3):
    """The norms' channel `channel` and the up product's output channel
    `channel` made `factor` times larger, their readers' rows `factor`
    times smaller: the same function, with an outlier channel."""
    attention = block._self_attention_layer
    for norm, readers in (
        (
            block._self_attention_layernorm,
            (attention._query_dense, attention._key_dense, attention._value_dense),
        ),
        (
            block._feedforward_layernorm,
            (block._feedforward_gate_dense, block._feedforward_intermediate_dense),
        ),
    ):
        gain = norm.scale.numpy()
        gain[channel] *= factor
        norm.scale.assign(gain)
        for reader in readers:
            kernel = reader.kernel.numpy()
            kernel[channel] /= factor
            reader.kernel.assign(kernel)
    up, down = block._feedforward_intermediate_dense, block._feedforward_output_dense
    kernel = up.kernel.numpy()
    kernel[:, channel] *= factor
    up.kernel.assign(kernel)
    kernel = down.kernel.numpy()
    kernel[channel] /= factor
    down.kernel.assign(kernel)


def _ids(seed=0, length=24):
    return np.random.default_rng(seed).integers(1, 256, (1, length)).astype(np.int32)


def test_smoothing_keeps_the_function_and_puts_the_weights_back():
    model = _llama(outlier=40.0)
    data = {"token_ids": _ids(), "padding_mask": np.ones((1, 24), bool)}
    before = np.asarray(model(data))
    weights = [w.numpy().copy() for w in model.weights]
    done, restore = smoothing.smooth(
        model, data, activations=smoothing.PER_ROW, gated=True
    )
    # Two norms and one gated feed-forward per block, each found.
    sites = {s.norm for s in done}
    assert len(smoothing.smoothing_sites(model)) == 4
    assert len(smoothing.gated_sites(model)) == 2
    assert any("intermediate" in s for s in sites), sites
    assert all(s.spread_after < s.spread_before for s in done)
    after = np.asarray(model(data))
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()
    restore()
    for w, value in zip(model.weights, weights, strict=True):
        np.testing.assert_array_equal(w.numpy(), value)


def _written(model, path, smooth, quantize="dynamic"):
    prompts = [_ids(seed, 8)[0].tolist() for seed in (1, 2, 3)]
    return to_litert_lm(
        model,
        path,
        max_sequence_length=CONTEXT,
        prefill_lengths=(8,),
        quantize=quantize,
        verify_inputs=prompts,
        smooth=smooth,
        min_agreement=0.01,
    )


def _file_errors(model, results):
    """Each written file's rms error against the Keras model's full forward
    pass, decoding ids the check did not see."""
    from kerasnorm.export import litert

    ids = _ids(9, 20)[0].tolist()
    ref = reference_logits(model, ids)
    errors = []
    for result in results:
        generator = litert.Generator(open(result.path, "rb").read())
        rows = [generator.prefill(ids[:1])[-1]]
        rows += [generator.decode(t) for t in ids[1:-1]]
        errors.append(np.sqrt(np.mean((np.stack(rows) - ref[:-1]) ** 2)))
    return errors


def test_a_smoothed_dynamic_file_errs_less_on_an_outlier_channel(tmp_path):
    model = _llama(outlier=100.0)
    weights = [w.numpy().copy() for w in model.weights]
    plain = _written(model, tmp_path / "plain.tflite", smooth=False)
    smoothed = _written(model, tmp_path / "smoothed.tflite", smooth=True)
    assert plain.smoothing == "off" and not plain.smoothed
    assert "sites smoothed" in smoothed.smoothing
    blocks = [s for s in smoothed.smoothed if s.readers != ("token_embedding",)]
    assert len(blocks) == 6
    # The model is as it was (the export put its weights back).
    for w, value in zip(model.weights, weights, strict=True):
        np.testing.assert_array_equal(w.numpy(), value)
    # Both files against the Keras model: the smoothed one errs less.
    errors = _file_errors(model, (plain, smoothed))
    # (measured: 1.56e-3 -> 1.10e-3; on the check's prompts 0.027 -> 0.015)
    assert errors[1] < 0.85 * errors[0], errors
    assert smoothed.check.rms_error < 0.7 * plain.check.rms_error


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "dynamic", "smooth": 1.5}, "smooth=1.5"),
        ({"quantize": "dynamic", "smooth": "yes"}, "smooth='yes'"),
        ({"quantize": "float16", "smooth": True}, "nothing with quantize='float16'"),
        ({"smooth": 0.5}, "nothing with quantize=None"),
    ],
)
def test_bad_smooth_is_refused_by_name(tmp_path, options, message):
    model = _llama()
    with pytest.raises(ValueError, match=message):
        to_litert_lm(model, tmp_path / "a.tflite", max_sequence_length=8, **options)
    assert not os.listdir(tmp_path)


def _table_outliers(model, channels=(3, 17), factor=30.0):
    """The head's channels `channels` `factor` times larger, as a trained
    model's table carries a few (Gemma 3 270M's largest is 5x the
    median), the final norm's gain there `factor` times smaller: the head
    computes what it did from the same hidden state. A tied table's lookup
    carries them too."""
    embedding = model.backbone.token_embedding
    if embedding.tie_weights:
        table, axis = embedding.embeddings, 1
    else:
        table, axis = embedding.reverse_embeddings, 0
    value = table.numpy()
    index = [slice(None)] * 2
    index[axis] = list(channels)
    value[tuple(index)] *= factor
    table.assign(value)
    gain = model.backbone.layer_norm.scale
    value = gain.numpy()
    value[list(channels)] /= factor
    gain.assign(value)


@pytest.mark.parametrize("tied", [True, False])
def test_the_head_smoothed_keeps_the_function_and_puts_everything_back(
    tied, monkeypatch
):
    from kerasnorm.export.fold import smooth_head

    # The table read and scaled in blocks that do not divide it.
    monkeypatch.setattr(smooth_head, "BLOCK", 100)
    model = _llama(tied=tied)
    _table_outliers(model)
    data = {"token_ids": _ids(), "padding_mask": np.ones((1, 24), bool)}
    before = np.asarray(model(data))
    weights = [w.numpy().copy() for w in model.weights]
    embedding = model.backbone.token_embedding
    table = embedding.embeddings if tied else embedding.reverse_embeddings
    axis = 0 if tied else 1  # the table's vocabulary axis

    def spread():
        top = np.abs(table.numpy()).max(axis=axis)
        return top.max() / np.median(top)

    spread_before = spread()
    done, restore = smooth_head.smooth_head(model, data, smoothing.FLOAT)
    assert done is not None and done.readers == ("token_embedding",)
    assert spread() < spread_before / 2
    after = np.asarray(model(data))
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()
    # The lookup alone (a tied table's rows divided back): the embedding
    # of every token as before.
    ids = np.arange(256)[None]
    looked_up = np.asarray(embedding(ids))[0]
    np.testing.assert_allclose(
        looked_up, _table_before(model, weights, embedding), 1e-6, 1e-6
    )
    restore()
    assert "call" not in embedding.__dict__
    for w, value in zip(model.weights, weights, strict=True):
        np.testing.assert_array_equal(w.numpy(), value)


def test_the_self_check_difference_in_chunks_is_the_whole_one(monkeypatch):
    from kerasnorm.export.fold import self_check

    monkeypatch.setattr(self_check, "CHUNK", 1000)
    rng = np.random.default_rng(3)
    expected = rng.normal(size=(7, 1234)).astype(np.float32)
    got = expected + rng.normal(scale=1e-3, size=expected.shape).astype(np.float32)
    got[6, 1233] += 0.5  # the largest difference in the last, partial chunk
    e, g = expected.astype(np.float64), got.astype(np.float64)
    assert self_check.relative_difference(expected, got) == (
        np.abs(e - g).max() / np.abs(e).max()
    )
    with pytest.raises(ValueError, match="shapes differ"):
        self_check.relative_difference(expected, got[:, :-1])


def _table_before(model, weights, embedding):
    """The token table as it was before smoothing."""
    (index,) = [i for i, w in enumerate(model.weights) if w is embedding.embeddings]
    return weights[index]


def test_a_weight_only_file_with_the_head_smoothed_errs_less(tmp_path):
    model = _llama(tied=True)
    _table_outliers(model)
    plain, smoothed = (
        _written(model, tmp_path / f"{s}.tflite", s, "weight_only_int8")
        for s in (False, None)
    )
    assert plain.smoothing == "off" and not plain.smoothed
    assert [s.readers for s in smoothed.smoothed] == [("token_embedding",)]
    assert "the head smoothed" in smoothed.smoothing
    errors = _file_errors(model, (plain, smoothed))
    # (measured: 3.26e-3 -> 5.5e-4 rms)
    assert errors[1] < 0.5 * errors[0], errors


def test_dynamic_and_int4_smooth_their_blocks_by_default_weight_only_does_not(
    tmp_path,
):
    """The table of modes' `smooth`: `"dynamic"` and `"int4"` smooth their
    blocks unless told not to; `"weight_only_int8"` only its head."""
    model = _llama(outlier=100.0)
    for quantize in ("dynamic", "int4"):
        result = _written(model, tmp_path / f"{quantize}.tflite", None, quantize)
        assert "sites smoothed" in result.smoothing, quantize
        blocks = [s for s in result.smoothed if s.readers != ("token_embedding",)]
        assert len(blocks) == 6
    weight_only = _written(model, tmp_path / "w.tflite", None, "weight_only_int8")
    assert "not the default of quantize='weight_only_int8'" in weight_only.smoothing
    assert all(s.readers == ("token_embedding",) for s in weight_only.smoothed)
