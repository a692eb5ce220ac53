"""Large weights kept out of the converter (`litert_lm.weight_inputs`):
traced as signature inputs and written into the converted file, the file
computes what the converter's own (weights as constants) does, in every
mode, and a graph that reads a weight input otherwise falls back to it.

The threshold is lowered so that a small keras-hub model's kernels and
table count as large (`INPUT_WEIGHT_BYTES` is 1 MiB)."""

import numpy as np
import pytest

pytestmark = pytest.mark.tf_only
pytest.importorskip("keras_hub")

# The table's bytes in each mode are no fused kernel's (query/key/value
# 64 x 128, gate/up 64 x 256: `fused_products`), so a count of them finds it.
CONFIG = dict(
    vocabulary_size=512,
    num_layers=2,
    hidden_dim=64,
    num_query_heads=4,
    num_key_value_heads=2,
    intermediate_dim=128,
)
IDS = [3, 5, 7, 11, 13, 17, 19, 23]
SMALL = 4096  # bytes: every kernel and table of CONFIG, no norm gain


def _model(family):
    from tests.export.lm_models import causal_lm

    config = dict(CONFIG)
    if family == "gemma3":
        # A tied head (the table read by GATHER and FULLY_CONNECTED) and
        # kernels the converter transposes before flattening.
        config.update(head_dim=16, use_query_key_norm=True)
    return causal_lm(family, seed=0, **config)


def _spied(monkeypatch, threshold):
    """Lower the threshold; record the converter's variable bytes and what
    `place_weights` wrote."""
    from kerasnorm.export.litert_lm import weight_inputs
    from kerasnorm.export.litert_lm import write

    monkeypatch.setattr(weight_inputs, "INPUT_WEIGHT_BYTES", threshold)
    seen = {"saved": [], "placed": []}
    save, place = write._save, write.place_weights

    def saved(*args, **kwargs):
        seen["saved"].append(save(*args, **kwargs))
        return seen["saved"][-1]

    def placed(*args, **kwargs):
        seen["placed"].append(place(*args, **kwargs))
        return seen["placed"][-1]

    monkeypatch.setattr(write, "_save", saved)
    monkeypatch.setattr(write, "place_weights", placed)
    return seen


def _write(model, mode):
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative

    return write_generative(
        cached_model(model, 16),
        prefill_lengths=(4, 8),
        max_sequence_length=16,
        quantize=mode,
        variables=model.weights,
    )


def _logits(content):
    from kerasnorm.export.litert.generator import Generator

    generator = Generator(content)
    rows = [generator.prefill(IDS[:5])[-1:]]
    rows += [generator.decode(token)[None] for token in IDS[5:-1]]
    return np.concatenate(rows)


def _sizes(content):
    """The byte counts of `content`'s buffers."""
    from kerasnorm.export.weights.buffers import read_model
    from kerasnorm.export.weights.quantize import weights_schema

    model, _ = read_model(weights_schema()[1], content)
    return [0 if b.data is None else len(b.data) for b in model.buffers]


def _weight_bytes(model):
    from kerasnorm.export.litert_lm.weight_inputs import large_variables

    return sum(4 * int(np.prod(w.shape)) for w in large_variables(model.weights, 0))


def test_a_float32_export_with_placed_weights_passes_its_check(tmp_path, monkeypatch):
    from kerasnorm.export import to_litert_lm

    model = _model("llama")
    seen = _spied(monkeypatch, SMALL)
    placed = to_litert_lm(model, tmp_path / "placed.tflite", max_sequence_length=16)
    # The converter held the norm gains only; every kernel and the table
    # were written after it, each once.
    assert seen["saved"][0] < 0.01 * _weight_bytes(model)
    assert 0.98 < seen["placed"][0] / _weight_bytes(model) <= 1.0
    assert placed.check.max_error <= 1e-5
    assert list(placed.signatures) == ["prefill", "decode"]


@pytest.fixture(scope="module")
def gemma3_files():
    """Gemma 3 (a tied head: the table read by GATHER and FULLY_CONNECTED;
    kernels the converter transposes before flattening) written by the
    converter, and with its weights placed: float32 and int4."""
    from kerasnorm.export.litert_lm import write

    model = _model("gemma3")
    files = {"plain": _write(model, None)}
    with pytest.MonkeyPatch.context() as monkeypatch:
        seen = _spied(monkeypatch, SMALL)
        files["placed"] = _write(model, None)
        files["placed int4"] = _write(model, "int4")
        # After the flatbuffer (a model past 256 MiB), read lazily.
        monkeypatch.setattr(write, "BUFFER_OFFSET_BYTES", 0)
        for mode in (None, "int4"):
            files[f"outside {mode}"] = _write(model, mode)
    assert len(seen["placed"]) == 4
    assert max(seen["saved"]) < 0.01 * _weight_bytes(model)
    return files


@pytest.mark.parametrize("mode", [None, "int4"])
def test_placed_weights_after_the_flatbuffer_are_the_same(gemma3_files, mode):
    """Written after the flatbuffer, the weights read from the variables
    where the pass reads them (`weights.placement.Values`): the same file's
    logits as inline."""
    inline = gemma3_files["placed" if mode is None else "placed int4"]
    outside = gemma3_files[f"outside {mode}"]
    assert b"buffer_location" in outside and b"buffer_location" not in inline
    # The same buffers, each aligned to 64 bytes after the flatbuffer.
    assert len(inline) < len(outside) < len(inline) + 64 * len(_sizes(inline))
    np.testing.assert_array_equal(_logits(outside), _logits(inline))


def test_placed_weights_compute_what_the_converters_do(gemma3_files):
    plain, placed = gemma3_files["plain"], gemma3_files["placed"]
    np.testing.assert_allclose(_logits(placed), _logits(plain), rtol=0, atol=1e-6)
    # The tied table once, as the converter's file after its pass.
    table = 4 * CONFIG["vocabulary_size"] * CONFIG["hidden_dim"]
    assert _sizes(placed).count(table) == _sizes(plain).count(table) == 1


@pytest.mark.parametrize("mode", ["dynamic", "int4"])
def test_placed_weights_quantize_as_the_converters(gemma3_files, mode):
    """The same integers as the converter's file quantized by the same pass:
    the same logits; int4 written by the writer itself."""
    from kerasnorm.export.weights.quantize import quantize_weights

    # As the generative writer calls it: a product the block does not
    # divide falls back alone (none does here).
    plain = quantize_weights(gemma3_files["plain"], mode, fallbacks=[])
    if mode == "int4":
        placed = gemma3_files["placed int4"]
    else:
        placed = quantize_weights(gemma3_files["placed"], mode, fallbacks=[])
    np.testing.assert_allclose(_logits(placed), _logits(plain), rtol=0, atol=1e-5)
    table = (
        CONFIG["vocabulary_size"] * CONFIG["hidden_dim"] // (2 if mode == "int4" else 1)
    )
    assert _sizes(placed).count(table) == 1


def test_a_weight_read_by_another_op_falls_back_to_the_converter(monkeypatch, capsys):
    """Every float weight as an input: the norm gains are read by `MUL`,
    which is not written as a constant; the writer says so (verbose) and
    converts with every weight in the converter."""
    from kerasnorm.export.litert_lm.check import reference_logits
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative

    model = _model("llama")
    seen = _spied(monkeypatch, 0)
    content = write_generative(
        cached_model(model, 16),
        prefill_lengths=(4, 8),
        max_sequence_length=16,
        variables=model.weights,
        verbose=True,
    )
    assert "not written as a constant" in capsys.readouterr().err
    assert not seen["placed"]
    assert len(seen["saved"]) == 2 and seen["saved"][1] >= _weight_bytes(model)
    expected = reference_logits(model, IDS)[4:7]
    np.testing.assert_allclose(_logits(content), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "steps",
    [
        (("transpose", (1, 0, 2)), ("transpose", (1, 0, 2))),
        (("reshape", (2, 3, 4)), ("transpose", (2, 0, 1))),
        (("transpose", (2, 0, 1)), ("transpose", (0, 2, 1)), ("reshape", (4, 6))),
        (("reshape", (6, 4)), ("transpose", (1, 0))),
        (("transpose", (1, 2, 0)), ("reshape", (3, 4, 2)), ("transpose", (2, 1, 0))),
    ],
)
def test_a_weights_transforms_simplified_compute_the_same(steps):
    """The key a placed buffer is stored once under: its transforms with
    no-op reshapes and identity transposes dropped, transposes composed."""
    from kerasnorm.export.weights.placement import _Placer

    placer = _Placer.__new__(_Placer)
    placer.weights = [np.zeros((2, 3, 4))]
    x = np.arange(24).reshape(2, 3, 4)

    def applied(steps):
        y = x
        for kind, argument in steps:
            y = y.reshape(argument) if kind == "reshape" else y.transpose(argument)
        return y

    simple = placer._simplified(0, steps)
    assert len(simple) < len(steps) or steps[0][0] == "reshape"
    np.testing.assert_array_equal(applied(simple), applied(steps))


def _int8_products(content):
    """Each 2-D int8 tensor of `content` with one scale per row,
    dequantized: `q * scale[:, None]`, float64."""
    from kerasnorm.export.weights.buffers import read_model
    from kerasnorm.export.weights.quantize import weights_schema

    schema, fu = weights_schema()
    model, _ = read_model(fu, content)
    found = []
    for tensor in model.subgraphs[0].tensors:
        params, data = tensor.quantization, model.buffers[tensor.buffer].data
        if tensor.type != schema.TensorType.INT8 or data is None or len(data) == 0:
            continue
        if len(tensor.shape) != 2 or params is None or params.scale is None:
            continue
        q = np.asarray(data).view(np.int8).reshape(tensor.shape).astype(np.float64)
        if len(params.scale) == tensor.shape[0]:
            found.append(q * np.asarray(params.scale, np.float64)[:, None])
    return found


def test_a_quantized_file_rounds_the_kernels_with_no_norm_gain_folded_in():
    """In a quantized file every kernel reaches the converter as an input,
    however small (these are 8-32 KB, below `INPUT_WEIGHT_BYTES`), so the
    converter folds no norm gain into one: each product's int8 weights
    are the rows of its Keras kernel rounded symmetrically (a NumPy
    reference), the key and value kernels, which the converter folds the
    attention norm's gain into when they are its constants, included
    (where the step fuses products that read one input, among the fused
    product's rows)."""
    import keras

    model = _model("llama")
    rng = np.random.default_rng(0)
    for block in model.backbone.transformer_layers:
        for norm in (block._self_attention_layernorm, block._feedforward_layernorm):
            # A trained model's gains: a few channels tens of times the rest.
            gain = rng.lognormal(0.0, 1.5, norm.scale.shape).astype("float32")
            norm.scale.assign(gain)
    found = _int8_products(_write(model, "weight_only_int8"))
    kernels = [
        (layer.path, _matrix(layer))
        for layer in model._flatten_layers()
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))
    ]
    assert len(kernels) == 2 * 7
    for path, w in kernels:
        step = np.abs(w).max(axis=1, keepdims=True) / 127.0
        expected = np.round(w / step) * step
        matches = [f for f in found if _holds(f, expected)]
        assert matches, f"{path}: no int8 product is its kernel rounded per row"


def _holds(product, rows):
    """Whether `rows` are consecutive rows of `product` (both `(out, in)`)."""
    n = rows.shape[0]
    return product.shape[1] == rows.shape[1] and any(
        np.allclose(product[o : o + n], rows, atol=1e-6)
        for o in range(product.shape[0] - n + 1)
    )


def _matrix(layer):
    """A `Dense`/`EinsumDense` kernel as `(out, in)` float64: the einsum's
    input axes are the ones its input shares with the kernel."""
    k = np.asarray(layer.kernel.numpy(), np.float64)
    inputs = [0]
    if hasattr(layer, "equation"):
        x, rest = layer.equation.split(",")
        inputs = [i for i, c in enumerate(rest.split("->")[0]) if c in x]
    outputs = [i for i in range(k.ndim) if i not in inputs]
    out = int(np.prod([k.shape[i] for i in outputs]))
    return np.transpose(k, outputs + inputs).reshape(out, -1)
