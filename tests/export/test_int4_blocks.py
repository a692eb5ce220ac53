"""`quantize="int4"`'s blocks, against NumPy references:

- a product whose input dimension `int4_block_size` does not divide is
  written in the largest smaller block that does (int8 per row where none
  does), that product alone, and the result lists it; the file computes
  what the model does;
- the products the caller keeps at int8 (`Calibration.int8`) are int8
  per channel, the others int4;
- GPTQ's rounding (`int_weights.int4_blocks_gptq`) against the product's
  error it minimizes, computed from its definition, and the rule that takes
  it (`int_weights.int4_rounding`): too few calibration rows round to
  nearest; enough rows for a wider input (its `x^T x` rank-deficient)
  lower the error on held-out inputs, where GPTQ's former fixed damping
  raised it.
"""

import keras
import numpy as np
import pytest

from kerasnorm.export import litert
from kerasnorm.export import to_litert_lm
from kerasnorm.export.weights import int_weights
from tests.export import lm_models
from tests.export.flatbuffer_ops import decode_ops

pytestmark = pytest.mark.tf_only

schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
fu = pytest.importorskip("ai_edge_litert.tools.flatbuffer_utils")


def _products(content):
    """(weights tensor, its op's options, the model) of each
    FULLY_CONNECTED of the decode graph with constant weights."""
    found = []
    for code, op, graph, model in decode_ops(content)[1]:
        if code != schema.BuiltinOperator.FULLY_CONNECTED:
            continue
        tensor = graph.tensors[op.inputs[1]]
        if tensor.buffer and model.buffers[tensor.buffer].data is not None:
            found.append((tensor, op.builtinOptions, model, graph))
    return found


def _kernels(model):
    """Each product's `(out, in)` float weights, Dense and einsum kernels
    flattened either way, and with a norm's gain folded in."""
    kernels = []
    for w in model.weights:
        if w.path.endswith(("kernel", "embeddings")) and len(w.shape) >= 2:
            k = np.asarray(w)
            kernels += [k.reshape(k.shape[0], -1).T, k.reshape(-1, k.shape[-1]).T]
            if w.path.endswith("embeddings"):
                kernels.append(k)
    # The converter folds a norm's gain into the product after it.
    gains = [np.asarray(w) for w in model.weights if w.path.endswith("gamma")]
    return kernels + [
        k * g[None] for k in kernels for g in gains if g.shape[0] == k.shape[1]
    ]


def test_a_block_that_does_not_divide_falls_back_for_that_product(tmp_path):
    """Hidden 64 and feed-forward 128 with blocks of 128: the products
    reading 64 inputs are written in blocks of 64, the one reading 128 in
    blocks of 128; the result lists the first."""
    keras.utils.set_random_seed(0)
    model = lm_models.train(lm_models.kerasnorm_decoder(width=64, layers=1), steps=300)
    path = tmp_path / "a.tflite"
    result = to_litert_lm(
        model,
        path,
        max_sequence_length=16,
        prefill_lengths=(4,),
        quantize="int4",
        int4_block_size=128,
        verify_inputs=lm_models.rule_sequences(3, seed=5)[:, :6],
    )
    content = path.read_bytes()
    kernels = _kernels(model)
    blocks = {}
    for tensor, _, fmodel, graph in _products(content):
        assert tensor.type == schema.TensorType.INT4
        details = tensor.quantization.details
        rows, cols = tensor.shape
        block = details.blockSize
        blocks.setdefault(cols, set()).add(block)
        # The largest of (32, 64, 128, 256) up to 128 dividing the input.
        assert block == max(b for b in (32, 64, 128) if cols % b == 0)
        scales = np.frombuffer(
            bytes(fmodel.buffers[graph.tensors[details.scales].buffer].data),
            np.float16,
        ).astype(np.float32)
        steps = np.repeat(scales.reshape(rows, cols // block), block, axis=1)
        values = int_weights.unpack_int4(
            fmodel.buffers[tensor.buffer].data, rows * cols
        )
        values = values.reshape(rows, cols)
        # Some kernel of the model rounded to nearest at the stored steps,
        # each block's step at most its largest magnitude over 7.
        matches = [
            k
            for k in kernels
            if k.shape == (rows, cols)
            and np.array_equal(np.clip(np.rint(k / steps), -8, 7), values)
        ]
        assert matches, tensor.name
        top = np.abs(matches[0]).reshape(rows, cols // block, block).max(axis=2)
        assert np.all(scales.reshape(rows, -1) <= top / 7 * 1.01 + 1e-12)
    assert blocks[64] == {64} and blocks[128] == {128}
    fallen = {f.shape[1] for f in result.int4_fallbacks}
    assert fallen == {64}
    assert all(f.asked == 128 and f.written == 64 for f in result.int4_fallbacks)
    assert "blocks of 64" in str(result.int4_fallbacks[0])
    assert result.check.agreement >= 0.9
    # GPTQ's row, calibrated on 3 x 6 given tokens: too few rows, each
    # calibrated product rounded to nearest (as the kernels matched above).
    assert result.int4_gptq and all(
        not r.gptq and r.rows == 18 for r in result.int4_gptq
    )
    assert result.int4_rounding.startswith("0 of ")


def test_no_int4_block_divides_falls_back_to_int8():
    """Hidden 16: no block of 32 or less divides it; those products are
    int8 per row, with dynamic-range int8 inputs, and the file computes
    what the model does (written without the export's check: int4 is too
    coarse for a 16-wide model's greedy choices)."""
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative

    keras.utils.set_random_seed(0)
    model = lm_models.train(lm_models.kerasnorm_decoder(width=16, layers=1), steps=300)
    fallbacks = []
    content = write_generative(
        cached_model(model, 16),
        prefill_lengths=(4,),
        max_sequence_length=16,
        quantize="int4",
        int4_block_size=32,
        fallbacks=fallbacks,
    )
    kernels = _kernels(model)
    types = {}
    for tensor, options, _, _ in _products(content):
        rows, cols = tensor.shape
        types.setdefault(cols, set()).add(tensor.type)
        if tensor.type == schema.TensorType.INT8:
            scale = np.asarray(tensor.quantization.scale, np.float32)
            assert options.asymmetricQuantizeInputs
            assert any(
                k.shape == (rows, cols)
                and np.allclose(scale, np.abs(k).max(axis=1) / 127, rtol=1e-6)
                for k in kernels
            ), tensor.name
    # Inputs of 16: int8; the feed-forward's 32: int4 in blocks of 32.
    assert types[16] == {schema.TensorType.INT8}
    assert types[32] == {schema.TensorType.INT4}
    assert {f.written for f in fallbacks} == {"int8"}
    assert {f.shape[1] for f in fallbacks} == {16}
    assert "int8 per row" in str(fallbacks[0])
    ids = [3, 5, 8, 13]
    want = np.asarray(model(np.asarray([ids], np.int32)))[0, -1]
    got = litert.Generator(content).prefill(ids)[-1]
    assert np.abs(got - want).max() <= 0.3 * np.abs(want).max()


def test_gptq_rounding_lowers_the_products_error():
    """On inputs with correlated channels, GPTQ's integers give a smaller
    error of `x @ w.T` than rounding to nearest at the same block scales'
    search, and its first column is the nearest rounding (nothing carried
    into it yet); its values stay int4."""
    rng = np.random.default_rng(0)
    rows, cols, block = 48, 128, 32
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    mix = rng.standard_normal((cols, cols)) * 0.3 + np.eye(cols)
    x = rng.standard_normal((1024, cols)) @ mix
    hessian = x.T @ x
    q, scale = int_weights.int4_blocks_gptq(w, hessian, block)
    q0, scale0 = int_weights.int4_blocks(w, block)
    assert q.dtype == np.int8 and q.min() >= -8 and q.max() <= 7

    def error(q, scale):
        steps = np.repeat(scale.astype(np.float32), block, axis=1)
        return np.linalg.norm(x @ (q * steps - w).T) / np.linalg.norm(x @ w.T)

    assert error(q, scale) < 0.8 * error(q0, scale0)
    np.testing.assert_array_equal(scale[:, 0], scale0[:, 0])
    np.testing.assert_array_equal(q[:, 0], q0[:, 0])


def test_gptq_rounds_where_its_calibration_rows_are_enough():
    """`int4_rounding`: under `GPTQ_MIN_ROWS` rows, `int4_blocks`' integers
    and scales exactly; with 48 rows for a 128-wide input, GPTQ, whose
    output error on 4096 held-out inputs of the same distribution is below
    rounding to nearest's, where GPTQ's former fixed damping (1 % of the
    mean diagonal) is above it (fitted to the 48)."""
    rng = np.random.default_rng(0)
    out, cols, block = 64, 128, 32
    w = rng.standard_normal((out, cols)).astype(np.float32)
    mix = rng.standard_normal((cols, cols)) * 0.3 + np.eye(cols)
    x = (rng.standard_normal((48 + 4096, cols)) @ mix).astype(np.float32)
    calibration, held = x[:48], x[48:].astype(np.float64)

    def error(q, scale):
        steps = np.repeat(scale.astype(np.float32), block, axis=1)
        return np.linalg.norm(held @ (q * steps - w).T) / np.linalg.norm(held @ w.T)

    nearest = int_weights.int4_blocks(w, block)
    few = calibration[: int_weights.GPTQ_MIN_ROWS - 1]
    q, scale, gptq = int_weights.int4_rounding(w, few, block)
    assert not gptq
    np.testing.assert_array_equal(q, nearest[0])
    np.testing.assert_array_equal(scale, nearest[1])
    q, scale, gptq = int_weights.int4_rounding(w, calibration, block)
    assert gptq
    c = calibration.astype(np.float64)
    fixed = int_weights.int4_blocks_gptq(w, c.T @ c, block, damp=0.01)
    assert error(q, scale) < error(*nearest) < error(*fixed)


def test_gptq_calibrates_on_text_and_rounds_invented_ids_to_nearest():
    """`"int4"` (its row asks for GPTQ) is calibrated on the check's prompts
    where they are text (the model's tokenizer's, or `verify_inputs`), and
    a model checked on invented ids is rounded to nearest (random ids
    calibrated GPTQ worse than rounding on a real model)."""
    from kerasnorm.export.litert_lm import prompts as sources
    from kerasnorm.export.litert_lm.calibrate import weights_pass_options

    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(width=32, layers=1)
    prompts = lm_models.rule_sequences(2, seed=5)[:, :6].tolist()
    calibrated = {
        source: weights_pass_options(model, "int4", None, {}, prompts, source)[
            "calibration"
        ]
        for source in (sources.TEXT, sources.GIVEN, sources.INVENTED)
    }
    assert calibrated[sources.INVENTED] is None
    for source in (sources.TEXT, sources.GIVEN):
        # Each product's inputs: one row per calibration token.
        inputs = list(calibrated[source].values())
        assert inputs and all(x.shape[0] == 12 for x in inputs), source
    # Keras' own int4 integers are written as they are: nothing to calibrate.
    known = {"kernel": object()}
    assert (
        weights_pass_options(model, "int4", None, known, prompts, sources.TEXT)[
            "calibration"
        ]
        is None
    )


def test_a_gptq_row_writes_gptqs_integers(monkeypatch):
    """The table's `gptq` column (on for `"int4"`): a row with it on writes
    each calibrated product's int4 as `int4_rounding` gives it on the
    product's inputs on the calibration sequences (4 x 10 tokens: enough
    rows for GPTQ), and lists each in the calibration's `rounded`."""
    import dataclasses

    from kerasnorm.export.litert_lm.calibrate import weights_pass_options
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative
    from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
    from kerasnorm.export.weights.int_weights import weights_key

    row = dataclasses.replace(GENERATIVE_MODES["int4"], name="int4_gptq", gptq=True)
    monkeypatch.setitem(GENERATIVE_MODES, row.name, row)
    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(width=32, layers=1)
    cached = cached_model(model, 16)
    prompts = lm_models.rule_sequences(4, seed=5)[:, :10].tolist()
    options = weights_pass_options(model, row.name, None, {}, prompts)
    calibration = options["calibration"]
    inputs = dict(calibration)  # the pass lets the rows go once it is done
    content = write_generative(
        cached,
        prefill_lengths=(4,),
        max_sequence_length=16,
        quantize=row.name,
        variables=model.weights,
        **options,
    )
    written = 0
    for tensor, _, fmodel, _ in _products(content):
        rows, cols = tensor.shape
        values = int_weights.unpack_int4(
            fmodel.buffers[tensor.buffer].data, rows * cols
        )
        gptq = []
        for k in _kernels(model):
            x = inputs.get(weights_key(k)) if k.shape == (rows, cols) else None
            if x is not None:
                gptq.append(int_weights.int4_rounding(k, x, 32)[0])
        # The calibrated kernel of the same shape it is (q, k, v and the
        # attention's output are all 32 x 32): GPTQ's integers exactly.
        assert any(np.array_equal(values.reshape(rows, cols), q) for q in gptq)
        written += 1
    # q, k, v, the attention's output, the feed-forward's two, the head.
    assert written >= 6
    rounded = calibration.rounded
    assert rounded and all(r.gptq and r.rows == 40 for r in rounded)


def test_layers_of_equal_weights_share_calibration_rows_at_equal_weight():
    """Two products of equal weights are one tensor in the file, rounded
    once: `product_inputs` gives their key both layers' rows, each layer's
    scaled to mean square 1 (so that the larger inputs do not decide the
    rounding alone); a product of its own keeps its inputs as they are."""
    from kerasnorm.export.weights.calibration import product_inputs
    from kerasnorm.export.weights.int_weights import weights_key

    x = keras.Input((16,))
    small, large, alone = (keras.layers.Dense(8, use_bias=False) for _ in range(3))
    model = keras.Model(x, [small(x), large(x * 100.0 + 1.0), alone(x)])
    large.kernel.assign(small.kernel.numpy())
    data = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    calibration = product_inputs(model, [data], model)

    shared = calibration[weights_key(small.kernel.numpy().T)]
    assert shared.shape == (10, 16)
    halves = (shared[:5], shared[5:])  # in the order the layers ran
    for half in halves:
        np.testing.assert_allclose(np.mean(half**2), 1.0, rtol=1e-5)
    for raw in (data, data * 100.0 + 1.0):
        want = raw / np.sqrt(np.mean(raw**2))
        assert min(np.abs(half - want).max() for half in halves) < 1e-4
    own = calibration[weights_key(alone.kernel.numpy().T)]
    np.testing.assert_array_equal(own, data)


def test_calibration_puts_back_a_call_another_pass_replaced():
    """A product whose `call` another pass replaced on the instance (a
    smoothed head's lookup) records the inputs the replacement passes on,
    and has that replacement again after `product_inputs`, not the
    class's method (which would drop the other pass's scaling)."""
    from kerasnorm._compat import replace_method
    from kerasnorm.export.weights.calibration import product_inputs
    from kerasnorm.export.weights.int_weights import weights_key

    x = keras.Input((16,))
    dense = keras.layers.Dense(8, use_bias=False)
    model = keras.Model(x, dense(x))
    class_call = dense.call

    def doubled(inputs, *args, **kwargs):
        return class_call(inputs * 2.0, *args, **kwargs)

    replace_method(dense, "call", doubled)
    data = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    want = np.asarray(model(data))
    calibration = product_inputs(model, [data], model)
    np.testing.assert_array_equal(
        calibration[weights_key(dense.kernel.numpy().T)], data
    )
    assert dense.__dict__["call"] is doubled
    np.testing.assert_allclose(np.asarray(model(data)), want, rtol=1e-6)


def test_products_the_caller_keeps_at_int8_are_int8_per_channel():
    """`Calibration.int8` (an embedding bundle's attention value and
    output): those products of an int4 file are written int8 per output
    channel, their input quantized per call, as `int8_rounding` rounds them
    on their calibration rows (GPTQ, at `int8_rows`' scales), and not
    rounded to int4; the others GPTQ's int4 blocks."""
    import tensorflow as tf

    from kerasnorm.export.weights.calibration import product_inputs
    from kerasnorm.export.weights.calibration import products_of_layers
    from kerasnorm.export.weights.quantize import quantize_weights

    keras.utils.set_random_seed(0)
    x = keras.Input((32,))
    value = keras.layers.Dense(32, use_bias=False, name="value")
    other = keras.layers.Dense(16, use_bias=False, name="other")
    model = keras.Model(x, other(value(x)))
    data = np.random.default_rng(0).standard_normal((40, 32)).astype(np.float32)
    calibration = product_inputs(model, [data], model)
    kept = products_of_layers(model, ("value",))
    assert list(kept.values()) == [(value.path,)]
    calibration.int8.update(kept)
    function = tf.function(lambda t: model(t), input_signature=[tf.TensorSpec((1, 32))])
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function()]
    )
    content = quantize_weights(converter.convert(), "int4", 32, calibration=calibration)

    written = {}
    for tensor, options, fmodel, _ in _products(content):
        stored = np.asarray(fmodel.buffers[tensor.buffer].data)
        written[tuple(tensor.shape)] = (tensor, options, stored)
    tensor, options, stored = written[(32, 32)]
    assert tensor.type == schema.TensorType.INT8 and options.asymmetricQuantizeInputs
    q, scale, gptq = int_weights.int8_rounding(value.kernel.numpy().T, data)
    assert gptq
    np.testing.assert_array_equal(stored.view(np.int8).reshape(32, 32), q)
    np.testing.assert_allclose(tensor.quantization.scale, scale)
    assert written[(16, 32)][0].type == schema.TensorType.INT4
    rounded = {(r.shape, r.bits) for r in calibration.rounded}
    assert rounded == {((16, 32), 4), ((32, 32), 8)}
    assert all(r.gptq for r in calibration.rounded)
