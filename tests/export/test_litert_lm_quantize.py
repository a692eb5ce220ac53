"""What a generative file's prefill returns, and its quantized weights.

- prefill signatures return their last row's logits by default, every row's
  with `prefill_logits="all"`: both against the model's full forward pass;
  the caches only with `prefill_logits="none"`, the last id through decode;
- `"int4"` (block-wise int4), `"weight_only_int8"` and `"dynamic"` files of
  a model trained on the sequence rule agree with it teacher-forced, their
  weights are what the flatbuffer says (int4 blocks read back against the
  Keras kernels), and their weight bytes shrink by the modes' factors;
- a tied head and its embedding table are one int8 table in the file;
- a model Keras quantized (`"int8"`, `"int4"`) is written with Keras'
  own integers (read back from the flatbuffer) and checked against the
  quantized model; `"float8"` is refused by name;
- bad options are refused by name, before anything is written;
- the check's runner (`litert.signatures`: LiteRT's `CompiledModel`, one
  in-memory XNNPACK weight cache for every signature) gives the float32
  and `"int4"` files' logits as LiteRT's `Interpreter` does, writes no
  cache file, and falls back to the interpreter where the installed
  ai-edge-litert has no such option or cannot compile the file;
- a weight-only int8 or float16 file, which XNNPACK would hold as float32
  per signature, is checked on LiteRT's built-in kernels, whose logits are
  XNNPACK's to float32 rounding; the export times its decode step on the
  decode signature alone, which computes what the whole file's does.
"""

import os
import sys

import keras
import numpy as np
import pytest

from kerasnorm.export import litert
from kerasnorm.export import to_litert_lm
from kerasnorm.export.litert import signatures
from kerasnorm.export.weights import int_weights as qweights
from tests.export import lm_models
from tests.support.once import once

pytestmark = pytest.mark.tf_only

schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
fu = pytest.importorskip("ai_edge_litert.tools.flatbuffer_utils")

CONTEXT = 24
PREFILLS = (4, 8)


def _trained():
    # Wide enough and trained long enough that int4's rounding keeps the
    # greedy token (a 32-wide model trained 300 steps loses a quarter).
    keras.utils.set_random_seed(0)
    return lm_models.train(lm_models.kerasnorm_decoder(width=64, layers=2), steps=600)


@pytest.fixture(scope="module")
def trained():
    return once("litert_lm_quantize.trained", _trained)


class _Files(dict):
    """A file per mode, exported (with the export's own check) when first
    asked for."""

    def __init__(self, model, directory):
        super().__init__()
        self.model, self.directory = model, directory

    def __missing__(self, mode):
        path = self.directory / f"{mode}.tflite"
        result = to_litert_lm(
            self.model,
            path,
            max_sequence_length=CONTEXT,
            prefill_lengths=PREFILLS,
            quantize=mode,
            verify_inputs=lm_models.rule_sequences(3, seed=5)[:, :6],
        )
        self[mode] = (path.read_bytes(), result)
        return self[mode]


@pytest.fixture(scope="module")
def files(trained, tmp_path_factory):
    return once(
        "litert_lm_quantize.files",
        lambda: _Files(trained, tmp_path_factory.mktemp("modes")),
    )


def _model(content):
    return fu.read_model_from_bytearray(bytearray(content))


def _builtin(model, op):
    return fu.get_builtin_code_from_operator_code(model.operatorCodes[op.opcodeIndex])


def _weight_bytes(content):
    """Bytes of the constants over 256 bytes: the weights."""
    model = _model(content)
    return sum(
        len(b.data) for b in model.buffers if b.data is not None and len(b.data) > 256
    )


def test_prefill_returns_the_last_row_or_every_row(trained, files, tmp_path):
    content, result = files[None]
    every = tmp_path / "all.tflite"
    to_litert_lm(
        trained,
        every,
        max_sequence_length=CONTEXT,
        prefill_lengths=PREFILLS,
        prefill_logits="all",
    )
    ids = lm_models.rule_sequences(1, seed=9)[0, :8].tolist()
    want = np.asarray(trained(np.asarray([ids], np.int32)))[0]
    scale = np.abs(want).max()
    last = litert.Generator(content)
    assert not last.all_rows
    details = last._runners["prefill_8"].get_output_details()["logits"]
    assert tuple(details["shape"]) == (1, 1, lm_models.VOCAB)
    np.testing.assert_allclose(
        last.call_signature("prefill_8", ids), want[-1:], atol=1e-4 * scale
    )
    full = litert.Generator(every.read_bytes())
    assert full.all_rows
    np.testing.assert_allclose(
        full.call_signature("prefill_8", ids), want, atol=1e-4 * scale
    )
    # A prompt shorter than its signature: the last id goes through decode.
    for generator in (last, full):
        np.testing.assert_allclose(
            generator.prefill(ids[:6])[-1], want[5], atol=1e-4 * scale
        )
    assert last.generate(ids[:5], 6) == full.generate(ids[:5], 6)
    # The head multiplies one row: the prefill's head is the decode's.
    assert result.check.agreement == 1.0


def test_prefills_can_return_the_caches_only(trained, files, tmp_path):
    """`prefill_logits="none"`: the prefills return the caches only, as
    litert-torch's do (LiteRT-LM reads logits from `decode`); the converter
    drops what only the logits read (the last layer's feed-forward, the
    final norm, the head), `Generator` feeds a prompt's last id through
    `decode`, and the file generates what the default file does."""
    content, _ = files[None]
    path = tmp_path / "none.tflite"
    result = to_litert_lm(
        trained,
        path,
        max_sequence_length=CONTEXT,
        prefill_lengths=PREFILLS,
        prefill_logits="none",
        verify_inputs=lm_models.rule_sequences(3, seed=5)[:, :6],
    )
    assert result.check.agreement == 1.0
    cache_only = litert.Generator(path.read_bytes())
    assert not cache_only.prefill_returns_logits and not cache_only.all_rows
    for key in ("prefill_4", "prefill_8"):
        outputs = cache_only._runners[key].get_output_details()
        assert "logits" not in outputs and len(outputs) == len(cache_only.cache_names)
    assert "logits" in cache_only._runners["decode"].get_output_details()
    last = litert.Generator(content)
    ids = lm_models.rule_sequences(1, seed=9)[0].tolist()
    want = np.asarray(trained(np.asarray([ids], np.int32)))[0]
    scale = np.abs(want).max()
    # Prompts that fill a prefill, that do not, and that span two chunks.
    for n in (4, 6, 8, 9, 13):
        np.testing.assert_allclose(
            cache_only.prefill(ids[:n])[-1], want[n - 1], atol=1e-4 * scale
        )
        assert cache_only.position == n
    assert cache_only.generate(ids[:8], 6) == last.generate(ids[:8], 6)
    assert cache_only.call_signature("prefill_8", ids[:8]) is None

    # The head and the last layer's feed-forward are gone from the prefills.
    def prefill_ops(data):
        model = _model(data)
        (sig,) = [s for s in model.signatureDefs if s.signatureKey == b"prefill_8"]
        ops = model.subgraphs[sig.subgraphIndex].operators
        return [_builtin(model, op) for op in ops]

    fewer, more = prefill_ops(path.read_bytes()), prefill_ops(content)
    assert len(fewer) < len(more)
    products = schema.BuiltinOperator.FULLY_CONNECTED
    assert fewer.count(products) < more.count(products)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("dynamic", marks=pytest.mark.slow),
        "int4",
        pytest.param("weight_only_int8", marks=pytest.mark.slow),
    ],
)
def test_quantized_files_agree_with_the_model(trained, files, mode):
    content, result = files[mode]
    assert result.quantize == mode
    assert result.check.agreement >= 0.9
    sequences = lm_models.rule_sequences(4, seed=11)[:, :16]
    agreement, perplexity = lm_models.teacher_forced(content, trained, sequences)
    _, float_perplexity = lm_models.teacher_forced(files[None][0], trained, sequences)
    assert agreement >= 0.9, agreement
    assert perplexity <= 1.5 * float_perplexity + 0.05, (perplexity, float_perplexity)


@pytest.mark.slow
def test_weight_bytes_shrink_by_the_modes_factors(files):
    # Each mode asked for by name: `files` makes a file when first asked, and
    # another test process may have made the others.
    modes = (None, "dynamic", "weight_only_int8", "int4")
    sizes = {mode: _weight_bytes(files[mode][0]) for mode in modes}
    # int8: a quarter of float32, plus scales; int4: an eighth plus one
    # float16 scale per 32 weights (the embedding table stays int8).
    assert sizes["dynamic"] <= 0.3 * sizes[None], sizes
    assert sizes["weight_only_int8"] <= 0.3 * sizes[None], sizes
    assert sizes["int4"] <= 0.8 * sizes["dynamic"], sizes
    assert files["int4"][1].size_bytes < files["dynamic"][1].size_bytes
    assert files["dynamic"][1].size_bytes < files[None][1].size_bytes


def test_int4_weights_are_blockwise_int4_of_the_kernels(trained, files):
    model = _model(files["int4"][0])
    subgraph = model.subgraphs[0]
    kernels = []
    for w in trained.weights:
        if w.path.endswith("kernel") and len(w.shape) >= 2:
            # (input, output) of each product, einsum kernels flattened.
            k = np.asarray(w)
            kernels += [k.reshape(k.shape[0], -1).T, k.reshape(-1, k.shape[-1]).T]
    # The converter folds a norm's gain into the product after it.
    gains = [np.asarray(w) for w in trained.weights if w.path.endswith("gamma")]
    kernels += [k * g[None] for k in kernels for g in gains if g.shape[0] == k.shape[1]]
    found = 0
    for op in subgraph.operators:
        if _builtin(model, op) != schema.BuiltinOperator.FULLY_CONNECTED:
            continue
        tensor = subgraph.tensors[op.inputs[1]]
        assert tensor.type == schema.TensorType.INT4
        q = tensor.quantization
        assert q.detailsType == schema.QuantizationDetails.BlockwiseQuantization
        assert q.details.blockSize == 32
        scales_tensor = subgraph.tensors[q.details.scales]
        assert scales_tensor.type == schema.TensorType.FLOAT16
        rows, cols = tensor.shape
        assert tuple(scales_tensor.shape) == (rows, cols // 32)
        scales = np.asarray(model.buffers[scales_tensor.buffer].data).view(np.float16)
        values = qweights.unpack_int4(model.buffers[tensor.buffer].data, rows * cols)
        assert values.min() >= -8 and values.max() <= 7
        dequantized = (
            values.reshape(rows, cols // 32, 32).astype(np.float32)
            * scales.reshape(rows, cols // 32, 1).astype(np.float32)
        ).reshape(rows, cols)
        # The Keras kernel of that shape it rounds, at the stored scales.
        steps = np.repeat(scales.reshape(rows, -1).astype(np.float32), 32, axis=1)
        matches = [
            k
            for k in kernels
            if k.shape == (rows, cols)
            and np.array_equal(
                np.clip(np.rint(k / steps), -8, 7), values.reshape(rows, cols)
            )
        ]
        assert len(matches) >= 1, tensor.name
        assert np.abs(dequantized - matches[0]).mean() < 0.1 * np.abs(matches[0]).mean()
        found += 1
    # q, k, v, o and the three feed-forward products of two blocks; the head.
    assert found >= 2 * 6 + 1


@pytest.mark.slow
def test_block_128(tmp_path):
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative

    keras.utils.set_random_seed(0)
    wide = lm_models.kerasnorm_decoder(width=128, layers=1)
    content = write_generative(
        cached_model(wide),
        prefill_lengths=(4,),
        max_sequence_length=8,
        quantize="int4",
        int4_block_size=128,
    )
    model = _model(content)
    subgraph = model.subgraphs[0]
    blocks = {
        subgraph.tensors[op.inputs[1]].quantization.details.blockSize
        for op in subgraph.operators
        if _builtin(model, op) == schema.BuiltinOperator.FULLY_CONNECTED
    }
    assert blocks == {128}
    ids = [3, 5, 8, 13]
    want = np.asarray(wide(np.asarray([ids], np.int32)))[0, -1]
    got = litert.Generator(content).call_signature("prefill", ids)[-1]
    assert np.abs(got - want).max() <= 0.3 * np.abs(want).max()


@pytest.mark.parametrize(
    "family", ["llama", pytest.param("gemma", marks=pytest.mark.slow)]
)
def test_a_tied_table_is_stored_once_in_each_mode(tmp_path, family):
    """Llama with tied embeddings, and Gemma (its lookup scaled by
    sqrt(hidden) after the table): the lookup and the head read one table,
    float32, int8 rows (dynamic, weight-only) or int4 blocks (int4)."""
    keras_hub = pytest.importorskip("keras_hub")
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative

    keras.utils.set_random_seed(0)
    vocab, hidden = 1024, 32
    # The fused gate/up kernel (32, 2 * 32), float32, under the int4
    # table's bytes.
    shape = dict(
        vocabulary_size=vocab,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=hidden,
        intermediate_dim=32,
    )
    if family == "gemma":
        backbone = keras_hub.models.GemmaBackbone(**shape, head_dim=16)
        lm = keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.LlamaBackbone(**shape, tie_word_embeddings=True)
        lm = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    table = np.asarray(backbone.token_embedding.embeddings)
    ids = [5, 300, 17, 2]
    inputs = {"token_ids": np.asarray([ids]), "padding_mask": np.ones((1, 4))}
    ref = np.asarray(lm(inputs))[0, -1]
    table_bytes = {
        None: vocab * hidden * 4,
        "dynamic": vocab * hidden,
        "weight_only_int8": vocab * hidden,
        "int4": vocab * hidden // 2,
    }
    sizes = {}
    for mode, size in table_bytes.items():
        content = write_generative(
            cached_model(lm), prefill_lengths=(4,), max_sequence_length=8, quantize=mode
        )
        sizes[mode] = len(content)
        model = _model(content)
        big = [
            i
            for i, b in enumerate(model.buffers)
            if b.data is not None and len(b.data) >= vocab * hidden // 2
        ]
        assert [len(model.buffers[i].data) for i in big] == [size], mode
        readers = set()
        for subgraph in model.subgraphs:
            for op in subgraph.operators:
                for i in op.inputs:
                    if i >= 0 and subgraph.tensors[i].buffer == big[0]:
                        readers.add(_builtin(model, op))
        # weight-only: the head's int8 table goes through DEQUANTIZE first.
        head = (
            schema.BuiltinOperator.DEQUANTIZE
            if mode == "weight_only_int8"
            else schema.BuiltinOperator.FULLY_CONNECTED
        )
        assert readers == {schema.BuiltinOperator.GATHER, head}, mode
        data = np.asarray(model.buffers[big[0]].data)
        if mode in ("dynamic", "weight_only_int8"):
            np.testing.assert_array_equal(
                data.view(np.int8).reshape(vocab, hidden), qweights.int8_rows(table)[0]
            )
        if mode == "int4":
            np.testing.assert_array_equal(
                qweights.unpack_int4(data, vocab * hidden).reshape(vocab, hidden),
                qweights.int4_blocks(table, 32)[0],
            )
        # The file's logits against the model's, through lookup and head.
        got = litert.Generator(content).call_signature("prefill", ids)[-1]
        tolerance = {None: 1e-4, "int4": 0.3}.get(mode, 0.05)
        assert np.abs(got - ref).max() <= tolerance * np.abs(ref).max(), mode
    assert sizes["int4"] < sizes["dynamic"] < sizes[None]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_an_int4_lookup_reads_the_tables_float16_scales(tmp_path, tied):
    """The int4 lookup gathers from the table's float16 block scales,
    dequantized once (a constant's DEQUANTIZE), the buffer a tied head
    reads: no float32 copy of the scales, and no buffer no tensor reads
    (an untied table's float16 scales were such a buffer, beside a float32
    copy: 1.5 MB of a 32000 x 256 table's 11.9 MB file)."""
    keras_hub = pytest.importorskip("keras_hub")
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative

    keras.utils.set_random_seed(0)
    vocab, hidden = 1024, 64
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=vocab,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=hidden,
        intermediate_dim=64,
        tie_word_embeddings=tied,
    )
    lm = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    ids = [5, 300, 17, 2]
    inputs = {"token_ids": np.asarray([ids]), "padding_mask": np.ones((1, 4))}
    ref = np.asarray(lm(inputs))[0, -1]
    content = write_generative(
        cached_model(lm), prefill_lengths=(4,), max_sequence_length=8, quantize="int4"
    )
    model = _model(content)
    read = {t.buffer for g in model.subgraphs for t in g.tensors}
    unread = [
        i
        for i, b in enumerate(model.buffers)
        if b.data is not None and len(b.data) > 64 and i not in read
    ]
    assert not unread, [len(model.buffers[i].data) for i in unread]
    scale_bytes = vocab * (hidden // 32) * 2
    for subgraph in model.subgraphs:
        gathers = [
            op
            for op in subgraph.operators
            if _builtin(model, op) == schema.BuiltinOperator.GATHER
        ]
        tables = sorted(subgraph.tensors[op.inputs[0]].type for op in gathers)
        assert tables == sorted([schema.TensorType.INT4, schema.TensorType.FLOAT32])
        (scales,) = [
            op.inputs[0]
            for op in gathers
            if subgraph.tensors[op.inputs[0]].type == schema.TensorType.FLOAT32
        ]
        (dequantize,) = [op for op in subgraph.operators if scales in op.outputs]
        assert _builtin(model, dequantize) == schema.BuiltinOperator.DEQUANTIZE
        stored = subgraph.tensors[dequantize.inputs[0]]
        assert stored.type == schema.TensorType.FLOAT16
        assert len(model.buffers[stored.buffer].data) == scale_bytes
    got = litert.Generator(content).call_signature("prefill", ids)[-1]
    assert np.abs(got - ref).max() <= 0.3 * np.abs(ref).max()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "int3"}, r"`quantize` is one of .*Received: quantize='int3'"),
        ({"quantize": "int4", "int4_block_size": 48}, "int4_block_size=48"),
        ({"quantize": "int4", "int4_block_size": True}, "int4_block_size=True"),
        (
            {"quantize": "dynamic", "int4_block_size": 32},
            "means nothing with quantize='dynamic'",
        ),
        ({"prefill_logits": "first"}, "prefill_logits='first'"),
    ],
)
def test_bad_options_are_refused_by_name(tmp_path, options, message):
    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(width=16, layers=1)
    with pytest.raises(ValueError, match=message):
        to_litert_lm(model, tmp_path / "a.tflite", max_sequence_length=8, **options)
    assert not os.listdir(tmp_path)


def _small_llama(seed=0):
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=1024,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=64,
        intermediate_dim=128,
    )
    return keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)


def test_a_keras_int8_model_is_written_with_its_integers(tmp_path):
    """`model.quantize("int8")`: the file holds Keras' own int8 kernels
    (read back from the flatbuffer), checked against the quantized model."""
    lm = _small_llama()
    options = dict(max_sequence_length=16, prefill_lengths=(4,))
    float_file = to_litert_lm(lm, tmp_path / "f.tflite", **options)
    lm.quantize("int8")
    result = to_litert_lm(lm, tmp_path / "q.tflite", **options)
    assert result.quantize == "dynamic"
    assert result.size_bytes <= 0.45 * float_file.size_bytes
    assert result.check.agreement >= 0.9
    model = _model((tmp_path / "q.tflite").read_bytes())
    stored = [
        np.asarray(b.data).view(np.int8)
        for b in model.buffers
        if b.data is not None and len(b.data) > 256
    ]
    checked = 0
    for layer in lm._flatten_layers():
        if getattr(layer, "quantization_mode", None) != "int8":
            continue
        kernel = getattr(layer, "_kernel", None)
        k = np.asarray(layer._embeddings if kernel is None else kernel)
        # (input, output) products stored (output, input); tables as they are.
        candidates = (
            [k.reshape(k.shape[0], -1).T.ravel(), k.reshape(-1, k.shape[-1]).T.ravel()]
            if kernel is not None
            else [k.ravel()]
        )
        assert any(
            any(d.size == c.size and np.array_equal(d, c) for c in candidates)
            for d in stored
        ), layer.name
        checked += 1
    assert checked == 8  # q, k, v, o, three feed-forward, the table


@pytest.fixture(scope="module")
def float_llama_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("float") / "f.tflite"
    return to_litert_lm(_small_llama(), path, max_sequence_length=16).size_bytes


def _bfloat16(x):
    bits = np.asarray(x, np.float32).view(np.uint32)
    bits = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    return (bits & np.uint32(0xFFFF0000)).view(np.float32)


def _keras_int4(layer):
    """Keras' int4 integers `(out, in)` of `layer` and each output row's
    multiplier (every input of these layers is in one Keras block), read
    from its variables: [(integers, scales)] (a table and an untied
    head)."""
    from keras import quantizers

    def unpack(packed, count, axis):
        return np.asarray(quantizers.unpack_int4(packed, count, axis=axis))

    per_channel = getattr(layer, "_int4_block_size", None) in (None, -1)

    def scale(s, axis):
        s = np.asarray(s, np.float32)
        return (
            1.0 / s.reshape(-1) if per_channel else s.reshape(s.shape[axis], -1)[:, 0]
        )

    if isinstance(layer, keras.layers.Embedding):
        dim = layer.output_dim
        found = [(unpack(layer._embeddings, dim, -1), scale(layer.embeddings_scale, 0))]
        if not layer.tie_weights:
            q = unpack(layer.reverse_embeddings, dim, 0).T
            found.append((q, scale(np.asarray(layer.reverse_embeddings_scale).T, 0)))
        return found
    columns = getattr(layer, "_int4_unpacked_column_size", getattr(layer, "units", 0))
    q = unpack(layer._kernel, columns, -1)
    q = q.reshape(-1, columns).T
    return [(q, scale(np.asarray(layer.kernel_scale).T, 0))]


@pytest.mark.parametrize("block_size", [128, None], ids=["blocks", "per_channel"])
def test_a_keras_int4_model_is_written_with_its_integers(
    tmp_path, float_llama_bytes, block_size
):
    """`model.quantize("int4")` (Keras' default: blocks of 128 with zero
    points; or one scale per channel): the file's int4 tensors are Keras'
    integers, their scales Keras' (in bfloat16), the file 0.30x the float32
    one at most, and it agrees with the quantized model."""
    from keras import quantizers

    lm = _small_llama()
    lm.quantize("int4", config=quantizers.Int4QuantizationConfig(block_size=block_size))
    result = to_litert_lm(lm, tmp_path / "q.tflite", max_sequence_length=16)
    assert result.quantize == "int4"
    # The embedding table and the untied head are 2 x 1024 x 64 of the
    # ~170 k weights; both int4 too.
    assert result.size_bytes <= 0.30 * float_llama_bytes, result.size_bytes
    # Against the Keras int4 model: the same integers, the file's
    # activations int8 per call (re-quantizing the float model's kernels
    # misses by several times more).
    assert result.check.agreement == 1.0
    assert result.check.rms_error <= 0.02, result.check
    model = _model((tmp_path / "q.tflite").read_bytes())
    stored = []
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            data = model.buffers[tensor.buffer].data
            if tensor.type == schema.TensorType.INT4 and data is not None:
                rows, cols = tensor.shape
                values = qweights.unpack_int4(data, rows * cols).reshape(rows, cols)
                details = tensor.quantization.details
                scales = getattr(details, "scales", None)
                if scales is not None:
                    scales = subgraph.tensors[scales]
                    scales = np.asarray(model.buffers[scales.buffer].data)
                    scales = scales.view(np.float16).reshape(rows, -1)
                stored.append((values, scales))
            elif tensor.type == schema.TensorType.FLOAT16 and data is not None:
                # A lookup's int4 table has its scales in a float16 table
                # (dequantized by an op of its own).
                if len(tensor.shape) == 2 and tensor.shape[0] >= 1024:
                    stored.append((None, np.asarray(data).view(np.float16)))
    checked = 0
    for layer in lm._flatten_layers():
        if getattr(layer, "quantization_mode", None) != "int4":
            continue
        for q, scale in _keras_int4(layer):
            matches = [
                s
                for v, s in stored
                if v is not None and v.shape == q.shape and np.array_equal(v, q)
            ]
            assert matches, layer.name
            # Blocks of 64 (the input), each its Keras block's scale; a
            # lookup's table, its float16 scales.
            scales = [s for s in matches if s is not None]
            scales += [s for v, s in stored if v is None and s.size == len(scale)]
            want = _bfloat16(scale)
            assert any(
                np.array_equal(s.astype(np.float32).reshape(len(want), -1)[:, 0], want)
                for s in scales
            ), layer.name
            checked += 1
    assert checked == 9  # q, k, v, o, three feed-forward, the table, the head


def test_a_keras_int4_block_no_file_block_fits_is_refused(tmp_path):
    from keras import quantizers

    lm = _small_llama()
    lm.quantize("int4", config=quantizers.Int4QuantizationConfig(block_size=48))
    with pytest.raises(ValueError, match="holds Keras int4 blocks of 48"):
        to_litert_lm(lm, tmp_path / "q.tflite", max_sequence_length=8)
    assert not os.listdir(tmp_path)


def test_a_keras_float8_model_is_refused_by_name(tmp_path):
    lm = _small_llama()
    lm.quantize("float8")
    with pytest.raises(ValueError, match="quantized by Keras to 'float8'"):
        to_litert_lm(lm, tmp_path / "q.tflite", max_sequence_length=8)
    assert not os.listdir(tmp_path)


def _interpreter_logits(content, prompt, tokens):
    """The reference: LiteRT's `Interpreter` called signature by signature
    (prefill of 8 on the padded prompt, then decode), caches carried."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=content)
    interp.allocate_tensors()
    prefill = interp.get_signature_runner("prefill_8")
    decode = interp.get_signature_runner("decode")
    caches = {
        name: np.zeros(d["shape"], np.float32)
        for name, d in decode.get_input_details().items()
        if name.startswith("kv_cache_")
    }
    padded = np.zeros((1, 8), np.int32)
    padded[0, : len(prompt)] = prompt
    out = prefill(tokens=padded, input_pos=np.arange(8, dtype=np.int32), **caches)
    rows = []
    for position, token in enumerate(tokens, start=len(prompt)):
        caches = {name: out[name] for name in caches}
        out = decode(
            tokens=np.array([[token]], np.int32),
            input_pos=np.array([position], np.int32),
            **caches,
        )
        rows.append(out["logits"][0, 0])
    return np.stack(rows)


def _generator_logits(content, prompt, tokens, delegated=True):
    """The Generator's logits of `tokens[1:]` after `prompt`, and the
    runner of its decode signature."""
    generator = litert.Generator(content, delegated=delegated)
    # A 7-id prompt goes through prefill_8, its last id through decode.
    generator.prefill([*prompt, tokens[0]])
    rows = np.stack([generator.decode(t) for t in tokens[1:]])
    return rows, generator._runners["decode"]


PROMPT = [3, 1, 4, 1, 5, 9]
TOKENS = [2, 6, 5, 3, 5]


@pytest.mark.parametrize("mode", [None, "int4"])
def test_compiled_signatures_give_the_interpreters_logits(
    files, mode, tmp_path, monkeypatch
):
    if not signatures.shared_cache_available():
        pytest.skip("this ai-edge-litert has no XNNPACK weight cache option")
    monkeypatch.chdir(tmp_path)  # where a mistaken cache file would land
    want = _interpreter_logits(files[mode][0], PROMPT, TOKENS)[1:]
    got, runner = _generator_logits(files[mode][0], PROMPT, TOKENS)
    assert type(runner).__name__ == "_CompiledRunner"
    # XNNPACK both ways: the same kernels, the same logits.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("missing", ["module", "option", "compile"])
def test_the_interpreter_runs_where_the_compiled_model_cannot(
    files, missing, monkeypatch
):
    content = files["int4"][0]
    want = _interpreter_logits(content, PROMPT, TOKENS)[1:]
    if missing == "module":  # ai-edge-litert 1.x and 2.0: no options module
        monkeypatch.setitem(sys.modules, "ai_edge_litert.options", None)
    elif missing == "option":  # CpuOptions without the cache path
        monkeypatch.setattr(signatures.dataclasses, "fields", lambda cls: ())
    else:
        pytest.importorskip("ai_edge_litert.options")
        from ai_edge_litert.compiled_model import CompiledModel

        def refuse(*args, **kwargs):
            raise RuntimeError("CompiledModel error: code=3")

        monkeypatch.setattr(CompiledModel, "from_buffer", refuse)
    assert missing == "compile" or not signatures.shared_cache_available()
    got, runner = _generator_logits(content, PROMPT, TOKENS)
    assert type(runner).__name__ == "SignatureRunner"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", [None, "int4"])
def test_the_main_graph_is_delegated_alone_and_counted_the_same(files, mode):
    """`delegation` names the prefills' subgraphs as validation subgraphs,
    which the interpreter leaves undelegated (one packed copy of the
    weights): the decode step's split is the one the file itself gives."""
    from kerasnorm._compat import interpreter_ops
    from kerasnorm.export.litert.runner import interpreter
    from kerasnorm.export.verify import delegation

    content = files[mode][0]
    renamed = delegation._main_graph_delegated(content)
    names = [s.name for s in _model(renamed).subgraphs]
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    assert names[0] == "decode"
    assert sorted(names[1:]) == ["VALIDATION:prefill_4", "VALIDATION:prefill_8"]
    want = delegation._split(interpreter_ops(interpreter(content)))
    assert delegation.delegation(content) == want
    assert want.partitions >= 1 and want.delegated_ops > 0


@pytest.mark.parametrize("mode", [None, "weight_only_int8"])
def test_the_built_in_kernels_give_xnnpacks_logits(files, mode):
    content = files[mode][0]
    want = _interpreter_logits(content, PROMPT, TOKENS)[1:]
    got, runner = _generator_logits(content, PROMPT, TOKENS, delegated=False)
    assert type(runner).__name__ == "SignatureRunner"
    # Other kernels, other summation orders: float32 rounding apart.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(
    "mode, delegated", [("weight_only_int8", False), ("dynamic", True), (None, True)]
)
def test_the_check_runs_unpacked_weights_on_the_built_in_kernels(
    trained, files, mode, delegated, monkeypatch
):
    from kerasnorm.export.litert_lm import check
    from kerasnorm.export.options.generative_modes import GENERATIVE_MODES

    assert GENERATIVE_MODES[mode].unpacked == (not delegated)
    made = []

    def recorded(content, adapter=None, delegated=True):
        made.append(delegated)
        return litert.Generator(content, adapter, delegated)

    monkeypatch.setattr(check, "Generator", recorded)
    prompts = lm_models.rule_sequences(2, seed=5)[:, :6].tolist()
    result = check.check_generation(trained, files[mode][0], prompts, quantize=mode)
    assert made and set(made) == {delegated}
    assert result.agreement >= GENERATIVE_MODES[mode].min_agreement


def test_unpacked_modes_are_those_xnnpack_dequantizes():
    from kerasnorm.export.options.generative_modes import GENERATIVE_MODES

    unpacked = {name for name, mode in GENERATIVE_MODES.items() if mode.unpacked}
    assert unpacked == {"float16", "weight_only_int8"}


@pytest.mark.parametrize("mode", [None, "weight_only_int8"])
def test_the_decode_signature_alone_computes_the_files_decode(files, mode):
    from kerasnorm.export.litert_lm.decode_report import decode_only

    content, result = files[mode]
    alone = decode_only(content)
    model = _model(alone)
    keys = [d.signatureKey for d in model.signatureDefs]
    assert [k.decode() if isinstance(k, bytes) else k for k in keys] == ["decode"]
    assert len(model.subgraphs) == 1 and len(alone) <= len(content)
    assert decode_only(alone) is alone  # one signature: nothing to take out
    rows = []
    for each in (content, alone):
        generator = litert.Generator(each)
        # One id: through decode in both files (the prefills take 4 or 8).
        generator.prefill(PROMPT[:1])
        rows.append(np.stack([generator.decode(t) for t in TOKENS]))
    alone_generator = litert.Generator(alone)
    assert alone_generator.prefill_lengths == {}
    # One signature: one interpreter, no weight cache with nothing to share.
    assert type(alone_generator._runners["decode"]).__name__ == "SignatureRunner"
    np.testing.assert_allclose(
        rows[1], rows[0], rtol=0, atol=1e-6 * np.abs(rows[0]).max()
    )
    assert result.decode_ms > 0


def test_the_decode_signature_alone_is_refused_without_one(files):
    from kerasnorm.export.litert_lm.decode_report import decode_only

    content = files[None][0]
    model = _model(content)
    for d in model.signatureDefs:
        if d.signatureKey in (b"decode", "decode"):
            d.signatureKey = "step"
    renamed = bytes(fu.convert_object_to_bytearray(model))
    with pytest.raises(ValueError, match="no decode signature"):
        decode_only(renamed)
