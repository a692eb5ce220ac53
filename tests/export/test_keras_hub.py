"""keras-hub's BERT, GPT-2 and ViT backbones through the export pipeline:
`fold_batchnorm`, `to_saved_model` and `to_tflite`.

The backbones are built from their classes with tiny configurations and
random weights: no preset, nothing is downloaded. The text backbones take a
dict of inputs (`token_ids`, `padding_mask`, and BERT's `segment_ids`), as
keras-hub writes them; the checks feed that dict, in the model's own
structure. The artifacts' signatures are named by those keys (the
naming rule) and compute what the backbone computes, fed by name.

A text backbone's sequence length is undefined (`(None, None)` inputs);
a TFLite file needs it fixed, so the `.tflite` tests export the backbone
inside a model with fixed-length Inputs of the same names, as a user
would.
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


BACKBONES = {"bert": bert, "gpt2": gpt2, "vit": vit}


def inputs_for(model, seed=0):
    """A batch in the model's own input structure: token ids below the
    vocabulary, segment ids 0/1, padding masks with padded tails, images."""
    rng = np.random.default_rng(seed)
    if not isinstance(model.input, dict):
        return rng.standard_normal((BATCH, *IMAGE)).astype("float32")
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, BATCH)
    mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype("int32")
    data = {
        "token_ids": rng.integers(1, VOCABULARY, (BATCH, LENGTH)) * mask,
        "padding_mask": mask,
        "segment_ids": (np.arange(LENGTH)[None] >= lengths[:, None] // 2) * mask,
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


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_to_tflite_refuses_an_undefined_sequence_length(name, tmp_path):
    """The backbone itself: its `(None, None)` inputs have no length to fix
    the file's tensors to; the refusal names the dimension, before any file."""
    model = BACKBONES[name]()
    with pytest.raises(ValueError, match="undefined dimension"):
        to_tflite(model, tmp_path / "model.tflite", verify_inputs=inputs_for(model))
    assert list(tmp_path.iterdir()) == []
