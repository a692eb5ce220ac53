"""Embedding bundles (`to_litert_embedder`) run by LiteRT-LM's
`EmbeddingEngine`.

Small keras-hub TextEmbedders with their own tokenizers
(`embedder_models`) are written with three lengths; every length's
signature, and the engine on texts that pick each length, must give the
Keras embedder's embedding of the same tokens (cosine similarity >= 0.9999
in float32, >= 0.99 quantized); a text longer than the largest length is
refused, truncated, or chunked and averaged as the engine's overflow
strategy says, each compared with the Keras embedder on the tokens that
strategy keeps. The default tier runs Gemma3 (EmbeddingGemma's pooling and
projection) in float32; the other families and modes are slow. An "int4"
bundle keeps each attention's value and output products at int8
(`EmbedderExport.int8_products`); a model whose int4 file misses the bound
(weights with outliers) is refused.
"""

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")
pytest.importorskip("sentencepiece")
pytest.importorskip("litert_lm_builder")

from kerasnorm._compat import sublayers  # noqa: E402
from kerasnorm.export import to_litert_embedder  # noqa: E402
from kerasnorm.export import to_litert_lm  # noqa: E402
from kerasnorm.export.litert_lm.embedding_bundle import embed_in_engine  # noqa: E402
from kerasnorm.export.litert_lm.embedding_bundle import read_embedding_bundle  # noqa: E402
from kerasnorm.export.litert_lm.embedding_graph import cosine  # noqa: E402
from kerasnorm.export.litert_lm.embedding_graph import file_embeddings  # noqa: E402
from kerasnorm.export.litert_lm.embedding_graph import keras_embeddings  # noqa: E402
from kerasnorm.export.litert_lm.embedding_graph import pack  # noqa: E402
from kerasnorm.export.litert_lm.embedding_graph import special_tokens  # noqa: E402
from kerasnorm.export.litert_lm.engine import engine_installed  # noqa: E402
from kerasnorm.export.litert_lm.prompts import CALIBRATION_TEXTS  # noqa: E402
from kerasnorm.export.numerics.errors import ExportVerificationError  # noqa: E402
from tests.export import embedder_models  # noqa: E402

# Export writes TFLite files: TensorFlow only (skipped on the JAX pass).
pytestmark = pytest.mark.tf_only

LENGTHS = (8, 16, 32)
WORDS = "the quick brown fox jumps over the lazy dog ."


def _ids(embedder, text):
    ids = embedder.preprocessor.tokenizer(text)
    return [int(i) for i in np.asarray(ids).reshape(-1)]


def _keras(embedder, rows, length):
    pad = special_tokens(embedder.preprocessor.tokenizer)[2]
    return keras_embeddings(embedder, rows, length, pad)


def _texts_per_length(embedder, bos, eos):
    """A text whose packed tokens pick each length's signature (more than
    the length below, at most its own), built from repeated words."""
    texts = {}
    for below, length in zip((0, *LENGTHS), LENGTHS, strict=False):
        for n in range(1, 60):
            text = " ".join([WORDS] * 4).split()[:n]
            text = " ".join(text)
            size = len(pack(_ids(embedder, text), 10**6, bos, eos))
            if below < size <= length:
                texts[length] = text
                break
    assert sorted(texts) == list(LENGTHS), texts
    return texts


def _to_engine(embedder, sections):
    """Keras id -> the engine's (its SentencePiece model's, which keras-hub's
    XLM-RoBERTa tokenizer renumbers: read here piece by piece)."""
    tokenizer = embedder.preprocessor.tokenizer
    if type(tokenizer).__name__ != "XLMRobertaTokenizer":
        return lambda t: t
    import sentencepiece as spm

    model = spm.SentencePieceProcessor(model_proto=sections["tokenizer"])
    table = {tokenizer.token_to_id(model.id_to_piece(i)): i for i in range(len(model))}
    return table.__getitem__


def _check_bundle(embedder, path, result, bound):
    bos, eos, _ = special_tokens(embedder.preprocessor.tokenizer)
    sections = read_embedding_bundle(path)
    to_engine = _to_engine(embedder, sections)
    metadata = sections["metadata"]
    assert metadata.embedding_model_type.WhichOneof("model_type") == "generic_model"
    assert metadata.min_input_length == LENGTHS[0]
    assert metadata.max_input_length == LENGTHS[-1]
    assert list(metadata.eos_token.token_ids.ids) == [to_engine(eos)]
    assert list(metadata.bos_token.token_ids.ids) == (
        [] if bos is None else [to_engine(bos)]
    )
    assert result.signatures == {f"encoder_{t}": t for t in LENGTHS}
    assert all(c >= bound for c in result.cosines.values()), result.cosines

    # The file's signatures, against Keras on sentences cut to each length.
    rows = [_ids(embedder, t) for t in ("Mars is red.", "How far is Venus?")]
    for length in LENGTHS:
        packed = [pack(r, length, bos, eos) for r in rows]
        fed = [[to_engine(t) for t in row] for row in packed]
        got = file_embeddings(sections["encoder"], fed, length)
        assert np.min(cosine(got, _keras(embedder, packed, length))) >= bound

    if not engine_installed():
        return
    assert result.engine_cosine >= bound
    # The engine picks each length's signature with its own tokenizer.
    texts = _texts_per_length(embedder, bos, eos)
    answers = embed_in_engine(path, list(texts.values()))
    for (length, text), answer in zip(texts.items(), answers, strict=True):
        row = [pack(_ids(embedder, text), length, bos, eos)]
        assert cosine(answer[None], _keras(embedder, row, length))[0] >= bound, length

    # Longer than the largest length, under each overflow strategy.
    longest = LENGTHS[-1]
    text = " ".join([WORDS] * 8)
    tokens = pack(_ids(embedder, text), 10**6, bos, eos)
    assert len(tokens) > longest
    error, truncated, chunked = (
        embed_in_engine(path, [text], s)[0]
        for s in ("ERROR", "TRUNCATE", "CHUNK_AND_AVERAGE")
    )
    assert isinstance(error, str)
    cut = [pack(_ids(embedder, text), longest, bos, eos)]
    assert cosine(truncated[None], _keras(embedder, cut, longest))[0] >= bound
    chunks = [tokens[i : i + longest] for i in range(0, len(tokens), longest)]
    mean = _keras(embedder, chunks, longest).mean(axis=0, keepdims=True)
    assert cosine(chunked[None], mean)[0] >= bound
    # The strategies differ: truncation drops what chunking averages in.
    assert cosine(truncated[None], chunked[None])[0] < 0.99999


def _export(family, tmp_path, quantize=None):
    embedder = embedder_models.text_embedder(
        family, embedder_models.directory_for(tmp_path)
    )
    path = tmp_path / f"{family}.litertlm"
    result = to_litert_embedder(
        embedder, path, sequence_lengths=LENGTHS, quantize=quantize
    )
    return embedder, path, result


def test_gemma3_embedder_bundle_matches_keras_at_every_length(tmp_path):
    embedder, path, result = _export("gemma3", tmp_path)
    assert result.embedding_dim == 32
    _check_bundle(embedder, path, result, 0.9999)


# CI's slow tier runs each family in one mode, each mode at least once
# (`CI`); the other cells are `exhaustive`.
CI = {
    ("gemma3", "int4"),
    ("qwen3", None),
    ("bert", "dynamic"),
    ("xlm_roberta", "dynamic"),
}
MATRIX = [
    pytest.param(
        family,
        quantize,
        marks=() if (family, quantize) in CI else (pytest.mark.exhaustive,),
    )
    for family in ("gemma3", "qwen3", "bert", "xlm_roberta")
    for quantize in (None, "dynamic", "int4")
]
# The layers an "int4" bundle holds at int8 per channel: each attention's
# value and output, and the layers of equal weights (these untrained
# models initialize key as value, and Qwen3's query as its output).
INT8_LAYERS = {
    "gemma3": ("attention_output", "value", "key"),
    "qwen3": ("attention_output", "query", "value", "key"),
    "bert": ("attention_output", "value"),
    "xlm_roberta": ("attention_output", "value"),
}


@pytest.mark.slow
@pytest.mark.parametrize("family, quantize", MATRIX)
def test_embedder_bundle_matrix(family, quantize, tmp_path):
    embedder, path, result = _export(family, tmp_path, quantize)
    _check_bundle(embedder, path, result, 0.9999 if quantize is None else 0.99)
    if quantize == "int4":
        # GPTQ fitted every int4 product to held-out text in the embedder's
        # own tokenizer, cut to the largest length: one row per token of
        # CALIBRATION_TEXTS (twice where two products share weights), one
        # per piece after the pooling, none of the check's sentences.
        bos, eos, _ = special_tokens(embedder.preprocessor.tokenizer)
        sizes = [
            len(pack(_ids(embedder, t), 10**9, bos, eos)) for t in CALIBRATION_TEXTS
        ]
        pieces = sum(-(-n // LENGTHS[-1]) for n in sizes)
        assert result.int4_gptq and all(r.gptq for r in result.int4_gptq)
        rows = {
            r.rows if r.rows == pieces else r.rows % sum(sizes)
            for r in result.int4_gptq
        }
        assert rows <= {0, pieces} and 0 in rows, result.int4_gptq
        # Each layer's value and output products at int8, in both layers,
        # and none of them rounded to int4.
        names = sorted(p.rsplit("/", 1)[-1] for p in result.int8_products)
        assert names == sorted(INT8_LAYERS[family] * 2), result.int8_products
        assert len(result.int4_gptq) > len(INT8_LAYERS[family])
    else:
        assert result.int8_products == ()
    if quantize is not None:
        float_size = to_litert_embedder(
            embedder, tmp_path / "f.litertlm", sequence_lengths=LENGTHS, engine=False
        ).size_bytes
        assert result.size_bytes < float_size


def _with_outliers(embedder):
    """`embedder` with one weight in 37 of every kernel 40 times larger:
    the int4 blocks' scale grows with their outlier, and their other
    weights round to a few steps (or zero)."""
    kernels = {}
    for layer in sublayers(embedder.backbone, recursive=True):
        kernel = getattr(layer, "kernel", None)
        if kernel is not None and len(kernel.shape) >= 2:
            kernels[id(kernel)] = kernel
    for kernel in kernels.values():
        values = np.array(kernel.numpy())
        values.reshape(-1)[::37] *= 40.0
        kernel.assign(values)
    return embedder


@pytest.mark.slow
def test_a_file_below_the_bound_is_refused_and_not_written(tmp_path):
    embedder = _with_outliers(
        embedder_models.text_embedder("gemma3", embedder_models.directory_for(tmp_path))
    )
    path = tmp_path / "g.litertlm"
    # Its int4 file embeds at cosine ~0.95 of Keras: refused, nothing written.
    with pytest.raises(ExportVerificationError, match=r"cosine similarity 0\.9[0-8]"):
        to_litert_embedder(embedder, path, sequence_lengths=(8,), quantize="int4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]
    # Its int8 weights hold the bound: the int4 rounding lost it.
    result = to_litert_embedder(
        embedder, path, sequence_lengths=(8,), quantize="dynamic", engine=False
    )
    assert result.cosines[8] >= 0.99


@pytest.mark.slow
def test_to_litert_lm_writes_a_text_embedder(tmp_path):
    embedder = embedder_models.text_embedder(
        "bert", embedder_models.directory_for(tmp_path)
    )
    # The default lengths (64, 256, 512) capped at BERT's 64 positions.
    result = to_litert_lm(embedder, tmp_path / "b.litertlm")
    assert result.signatures == {"encoder_64": 64}
    del result


# --- refusals (no conversion) -------------------------------------------------


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("embedder")
    return embedder_models.text_embedder("qwen3", str(tmp))


def test_refuses_what_is_not_a_text_embedder(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(TypeError, match=r"TextEmbedder.*Received: Sequential"):
        to_litert_embedder(model, tmp_path / "x.litertlm")


def test_refuses_an_embedder_that_keeps_every_token(qwen3, tmp_path):
    backbone = qwen3.backbone
    per_token = keras_hub.models.TextEmbedder(
        inputs=backbone.input, outputs=backbone.output, name="per_token"
    )
    with pytest.raises(ValueError, match=r"'per_token' outputs .*one vector"):
        to_litert_embedder(per_token, tmp_path / "x.litertlm")
    assert not (tmp_path / "x.litertlm").exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sequence_lengths": (8, 8)}, "sequence_lengths"),
        ({"sequence_lengths": 1}, "sequence_lengths"),
        ({"sequence_lengths": (8, 10**6)}, "positions for"),
        ({"quantize": "int8"}, "quantize"),
        ({"quantize": None, "int4_block_size": 64}, "int4_block_size"),
        ({"verify_texts": [""]}, "verify_texts"),
    ],
)
def test_refuses_bad_options_by_name(qwen3, tmp_path, kwargs, match):
    if kwargs.get("sequence_lengths") == (8, 10**6):
        qwen3 = embedder_models.text_embedder("bert", str(tmp_path))
    with pytest.raises(ValueError, match=match):
        to_litert_embedder(qwen3, tmp_path / "x.litertlm", **kwargs)


def test_refuses_a_tflite_path(qwen3, tmp_path):
    with pytest.raises(ValueError, match=r"\.litertlm.*x\.tflite"):
        to_litert_embedder(qwen3, tmp_path / "x.tflite")


def test_to_litert_lm_refuses_generative_options_for_an_embedder(qwen3, tmp_path):
    with pytest.raises(TypeError, match=r"max_sequence_length.*to_litert_embedder"):
        to_litert_lm(qwen3, tmp_path / "x.litertlm", max_sequence_length=64)
