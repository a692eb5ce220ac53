"""GPTQ for int8 weights (`int_weights.int8_rows_gptq`, `int8_rounding`),
against NumPy references:

- on inputs with correlated channels it lowers the error of `x @ w.T` that
  it minimizes, computed from its definition, at `int8_rows`' scales; on
  uncorrelated inputs (a diagonal `x^T x`) nothing is carried and it is
  rounding to nearest exactly;
- the rule that takes it: under `GPTQ_MIN_ROWS` calibration rows,
  `int8_rows` exactly;
- in the files: `"weight_only_int8"` and `"dynamic"` write each calibrated
  product's int8 as `int8_rounding` gives it on the product's inputs, and
  list it (`Rounded.bits` 8); a weight-only int8 table, which a tied
  head's product and the lookup share, holds GPTQ's integers on the head's
  inputs (`GenerativeMode.gptq_tied_head`), read by both; `"dynamic"`'s
  is rounded to nearest.
"""

import keras
import numpy as np
import pytest

from kerasnorm.export.weights import int_weights
from tests.export import lm_models
from tests.export.flatbuffer_ops import decode_ops

pytestmark = pytest.mark.tf_only


def _correlated(rng, rows, cols, seed=0):
    """`rows` inputs whose channels are correlated, the mixing drawn from
    `seed`: the same distribution for the same seed."""
    mix = np.random.default_rng(seed).standard_normal((cols, cols)) * 0.3
    return rng.standard_normal((rows, cols)) @ (mix + np.eye(cols))


def _error(x, q, scale, w):
    return np.linalg.norm(x @ (q * scale[:, None] - w).T) / np.linalg.norm(x @ w.T)


def test_int8_gptq_lowers_the_products_error_at_the_same_scales():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 300)).astype(np.float32)
    x = _correlated(rng, 2048, 300)
    q, scale = int_weights.int8_rows_gptq(w, x.T @ x)
    q0, scale0 = int_weights.int8_rows(w)
    assert q.dtype == np.int8 and np.abs(q.astype(int)).max() <= 127
    np.testing.assert_array_equal(scale, scale0)
    # Nothing is carried into the first column yet.
    np.testing.assert_array_equal(q[:, 0], q0[:, 0])
    assert _error(x, q, scale, w) < 0.8 * _error(x, q0, scale0, w)


def test_int8_gptq_rounds_a_table_in_chunks_of_rows_as_whole(monkeypatch):
    """Rows are independent given the Hessian: rounded `GPTQ_ROWS` at a
    time (7, which does not divide 48), the same integers and scales."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 300)).astype(np.float32)
    x = _correlated(rng, 1024, 300)
    whole = int_weights.int8_rows_gptq(w, x.T @ x)
    monkeypatch.setattr(int_weights, "GPTQ_ROWS", 7)
    chunked = int_weights.int8_rows_gptq(w, x.T @ x)
    np.testing.assert_array_equal(chunked[0], whole[0])
    np.testing.assert_array_equal(chunked[1], whole[1])


def test_int8_gptq_on_uncorrelated_inputs_is_rounding_to_nearest():
    """A diagonal `x^T x`: each column's error spreads to no other column
    (the inverse's factor is diagonal), so GPTQ's integers are the
    nearest."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 200)).astype(np.float32)
    hessian = np.diag(rng.uniform(0.5, 2.0, 200))
    q, _ = int_weights.int8_rows_gptq(w, hessian)
    np.testing.assert_array_equal(q, int_weights.int8_rows(w)[0])


def test_int8_rounding_takes_gptq_only_with_enough_rows():
    """Under `GPTQ_MIN_ROWS` rows, `int8_rows` exactly; with 200 rows for
    a 64-wide input, GPTQ, whose error on 4096 held-out inputs of the same
    distribution is below rounding to nearest's."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    x = _correlated(rng, 200, 64).astype(np.float32)
    few = x[: int_weights.GPTQ_MIN_ROWS - 1]
    q, scale, gptq = int_weights.int8_rounding(w, few)
    assert not gptq
    np.testing.assert_array_equal(q, int_weights.int8_rows(w)[0])
    q, scale, gptq = int_weights.int8_rounding(w, x)
    assert gptq and not np.array_equal(q, int_weights.int8_rows(w)[0])
    held = _correlated(np.random.default_rng(3), 4096, 64)
    assert _error(held, q, scale, w) < _error(held, *int_weights.int8_rows(w), w)


def _int8_weights(content):
    """The int8 constant weights each FULLY_CONNECTED multiplies by
    (directly, `"dynamic"`, or through a `DEQUANTIZE`, weight-only),
    `(rows, cols)` int8 arrays."""
    schema, ops = decode_ops(content)
    products = schema.BuiltinOperator.FULLY_CONNECTED
    found = []
    for code, op, graph, model in ops:
        if code not in (products, schema.BuiltinOperator.DEQUANTIZE):
            continue
        tensor = graph.tensors[op.inputs[1 if code == products else 0]]
        data = model.buffers[tensor.buffer].data if tensor.buffer else None
        if tensor.type == schema.TensorType.INT8 and data is not None:
            found.append(np.asarray(data).view(np.int8).reshape(tensor.shape))
    return found


@pytest.mark.parametrize("mode", ["weight_only_int8", "dynamic"])
def test_int8_files_write_gptqs_integers(mode):
    from kerasnorm.export.litert_lm.calibrate import weights_pass_options
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative
    from kerasnorm.export.weights.int_weights import weights_key

    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(width=32, layers=1)
    prompts = lm_models.rule_sequences(4, seed=5)[:, :10].tolist()
    options = weights_pass_options(model, mode, None, {}, prompts)
    calibration = options["calibration"]
    inputs = dict(calibration)  # the pass lets the rows go once it is done
    content = write_generative(
        cached_model(model, 16),
        prefill_lengths=(4,),
        max_sequence_length=16,
        quantize=mode,
        variables=model.weights,
        **options,
    )
    kernels = [
        np.asarray(w).reshape(-1, np.asarray(w).shape[-1]).T
        for w in model.weights
        if w.path.endswith("kernel")
    ]
    expected = [
        int_weights.int8_rounding(k, inputs[weights_key(k)])[0]
        for k in kernels
        if weights_key(k) in inputs
    ]
    assert not calibration  # not held through the check
    written = _int8_weights(content)
    assert len(expected) >= 4
    for q in expected:
        assert any(w.shape == q.shape and np.array_equal(w, q) for w in written)
    rounded = calibration.rounded
    assert len(rounded) >= len(expected)
    assert all(r.bits == 8 and r.gptq and r.rows == 40 for r in rounded)


@pytest.mark.parametrize("family", ["gemma", "llama"])
def test_a_tied_table_is_calibrated_where_the_row_says(family, monkeypatch):
    """A keras-hub CausalLM's tied head (Gemma's) reads the table its
    lookup reads: its key is in the calibration of a mode whose row has
    `gptq_tied_head` (`"int4"`, `"weight_only_int8"`), and not where the
    row has it off (`"dynamic"`; also weight-only int8 with its row
    changed). An untied head (this Llama's) is a product of its own,
    calibrated in every mode."""
    import dataclasses

    from kerasnorm.export.options import generative_modes

    pytest.importorskip("keras_hub")
    from kerasnorm.export.litert_lm.calibrate import weights_pass_options
    from kerasnorm.export.weights.calibration import _head_of
    from kerasnorm.export.weights.int_weights import weights_key

    model = lm_models.hub_causal_lm(family, seed=0)
    embedding = model.backbone.token_embedding
    head = weights_key(_head_of(embedding))
    prompts = [[i % 23 + 1 for i in range(40)]]

    def calibrated(mode):
        return weights_pass_options(model, mode, None, {}, prompts)["calibration"]

    int4, weight_only = calibrated("int4"), calibrated("weight_only_int8")
    assert head in int4 and head in weight_only and set(weight_only) == set(int4)
    dynamic = calibrated("dynamic")
    row = generative_modes.GENERATIVE_MODES["weight_only_int8"]
    monkeypatch.setitem(
        generative_modes.GENERATIVE_MODES,
        "weight_only_int8",
        dataclasses.replace(row, gptq_tied_head=False),
    )
    for off in (dynamic, calibrated("weight_only_int8")):
        if embedding.tie_weights:
            assert head not in off and set(off) == set(int4) - {head}
        else:
            assert set(off) == set(int4)


def test_a_weight_only_tied_table_holds_gptqs_integers_for_head_and_lookup():
    pytest.importorskip("keras_hub")
    from kerasnorm.export.litert_lm.calibrate import weights_pass_options
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative
    from kerasnorm.export.weights.calibration import _head_of
    from kerasnorm.export.weights.int_weights import weights_key

    model = lm_models.hub_causal_lm("gemma", seed=0)
    assert model.backbone.token_embedding.tie_weights
    prompts = [[i % 23 + 1 for i in range(40)]]
    options = weights_pass_options(model, "weight_only_int8", None, {}, prompts)
    table = _head_of(model.backbone.token_embedding)
    q, _, gptq = int_weights.int8_rounding(
        table, options["calibration"][weights_key(table)]
    )
    assert gptq and not np.array_equal(q, int_weights.int8_rows(table)[0])
    content = write_generative(
        cached_model(model, 48),
        prefill_lengths=(8,),
        max_sequence_length=48,
        quantize="weight_only_int8",
        variables=model.weights,
        **options,
    )
    schema, ops = decode_ops(content)
    read = {}  # op -> buffers of its int8 table-shaped inputs
    for code, op, graph, flat in ops:
        for index in op.inputs:
            tensor = graph.tensors[index] if index >= 0 else None
            if tensor is not None and tuple(tensor.shape) == table.shape:
                if tensor.type == schema.TensorType.INT8 and tensor.buffer:
                    data = np.asarray(flat.buffers[tensor.buffer].data)
                    np.testing.assert_array_equal(
                        data.view(np.int8).reshape(q.shape), q
                    )
                    read.setdefault(code, set()).add(tensor.buffer)
    ops_codes = schema.BuiltinOperator
    # The head's product reads it through a DEQUANTIZE, the lookup directly.
    assert set(read) == {ops_codes.DEQUANTIZE, ops_codes.GATHER}
    assert read[ops_codes.DEQUANTIZE] == read[ops_codes.GATHER]
