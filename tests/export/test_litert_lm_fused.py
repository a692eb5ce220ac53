"""The products that read one input as one in the cached step
(`litert_lm.fused_products`): query/key/value and gate/up are one
`FULLY_CONNECTED` each in the decode graph, the file still computes what
the Keras model does, and GPTQ calibrates the fused product."""

import numpy as np
import pytest

from kerasnorm.export.litert.runner import op_counts
from kerasnorm.export.litert_lm import fused_products
from kerasnorm.export.litert_lm.calibrate import weights_pass_options
from kerasnorm.export.litert_lm.check import check_generation
from kerasnorm.export.litert_lm.hub_step import cached_hub_model
from kerasnorm.export.litert_lm.write import write_generative
from kerasnorm.export.weights import int_weights
from kerasnorm.export.weights.int_weights import weights_key
from tests.export import lm_models

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only
CONTEXT = 16
PROMPTS = lm_models.rule_sequences(2, seed=11)[:, :5]


def _distinct(model, seed=0):
    """`model` with every weight drawn afresh: keras-hub initializes a
    small model's key and value kernels alike, which the converter then
    computes once (two products written as one)."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        if w.dtype == "float32" and len(w.shape) >= 1:
            w.assign(0.3 * rng.standard_normal(w.shape).astype(np.float32))
    return model


def _file(model, quantize, fuse, monkeypatch, **given):
    monkeypatch.setattr(fused_products, "FUSE", fuse)
    return write_generative(
        cached_hub_model(model),
        prefill_lengths=(4,),
        max_sequence_length=CONTEXT,
        quantize=quantize,
        variables=model.weights,
        **given,
    )


@pytest.mark.parametrize(
    "family, quantize",
    [("llama", "dynamic"), ("qwen2", None), ("gemma3", None)],
)
def test_the_decode_step_computes_one_product_per_input(family, quantize, monkeypatch):
    """Each block's query, key and value are one FULLY_CONNECTED, its gate
    and up another (Qwen2's biases concatenated, Gemma3's einsum kernels
    `(heads, hidden, head_dim)`), so a block writes 4 where it wrote 7; the
    file's logits still follow the model's (float32: within 1e-4 of the
    largest; "dynamic": the same errors as the unfused file's, each
    output row rounded alike)."""
    model = _distinct(lm_models.hub_causal_lm(family, seed=0))
    layers = len(model.backbone.transformer_layers)
    groups = fused_products.product_groups(model)
    assert [len(g) for g in groups] == [3, 2] * layers
    checks, counts = {}, {}
    for fuse in (True, False):
        content = _file(model, quantize, fuse, monkeypatch)
        counts[fuse] = op_counts(content)
        checks[fuse] = check_generation(
            model, content, PROMPTS, quantize=quantize, invented=False
        )
    # No concatenation at run time: the kernels (and biases) are one weight.
    assert counts[True].get("CONCATENATION") == counts[False].get("CONCATENATION")
    # 7 products a block and the head, against 4 and the head.
    assert counts[False]["FULLY_CONNECTED"] == 7 * layers + 1
    assert counts[True]["FULLY_CONNECTED"] == 4 * layers + 1
    if quantize is None:
        assert checks[True].max_error <= 1e-4 and checks[True].agreement == 1.0
    else:
        assert checks[True].agreement >= 0.9
        unfused = checks[False].max_error
        assert checks[True].max_error == pytest.approx(unfused, rel=1e-3)


def test_gptq_calibrates_the_fused_product(monkeypatch):
    """GPTQ's Hessian is its input's: the fused query/key/value product is
    calibrated on the rows its layers read, keyed by its concatenated
    weights, and the file holds GPTQ's integers of it."""
    model = _distinct(lm_models.hub_causal_lm("llama", seed=0))
    prompts = lm_models.rule_sequences(4, seed=5)[:, :12].tolist()
    options = weights_pass_options(model, "int4", None, {}, prompts)
    calibration = options["calibration"]
    inputs = dict(calibration)  # the pass lets the rows go once it is done
    fused = fused_products.fused_products(model)
    content = _file(model, "int4", True, monkeypatch, **options)
    for product in fused:
        weights = product.out_in()
        x = inputs[weights_key(weights)]
        assert x.shape == (sum(len(p) for p in prompts), weights.shape[1])
    # Every fused product was rounded by GPTQ.
    gptq = {tuple(r.shape) for r in calibration.rounded if r.gptq}
    assert {p.out_in().shape for p in fused} <= gptq
    # The file's integers of the first block's query/key/value: GPTQ's.
    from tests.export.test_int4_blocks import _products

    weights = fused[0].out_in()
    want = int_weights.int4_rounding(
        weights, inputs[weights_key(weights)], options["int4_block_size"]
    )[0]
    rows, cols = weights.shape
    found = [
        int_weights.unpack_int4(m.buffers[t.buffer].data, rows * cols).reshape(
            rows, cols
        )
        for t, _, m, _ in _products(content)
        if tuple(t.shape) == (rows, cols)
    ]
    assert any(np.array_equal(q, want) for q in found)


def test_a_layer_keras_quantized_keeps_its_own_product():
    """A layer Keras quantized keeps its own product (its integers are
    Keras'); the layers beside it that read its input are still one."""
    model = lm_models.hub_causal_lm("llama", seed=0)
    layer = model.backbone.transformer_layers[0]
    attention = layer._self_attention_layer
    attention._query_dense.quantize("int8")
    groups = fused_products.product_groups(model)
    names = [[m.name for m in g] for g in groups]
    assert names[0] == ["key", "value"]
    assert all(attention._query_dense not in g for g in groups)
