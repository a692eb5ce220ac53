"""keras-hub's BERT, GPT-2, RoBERTa and ViT backbones through the export
pipeline: `fold_batchnorm`, `to_saved_model` and `to_tflite`.

The backbones are built from their classes with tiny configurations and
random weights: no preset, nothing is downloaded. The text backbones take a
dict of inputs (`token_ids`, `padding_mask`, and BERT's `segment_ids`), as
keras-hub writes them; the checks feed that dict, in the model's own
structure. The artifacts' signatures are named by those keys (the
naming rule) and compute what the backbone computes, fed by name.

A text backbone's sequence length is undefined (`(None, None)` inputs).
The raw backbones export with it dynamic (`shape_signature` -1, as Keras'
own exporter writes them) and are verified at two lengths; the fixed-length
tests export the backbone inside a model with fixed-length Inputs of the
same names, as a user wanting the fixed-shape file would.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasnorm.export import fold_batchnorm
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.litert.runner import interpreter as litert_interpreter

keras_hub = pytest.importorskip("keras_hub")

# SavedModel and TFLite: TensorFlow programs.
pytestmark = pytest.mark.tf_only

VOCABULARY = 100
LENGTH = 8
BATCH = 3
TEXT = {
    "num_layers": 2,
    "num_heads": 2,
    "hidden_dim": 16,
    "intermediate_dim": 32,
    "max_sequence_length": LENGTH,
    "vocabulary_size": VOCABULARY,
}
IMAGE = (32, 32, 3)
# max |artifact - keras| / max |keras| of the independent by-name check:
# float32 graphs, two of them (the SavedModel or TFLite kernels, Keras').
TOLERANCE = 1e-4


def bert():
    keras.utils.set_random_seed(0)
    return keras_hub.models.BertBackbone(**TEXT)


def gpt2():
    keras.utils.set_random_seed(1)
    return keras_hub.models.GPT2Backbone(**TEXT)


def vit():
    keras.utils.set_random_seed(2)
    return keras_hub.models.ViTBackbone(
        image_shape=IMAGE,
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
    )


def roberta():
    keras.utils.set_random_seed(3)
    return keras_hub.models.RobertaBackbone(**TEXT)


BACKBONES = {"bert": bert, "gpt2": gpt2, "vit": vit}
TEXT_BACKBONES = {"bert": bert, "gpt2": gpt2, "roberta": roberta}


def inputs_for(model, seed=0, length=LENGTH, batch=BATCH):
    """A batch in the model's own input structure: token ids below the
    vocabulary, segment ids 0/1, padding masks with padded tails, images."""
    rng = np.random.default_rng(seed)
    if not isinstance(model.input, dict):
        return rng.standard_normal((batch, *IMAGE)).astype("float32")
    lengths = rng.integers(length // 2, length + 1, batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype("int32")
    data = {
        "token_ids": rng.integers(1, VOCABULARY, (batch, length)) * mask,
        "padding_mask": mask,
        "segment_ids": (np.arange(length)[None] >= lengths[:, None] // 2) * mask,
    }
    return {k: np.asarray(data[k], "int32") for k in model.input}


def fixed_length(model):
    """`model` inside a model whose Inputs have the same names and a fixed
    sequence length: what a TFLite file needs."""
    if not isinstance(model.input, dict):
        return model
    inputs = {
        k: keras.Input((LENGTH,), dtype=x.dtype, name=k) for k, x in model.input.items()
    }
    return keras.Model(inputs, model(inputs), name=f"{model.name}_fixed")


def expected_names(model):
    """`(inputs, outputs)`, sorted: the dict keys (the Input names), and the
    output dict's keys or the output layers' names."""
    inputs = list(model.input) if isinstance(model.input, dict) else [model.input.name]
    if isinstance(model.output, dict):
        outputs = list(model.output)
    else:
        outputs = list(model.output_names)
    return sorted(inputs), sorted(outputs)


def keras_outputs(model, x):
    """The backbone's outputs, in sorted output-name order."""
    y = model(x, training=False)
    if isinstance(y, dict):
        return [np.asarray(y[k]) for k in sorted(y)]
    return [np.asarray(t) for t in keras.tree.flatten(y)]


def by_name(x):
    return dict(x) if isinstance(x, dict) else {"images": x}


def assert_close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        error = np.max(np.abs(a - b)) / np.max(np.abs(b))
        assert error <= TOLERANCE, error


def shapes(x):
    return sorted(tuple(np.shape(a)) for a in keras.tree.flatten(x))


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_fold_batchnorm_runs_the_check_on_the_given_dict(name):
    model = BACKBONES[name]()
    x = inputs_for(model)
    folded, report = fold_batchnorm(model, return_report=True, verify_inputs=x)
    # No BatchNorm in these architectures: nothing folded, nothing changed.
    assert report.folded == [] and report.kept == []
    assert shapes(x) == sorted(report.check_shapes)
    assert report.check_error is not None and report.check_error <= 1e-5
    assert_close(keras_outputs(folded, x), keras_outputs(model, x))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_to_saved_model(name, tmp_path):
    model = BACKBONES[name]()
    x = inputs_for(model)
    result = to_saved_model(model, tmp_path / "served", verify_inputs=x)
    assert result.verification.samples == BATCH
    assert shapes(x) == sorted(result.fold_report.check_shapes)

    function = tf.saved_model.load(result.path).signatures["serving_default"]
    names = (
        sorted(function.structured_input_signature[1]),
        sorted(function.structured_outputs),
    )
    assert names == expected_names(model)
    # Fed by name: the keys reach the inputs they name.
    y = function(**{k: tf.constant(v) for k, v in by_name(x).items()})
    assert_close([np.asarray(y[k]) for k in sorted(y)], keras_outputs(model, x))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_to_tflite(name, tmp_path):
    model = fixed_length(BACKBONES[name]())
    x = inputs_for(model)
    path = tmp_path / f"{name}.tflite"
    result = to_tflite(model, path, verify_inputs=x)
    assert result.verification.samples == BATCH
    assert shapes(x) == sorted(result.fold_report.check_shapes)

    content = path.read_bytes()
    assert not any(op.startswith("Flex") for op in litert.op_names(content))
    runner = litert_interpreter(content).get_signature_runner(litert.SIGNATURE_KEY)
    names = (sorted(runner.get_input_details()), sorted(runner.get_output_details()))
    assert names == expected_names(model)
    feed = by_name(x)
    rows = [runner(**{k: v[i : i + 1] for k, v in feed.items()}) for i in range(BATCH)]
    got = [np.concatenate([r[k] for r in rows]) for k in sorted(rows[0])]
    assert_close(got, keras_outputs(model, x))


def _two_lengths(verification):
    """The sequence lengths the check ran at, one per call shape."""
    return [{shape[1] for shape in call} for call in verification.shapes]


RAW_TFLITE = [
    pytest.param(name, quantize, marks=[] if fast else pytest.mark.slow)
    for name in sorted(TEXT_BACKBONES)
    for quantize, fast in ((None, name == "bert"), ("dynamic", False))
]


@pytest.mark.parametrize("name, quantize", RAW_TFLITE)
def test_raw_text_backbone_to_tflite_is_dynamic(name, quantize, tmp_path):
    """The backbone as keras-hub builds it, no fixed-length wrapper: the
    file keeps batch and length dynamic, the check ran it at the
    inputs' length and a second one, and at a third length and batch it
    computes what the backbone computes, fed by name."""
    model = TEXT_BACKBONES[name]()
    path = tmp_path / f"{name}.tflite"
    result = to_tflite(model, path, quantize=quantize, verify_inputs=inputs_for(model))
    assert result.verification.passed
    assert _two_lengths(result.verification) == [{LENGTH}, {LENGTH // 2}]

    content = path.read_bytes()
    assert not any(op.startswith("Flex") for op in litert.op_names(content))
    runner = litert.Runner(content, model)
    assert set(runner.input_shapes.values()) == {(None, None)}
    x = inputs_for(model, seed=5, length=LENGTH - 3, batch=2)
    got = runner.named(by_name(x))
    want = keras_outputs(model, x)
    if quantize is None:
        assert_close([got[k] for k in sorted(got)], want)
    else:  # int8 weights: the rms criterion of "dynamic"
        for a, b in zip([got[k] for k in sorted(got)], want, strict=True):
            assert np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)) < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TEXT_BACKBONES))
def test_raw_text_backbone_to_saved_model_is_dynamic(name, tmp_path):
    model = TEXT_BACKBONES[name]()
    result = to_saved_model(model, tmp_path / "served", verify_inputs=inputs_for(model))
    assert result.verification.passed
    assert _two_lengths(result.verification) == [{LENGTH}, {LENGTH // 2}]
    function = tf.saved_model.load(result.path).signatures["serving_default"]
    specs = function.structured_input_signature[1]
    assert {tuple(s.shape.as_list()) for s in specs.values()} == {(None, None)}
    x = inputs_for(model, seed=6, length=LENGTH - 1, batch=2)
    y = function(**{k: tf.constant(v) for k, v in by_name(x).items()})
    assert_close([np.asarray(y[k]) for k in sorted(y)], keras_outputs(model, x))


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_input_signature_fixes_the_length(name, tmp_path):
    """`input_signature` by input name fixes the length (the fast file of
    a fixed-shape model); the batch stays dynamic."""
    model = TEXT_BACKBONES[name]()
    signature = {k: (None, LENGTH) for k in model.input}
    path = tmp_path / "fixed.tflite"
    result = to_tflite(
        model, path, input_signature=signature, verify_inputs=inputs_for(model)
    )
    assert result.verification.passed
    runner = litert.Runner(path.read_bytes(), model)
    assert set(runner.input_shapes.values()) == {(None, LENGTH)}
    # The batch is checked at two sizes, the length at the fixed one only.
    assert _two_lengths(result.verification) == [{LENGTH}, {LENGTH}]
    assert [call[0][0] for call in result.verification.shapes] == [BATCH, 1]
    with pytest.raises(ValueError, match=r"shape \(None, 8\)"):
        runner.named(by_name(inputs_for(model, length=LENGTH - 1)))
