"""Models fine-tuned with LoRA, and models held in bfloat16, exported.

LoRA: the file is written with the adapters merged into the kernels and
verified against the LoRA model's own output; the reference for the merge is
a plain model (no LoRA) given `kernel + alpha / rank * a @ b`, computed here
in numpy, whose output and file size the LoRA model's must match. The
user's model is left as it was.

bfloat16: the file is written from the float32 copy of the same weights and
checked against both: within float32 rounding of the copy, and the half
precision model's own greedy choice on at least 90 % of the steps.
"""

import keras
import numpy as np
import pytest

from kerasnorm._compat import sublayers
from kerasnorm._compat.keras_lora import lora_variables
from kerasnorm.export import to_litert_lm
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from tests.export import lm_models

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only
PROMPTS = lm_models.rule_sequences(2, seed=7)[:, :5]


def _lora_layers(model):
    return [
        layer
        for layer in sublayers(model, recursive=True)
        if getattr(layer, "lora_enabled", False)
    ]


def _state(model):
    return [np.array(w.numpy()) for w in model.weights], [
        layer.lora_enabled for layer in _lora_layers(model)
    ]


def _without_lora(config):
    if isinstance(config, list):
        return [_without_lora(c) for c in config]
    if not isinstance(config, dict):
        return config
    return {
        k: _without_lora(v)
        for k, v in config.items()
        if k not in ("lora_rank", "lora_alpha")
    }


def _plain_twin(model):
    """`model` rebuilt from its config without LoRA (the same layer names,
    so the same weight paths), given `model`'s weights, each adapted kernel
    merged by the equation."""
    config = keras.saving.serialize_keras_object(model)
    plain = keras.saving.deserialize_keras_object(_without_lora(config))
    merged = {}
    for layer in _lora_layers(model):
        scale = layer.lora_alpha / layer.lora_rank
        a, b = layer.lora_kernel_a.numpy(), layer.lora_kernel_b.numpy()
        assert np.abs(b).max() > 0, "the adapters were trained"
        kernel = lora_variables(layer)[0]
        merged[kernel.path] = kernel.numpy() + scale * (a @ b)
    sources = {w.path: w for w in model.weights}
    for weight in plain.weights:
        weight.assign(merged.get(weight.path, sources[weight.path].numpy()))
    return plain


def _lora_causal_lm(family, steps=40):
    keras.utils.set_random_seed(0)
    model = lm_models.causal_lm(family, num_layers=2)
    model.backbone.enable_lora(4)
    return lm_models.train_causal_lm(model, steps=steps)


def _check_lora_file(family, tmp_path):
    model = _lora_causal_lm(family)
    before = _state(model)
    result = to_litert_lm(
        model,
        tmp_path / "lora.tflite",
        max_sequence_length=24,
        prefill_lengths=(8,),
        verify_inputs=PROMPTS,
    )
    # Verified against the LoRA model itself, left as it was.
    assert result.check.max_error <= 1e-4 and result.check.agreement == 1.0
    assert len(result.merged_lora) == len(_lora_layers(model)) > 0
    after = _state(model)
    assert after[1] == before[1]
    assert all(np.array_equal(x, y) for x, y in zip(before[0], after[0], strict=True))
    # The merge is the equation: the plain twin computes the LoRA model's
    # output, and its file is as big.
    plain = _plain_twin(model)
    x = {"token_ids": PROMPTS, "padding_mask": np.ones_like(PROMPTS, bool)}
    np.testing.assert_allclose(
        np.asarray(plain(x)), np.asarray(model(x)), rtol=1e-5, atol=1e-5
    )
    twin = to_litert_lm(
        plain, tmp_path / "plain.tflite", max_sequence_length=24, prefill_lengths=(8,)
    )
    # The merged adapters leave the plain twin's graph and size. (A plain
    # model fresh from its initializer is no twin: keras-hub's Llama draws
    # the key and value kernels from one seeded initializer, the converter
    # writes the two equal products once, and its file has a
    # FULLY_CONNECTED per layer fewer; training the adapters of the value
    # projection makes them differ, with or without LoRA.)
    assert result.op_counts == twin.op_counts
    assert abs(result.size_bytes / twin.size_bytes - 1) <= 0.01
    assert result.delegation.partitions == twin.delegation.partitions == 1


def test_lora_llama_exports_merged(tmp_path):
    _check_lora_file("llama", tmp_path)


@pytest.mark.slow
def test_lora_gemma_exports_merged(tmp_path):
    _check_lora_file("gemma", tmp_path)


def _lora_functional(steps=64):
    keras.utils.set_random_seed(0)
    model = lm_models.attention_decoder(layers=1)
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dense | keras.layers.MultiHeadAttention):
            for sub in [layer, *sublayers(layer, recursive=True)]:
                if isinstance(sub, keras.layers.Dense | keras.layers.EinsumDense):
                    sub.enable_lora(2)
    return lm_models.train(model, steps=steps)


def test_lora_model_to_tflite_is_merged_and_verified(tmp_path):
    model = _lora_functional()
    before = _state(model)
    result = to_tflite(model, tmp_path / "lora.tflite")
    # Verified against the LoRA model's own output (to_tflite's check).
    assert result.verification.max_abs_error <= 1e-4
    after = _state(model)
    assert after[1] == before[1] and all(after[1])
    assert all(np.array_equal(x, y) for x, y in zip(before[0], after[0], strict=True))
    plain = _plain_twin(model)
    twin = to_tflite(plain, tmp_path / "plain.tflite")
    assert abs(result.size_bytes / twin.size_bytes - 1) <= 0.05


@pytest.mark.slow
def test_lora_model_to_saved_model(tmp_path):
    model = _lora_functional()
    before = _state(model)
    result = to_saved_model(model, tmp_path / "lora")
    assert result.verification.max_abs_error <= 1e-4
    after = _state(model)
    assert after[1] == before[1]
    assert all(np.array_equal(x, y) for x, y in zip(before[0], after[0], strict=True))


def test_merged_lora_puts_everything_back_on_an_error():
    from kerasnorm.export.prepare.weights import merged_lora

    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(lm_models.VOCAB, 8)(tokens)
    x = keras.layers.EinsumDense("btc,cd->btd", (None, 8))(x)
    model = keras.Model(tokens, keras.layers.Dense(lm_models.VOCAB)(x))
    for layer in model.layers[2:]:
        layer.enable_lora(2)
        layer.lora_kernel_b.assign(np.ones(layer.lora_kernel_b.shape, "float32"))
    before = _state(model)
    x = lm_models.rule_sequences(2)[:, :6]
    want = np.asarray(model(x))
    with pytest.raises(RuntimeError, match="inside"):
        with merged_lora(model) as names:
            assert names and not any(_state(model)[1])
            # Merged: the same function without the adapters.
            np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-5)
            raise RuntimeError("inside")
    after = _state(model)
    assert after[1] == before[1]
    assert all(np.array_equal(x, y) for x, y in zip(before[0], after[0], strict=True))


def test_a_product_of_keras_variables_traces_under_the_matmul_lowering():
    """An EinsumDense's unmerged LoRA product `a @ b` of two variables
    (rank 3 by a matrix) under `matmul_as_one_product`."""
    import tensorflow as tf

    from kerasnorm._compat import matmul_as_one_product

    a = keras.Variable(np.ones((4, 2, 3), "float32"))
    b = keras.Variable(np.ones((3, 5), "float32"))

    @tf.function
    def product():
        return keras.ops.matmul(a, b)

    with matmul_as_one_product():
        np.testing.assert_array_equal(product().numpy(), np.full((4, 2, 5), 3.0))


def _half_causal_lm(family, dtype, layers=2, steps=40):
    keras.utils.set_random_seed(0)
    return lm_models.train_causal_lm(
        lm_models.causal_lm(family, dtype=dtype, num_layers=layers), steps=steps
    )


def _check_half(model, dtype, tmp_path, quantize=None):
    weights = [np.array(w.numpy()) for w in model.weights]
    result = to_litert_lm(
        model,
        tmp_path / "half.tflite",
        max_sequence_length=24,
        prefill_lengths=(8,),
        quantize=quantize,
        verify_inputs=PROMPTS,
    )
    assert result.rebuilt_from == dtype
    # Against the float32 copy of the same weights: float32 rounding.
    if quantize is None:
        assert result.check.max_error <= 1e-4 and result.check.agreement == 1.0
    # Against the half-precision model's own greedy choices.
    assert result.original_check.agreement >= 0.9
    assert result.original_check.rms_error <= 0.1
    assert all(
        np.array_equal(w, v.numpy())
        for w, v in zip(weights, model.weights, strict=True)
    )
    assert model.dtype_policy.name == dtype


def test_mixed_bfloat16_llama_exports_float32(tmp_path):
    model = _half_causal_lm("llama", "mixed_bfloat16", layers=1, steps=16)
    _check_half(model, "mixed_bfloat16", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, quantize",
    [
        ("llama", "dynamic"),
        pytest.param("gemma", None, marks=pytest.mark.exhaustive),
        pytest.param("llama", None, marks=pytest.mark.exhaustive),
        pytest.param("gemma", "dynamic", marks=pytest.mark.exhaustive),
    ],
)
def test_bfloat16_causal_lm_exports(family, quantize, tmp_path):
    _check_half(_half_causal_lm(family, "bfloat16"), "bfloat16", tmp_path, quantize)


@pytest.mark.slow
def test_lora_on_a_bfloat16_llama(tmp_path):
    """Both at once: the float32 copy, rebuilt from a config that carries no
    adapters, gets the merged kernels."""
    keras.utils.set_random_seed(0)
    model = lm_models.causal_lm("llama", dtype="bfloat16", num_layers=1)
    model.backbone.enable_lora(4)
    lm_models.train_causal_lm(model, steps=40)
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=24,
        prefill_lengths=(8,),
        verify_inputs=PROMPTS,
    )
    assert result.rebuilt_from == "bfloat16"
    assert result.original_check.agreement >= 0.9
    assert all(layer.lora_enabled for layer in _lora_layers(model))


@pytest.mark.slow
@pytest.mark.exhaustive
def test_bfloat16_functional_decoder_to_tflite(tmp_path):
    """A decoder built under the bfloat16 policy: to_tflite writes its
    float32 copy and checks it against the copy and the model."""
    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy("bfloat16")
    try:
        keras.utils.set_random_seed(0)
        model = lm_models.attention_decoder(layers=1)
    finally:
        keras.config.set_dtype_policy(saved)
    lm_models.train(model, steps=32)
    result = to_tflite(model, tmp_path / "half.tflite")
    assert result.rebuilt_from == "bfloat16"
    assert result.verification.max_abs_error <= 1e-4 * max(
        1.0, float(np.abs(model(PROMPTS)).max())
    )
    assert result.original_verification is not None


def test_merged_kernel_is_the_equation_with_and_without_lora_alpha():
    """`kernel + alpha / rank * a @ b`; a Keras without `lora_alpha` (the
    feature test's fallback) adds `a @ b` unscaled."""
    from types import SimpleNamespace

    from kerasnorm._compat.keras_lora import merged_kernel

    rng = np.random.default_rng(0)
    kernel, a, b = (
        rng.normal(size=s).astype("float32") for s in [(3, 4), (3, 2), (2, 4)]
    )
    layer = keras.layers.Dense(4)
    layer.build((None, 3))
    layer.enable_lora(2, lora_alpha=6)
    for variable, value in zip(lora_variables(layer), (kernel, a, b), strict=True):
        variable.assign(value)
    np.testing.assert_allclose(merged_kernel(layer), kernel + 3.0 * a @ b, rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(layer(np.eye(3, dtype="float32"))),
        merged_kernel(layer) + np.asarray(layer.bias),
        rtol=1e-5,
        atol=1e-6,
    )
    old = SimpleNamespace(
        name="old",
        _kernel=keras.Variable(kernel),
        lora_kernel_a=keras.Variable(a),
        lora_kernel_b=keras.Variable(b),
        lora_rank=2,
    )
    np.testing.assert_allclose(merged_kernel(old), kernel + a @ b, rtol=1e-6)
