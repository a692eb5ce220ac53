"""`to_litert_embedder`: a keras-hub `TextEmbedder` as a `.litertlm` bundle
LiteRT-LM's `EmbeddingEngine` runs.

The engine's contract (LiteRT-LM 0.18, `embedding_litert_compiled_model_executor`):
it tokenizes a text with the bundle's tokenizer, puts the metadata's BOS and
EOS around it, looks every token up with the bundle's EMBEDDER model (one
signature, an int32 `(1, 1)` token in, a float32 `(1, 1, D)` row out; the
rows past the text are token 0's), and runs the TEXT_ENCODER model's
smallest `encoder*` signature whose length holds the text: input
`embeddings` `(1, T, D)`, an optional `input_mask` `(1, T)` (1.0 on the
text, 0.0 past it), output 0 the embedding. A text longer than the largest
length is refused, truncated (its last token replaced by EOS) or cut into
chunks whose embeddings are averaged, as the caller asks.

keras-hub's embedders take token ids, and their first layer is the token
embedding (scaled for Gemma, added to position and segment embeddings for
BERT). So the bundle's EMBEDDER is the identity on the token id, as a float
(`(1, 1, 1)`: exact below 2**24, every vocabulary here), and the
TEXT_ENCODER holds the whole Keras model: each signature rounds the floats
back to ids, makes the padding mask from `input_mask`, and calls the
embedder as Keras does. Every family (Gemma3 / EmbeddingGemma, Qwen3, BERT,
XLM-RoBERTa) is then written by the same code, with its pooling,
projection and normalization as they are, and the table is quantized with
the other weights (`weights.quantize_weights`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np

from kerasnorm._core.dependencies import require_litert_lm
from kerasnorm.export.litert_lm.embedding_bundle import bundle_tokenizer
from kerasnorm.export.litert_lm.embedding_bundle import embed_in_engine
from kerasnorm.export.litert_lm.embedding_bundle import embedding_metadata
from kerasnorm.export.litert_lm.embedding_bundle import write_embedding_bundle
from kerasnorm.export.litert_lm.embedding_graph import check_embedder
from kerasnorm.export.litert_lm.embedding_graph import check_sequence_lengths
from kerasnorm.export.litert_lm.embedding_graph import convert
from kerasnorm.export.litert_lm.embedding_graph import cosine
from kerasnorm.export.litert_lm.embedding_graph import encoder_module
from kerasnorm.export.litert_lm.embedding_graph import file_embeddings
from kerasnorm.export.litert_lm.embedding_graph import is_text_embedder
from kerasnorm.export.litert_lm.embedding_graph import keras_embeddings
from kerasnorm.export.litert_lm.embedding_graph import keras_tokenizer
from kerasnorm.export.litert_lm.embedding_graph import lookup_model
from kerasnorm.export.litert_lm.embedding_graph import name_of
from kerasnorm.export.litert_lm.embedding_graph import pack
from kerasnorm.export.litert_lm.embedding_graph import quantized_encoder
from kerasnorm.export.litert_lm.embedding_graph import special_tokens
from kerasnorm.export.litert_lm.engine import engine_installed
from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.options.generative_modes import INT4_BLOCK_SIZES
from kerasnorm.export.options.generative_modes import INT4_BLOCKS
from kerasnorm.export.options.generative_modes import INT8_DYNAMIC
from kerasnorm.export.staging.atomic import refuse_existing
from kerasnorm.export.staging.atomic import staged

DEFAULT_SEQUENCE_LENGTHS = (64, 256, 512)
# The generative modes whose products compute with dynamic int8 inputs
# (or in float32), the converter's float16 pass left out: None, "dynamic",
# "int4" (`options.generative_modes`).
EMBEDDER_QUANTIZE_MODES = tuple(
    name
    for name, mode in GENERATIVE_MODES.items()
    if mode.products in (None, INT8_DYNAMIC, INT4_BLOCKS) and not mode.converter_float16
)
# The least cosine similarity between the file's embedding and Keras' at
# every length, on every sentence.
FLOAT_COSINE = 0.9999
QUANTIZED_COSINE = 0.99
INDIVISIBLE = (
    "to_litert_embedder: int4_block_size={block} does not divide the input "
    "dimension of the weights {name!r} {shape} (rows, input): pass an "
    "int4_block_size that divides every product's input dimension, or "
    "quantize='dynamic'. Nothing was written."
)
SAMPLE_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Mars is often referred to as the Red Planet.",
    "Venus is often called Earth's twin because of its similar size.",
    "How do I reset my password?",
    "A lighthouse guides ships safely along the rocky coast at night.",
)


@dataclasses.dataclass
class EmbedderExport:
    """What `to_litert_embedder` wrote and measured."""

    path: str
    signatures: dict  # signature key -> its token length T
    quantize: str | None
    size_bytes: int
    embedding_dim: int
    # The bundle's BOS and EOS: the engine's ids (the tokenizer's model's).
    start_token: int | None
    end_token: int | None
    # Length -> the least cosine similarity of the file's embedding with
    # the Keras embedder's over the verification sentences.
    cosines: dict
    # The same in LiteRT-LM's `EmbeddingEngine` (all sentences, the largest
    # length); None where the engine was not run, `engine` saying why.
    engine_cosine: float | None = None
    engine: str | None = None
    # The products GPTQ rounded (`edits.Rounded`, int4 or int8 by its
    # `bits`), fitted to `prompts.CALIBRATION_TEXTS`
    # (`embedding_graph.quantized_encoder`).
    gptq: tuple = ()
    # The layers whose products an "int4" bundle holds at int8 per output
    # channel: each attention's value and output, and any layer of the same
    # weights (`embedding_graph.INT8_LAYERS`).
    int8_products: tuple = ()

    @property
    def int4_gptq(self) -> tuple:
        """The int4 products of `gptq`."""
        return tuple(r for r in self.gptq if r.bits == 4)


# --- the export ---------------------------------------------------------------


def _check_quantize(quantize, int4_block_size):
    if quantize not in EMBEDDER_QUANTIZE_MODES:
        raise ValueError(
            f"to_litert_embedder: `quantize` is one of {EMBEDDER_QUANTIZE_MODES}. "
            f"Received: quantize={quantize!r}"
        )
    if int4_block_size is not None and (
        int4_block_size not in GENERATIVE_MODES[quantize].block_sizes
    ):
        raise ValueError(
            "to_litert_embedder: `int4_block_size` goes with quantize='int4' "
            f"and is one of {INT4_BLOCK_SIZES}. Received: "
            f"int4_block_size={int4_block_size!r} with quantize={quantize!r}"
        )


def _check_texts(texts):
    if texts is None:
        return SAMPLE_SENTENCES
    if isinstance(texts, str):
        texts = (texts,)
    texts = tuple(texts)
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise ValueError(
            "to_litert_embedder: `verify_texts` is one or more non-empty "
            f"strings. Received: verify_texts={texts!r}"
        )
    return texts


def to_litert_embedder(
    embedder,
    path: str | os.PathLike,
    *,
    sequence_lengths=None,
    quantize: str | None = None,
    int4_block_size: int | None = None,
    tokenizer=None,
    verify_texts=None,
    engine: bool = True,
    overwrite: bool = False,
    verbose: bool = False,
) -> EmbedderExport:
    """Write a keras-hub `TextEmbedder` as a `.litertlm` bundle LiteRT-LM's
    `EmbeddingEngine` runs, verified against the Keras embedder.

    The bundle holds an EMBEDDER model (the token id, as the engine's
    lookup stage feeds it on), a TEXT_ENCODER model with one signature
    `encoder_<T>` per entry of `sequence_lengths` (inputs `embeddings`
    float32 `(1, T, 1)` and `input_mask` float32 `(1, T)`, output
    `embedding` `(1, dim)`: the embedder's pooled, projected, normalized
    vector, as Keras computes it), the tokenizer (the preprocessor's:
    SentencePiece as it is, byte-pair and WordPiece as a `tokenizer.json`)
    and `EmbeddingMetadata`: the generic model type, the preprocessor's
    start and end tokens as BOS and EOS, the shortest and longest length.
    The engine runs the shortest signature that holds a text with its BOS
    and EOS; a longer text is refused, truncated or chunked and averaged as
    its `EmbeddingOptions.input_overflow_strategy` says.

    Before the bundle is moved into place, each length's signature embeds
    every `verify_texts` sentence (cut to the length as the engine cuts)
    and each embedding must have cosine similarity at least 0.9999 with the
    Keras embedder's on the same tokens (0.99 quantized); then, where
    `litert-lm-api` is installed and `engine` is true, LiteRT-LM's
    `EmbeddingEngine` embeds the sentences from the bundle (text in, its own
    tokenizer) and must meet the same bound against Keras
    (`ExportVerificationError` otherwise).

    Args:
        embedder: a keras-hub `TextEmbedder` (`Gemma3TextEmbedder` with an
            EmbeddingGemma backbone, `Qwen3TextEmbedder`, `BertTextEmbedder`,
            `XLMRobertaTextEmbedder`) whose preprocessor holds its
            tokenizer, or any whose inputs are `token_ids` with
            `padding_mask` and `segment_ids` and whose output is one
            vector per text.
        path: the `.litertlm` file.
        sequence_lengths: the token lengths, one signature each (BOS and
            EOS included); each at most the backbone's positions. None:
            64, 256 and 512, capped at the backbone's positions.
        quantize: None (float32), `"dynamic"` (int8 weights) or `"int4"`
            (blockwise int4 weights rounded by GPTQ, as `to_litert_lm`
            quantizes, but the token table in int8 rows and each
            attention's value and output products int8 per channel:
            `EmbedderExport.int8_products`).
        int4_block_size: the int4 block (32 by default).
        tokenizer: the bundle's tokenizer, as `to_litert_lm` takes it
            (None: the preprocessor's).
        verify_texts: the sentences the check embeds (None: five English
            sentences).
        engine: run the bundle in LiteRT-LM's `EmbeddingEngine` where it is
            installed.
        overwrite: replace an existing file.
        verbose: show the converter's log.

    Returns:
        An `EmbedderExport`.
    """
    require_litert_lm("Writing a .litertlm embedding bundle")
    path = os.fspath(path)
    if os.path.splitext(path)[1] != ".litertlm":
        raise ValueError(
            "to_litert_embedder: the embedding engine reads a `.litertlm` "
            f"bundle; `path` ends in .litertlm. Received: path={path!r}"
        )
    dim = check_embedder(embedder)
    lengths = check_sequence_lengths(
        embedder, sequence_lengths, DEFAULT_SEQUENCE_LENGTHS
    )
    _check_quantize(quantize, int4_block_size)
    texts = _check_texts(verify_texts)
    refuse_existing(path, overwrite)
    keras_tok = keras_tokenizer(embedder)
    bos, eos, pad = special_tokens(keras_tok)
    ids = _token_ids(embedder, keras_tok, texts)

    with tempfile.TemporaryDirectory(prefix="kerasnorm_embedder_") as tmp:
        resolved, id_map, engine_bos, engine_eos = bundle_tokenizer(
            embedder, tokenizer, bos, eos, tmp, texts
        )
    # The engine's ids of the embedder's (the same but where the tokenizer
    # renumbers its SentencePiece model's: XLM-RoBERTa).
    to_engine = (
        {int(k): i for i, k in enumerate(id_map)} if id_map is not None else None
    )
    module, functions = encoder_module(embedder, lengths, id_map)
    encoder = convert(module, functions, verbose)
    gptq, int8 = (), ()
    if quantize is not None:
        encoder, gptq, int8 = quantized_encoder(
            encoder,
            embedder,
            (quantize, int4_block_size or 32, INDIVISIBLE),
            (bos, eos, pad),
            lengths[-1],
        )
    lookup = lookup_model(verbose)

    bound = FLOAT_COSINE if quantize is None else QUANTIZED_COSINE
    cosines = {}
    for length in lengths:
        rows = [pack(r, length, bos, eos) for r in ids]
        expected = keras_embeddings(embedder, rows, length, pad)
        got = file_embeddings(encoder, _engine_rows(rows, to_engine), length)
        cosines[length] = float(np.min(cosine(got, expected)))
        if not cosines[length] >= bound:
            raise ExportVerificationError(
                f"to_litert_embedder: the file's encoder_{length} embedding "
                f"has cosine similarity {cosines[length]:.6f} with the Keras "
                f"embedder's (at least {bound} needed); the bundle was not "
                "written."
            )

    engine_cosine, engine_note = None, None
    with staged(path, directory=False, suffix=".litertlm") as tmp_path:
        write_embedding_bundle(
            tmp_path,
            lookup,
            encoder,
            resolved,
            embedding_metadata(engine_bos, engine_eos, lengths),
        )
        if not engine:
            engine_note = "not run (engine=False)"
        elif not engine_installed():
            engine_note = "not run: litert-lm-api is not installed"
        else:
            length = lengths[-1]
            rows = [pack(r, length, bos, eos) for r in ids]
            expected = keras_embeddings(embedder, rows, length, pad)
            answers = embed_in_engine(tmp_path, texts, "TRUNCATE")
            for text, answer in zip(texts, answers, strict=True):
                if isinstance(answer, str):
                    raise ExportVerificationError(
                        f"to_litert_embedder: LiteRT-LM's EmbeddingEngine "
                        f"failed on {text!r}: {answer}"
                    )
            engine_cosine = float(np.min(cosine(np.stack(answers), expected)))
            if not engine_cosine >= bound:
                raise ExportVerificationError(
                    "to_litert_embedder: LiteRT-LM's EmbeddingEngine embeds the "
                    f"sentences with cosine similarity {engine_cosine:.6f} to the "
                    f"Keras embedder's (at least {bound} needed); the bundle "
                    "was not written."
                )
            engine_note = "EmbeddingEngine, CPU"
        size = os.path.getsize(tmp_path)
    return EmbedderExport(
        path=path,
        signatures={f"encoder_{t}": t for t in lengths},
        quantize=quantize,
        size_bytes=size,
        embedding_dim=dim,
        start_token=engine_bos,
        end_token=engine_eos,
        cosines=cosines,
        engine_cosine=engine_cosine,
        engine=engine_note,
        gptq=gptq,
        int8_products=int8,
    )


# `to_litert_lm`'s options `to_litert_embedder` takes, and their defaults.
_PASSED_ON = ("quantize", "int4_block_size", "tokenizer", "overwrite", "verbose")


def embedding_bundle_of(embedder, path, options):
    """`to_litert_lm(embedder, path, **options)` for a keras-hub
    `TextEmbedder`: the embedding bundle at the default lengths, with the
    options the two share (a generative option given is refused by name);
    None for any other model."""
    if not is_text_embedder(embedder):
        return None
    options = {k: v for k, v in options.items() if k not in ("model", "path")}
    generative = {
        k: v
        for k, v in options.items()
        if k not in _PASSED_ON
        and v not in (None, False)
        # LoRA merged is every export's default: nothing given.
        and not (k == "lora" and v == "merge")
    }
    if generative:
        raise TypeError(
            f"to_litert_lm: {name_of(embedder)} is a TextEmbedder, written as an "
            f"embedding bundle, which takes none of {sorted(generative)}. Call "
            "kerasnorm.export.to_litert_embedder(embedder, path, "
            "sequence_lengths=...) to choose its lengths."
        )
    return to_litert_embedder(
        embedder, path, **{k: options[k] for k in _PASSED_ON if k in options}
    )


def _engine_rows(rows, to_engine):
    if to_engine is None:
        return rows
    return [[to_engine[t] for t in row] for row in rows]


def _token_ids(embedder, tokenizer, texts):
    """Each text's ids from the embedder's Keras tokenizer (no specials)."""
    if tokenizer is None:
        raise ValueError(
            f"to_litert_embedder: {name_of(embedder)} has no preprocessor "
            "tokenizer; the check tokenizes sentences as the engine does, "
            "with the model's own tokenizer."
        )
    out = []
    for text in texts:
        ids = tokenizer(text)
        ids = ids.numpy() if hasattr(ids, "numpy") else ids
        out.append([int(i) for i in np.asarray(ids).reshape(-1)])
    return out
