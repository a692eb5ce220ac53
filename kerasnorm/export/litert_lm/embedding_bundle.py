"""The `.litertlm` embedding bundle's sections (the tokenizer, the
`EmbeddingMetadata`), its writing and reading with `litert-lm-builder`, and
LiteRT-LM's `EmbeddingEngine` run on it in a child process (a crash there
is an error, not the end of the caller's process; the child imports
`litert_lm` only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from kerasnorm.export.litert_lm.embedding_graph import keras_tokenizer
from kerasnorm.export.litert_lm.sections import parsed_metadata
from kerasnorm.export.litert_lm.sections import unpacked_sections
from kerasnorm.export.numerics.errors import ExportConversionError

_ANSWER = "kerasnorm-embedding:"


def _wordpiece_json(tokenizer):
    """A `tokenizer.json` of a keras-hub WordPiece tokenizer (BERT's): the
    vocabulary with BERT's normalizer and pre-tokenizer, as Hugging Face's
    `BertTokenizerFast` writes it."""
    vocabulary = tokenizer.get_vocabulary()
    specials = [
        t for t in getattr(tokenizer, "special_tokens", None) or [] if t in vocabulary
    ]
    lowercase = bool(getattr(tokenizer, "lowercase", False))
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": vocabulary.index(t),
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t in specials
        ],
        "normalizer": {
            "type": "BertNormalizer",
            "clean_text": True,
            "handle_chinese_chars": True,
            "strip_accents": None if not lowercase else True,
            "lowercase": lowercase,
        },
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {
            "type": "WordPiece",
            "unk_token": getattr(tokenizer, "oov_token", "[UNK]"),
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": {t: i for i, t in enumerate(vocabulary)},
        },
    }
    return json.dumps(spec, ensure_ascii=False)


def bundle_tokenizer(embedder, tokenizer, bos, eos, tmp, texts=()):
    """The bundle's tokenizer: `tokenizer=` as `to_litert_lm` takes it,
    else the embedder's preprocessor's (SentencePiece as it is; byte-pair
    and WordPiece written as a `tokenizer.json`).

    Returns `(BundleTokenizer, id_map, bos, eos)`. keras-hub's XLM-RoBERTa
    tokenizer renumbers its SentencePiece model's ids (fairseq's order:
    `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, the rest one up): then
    `id_map[engine_id]` is the embedder's id of each piece, which the
    encoder applies to what the engine feeds, and `bos` / `eos` are the
    model's ids of the start and end tokens (as given otherwise). A
    renumbering that `id_map` does not reproduce on `texts` is refused."""
    from kerasnorm.export.litert_lm.tokenizer import SENTENCEPIECE
    from kerasnorm.export.litert_lm.tokenizer import resolve_tokenizer

    given = tokenizer
    keras_tok = keras_tokenizer(embedder)
    if tokenizer is None and any(
        c.__name__ == "WordPieceTokenizer" for c in type(keras_tok).__mro__
    ):
        path = os.path.join(tmp, "wordpiece.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_wordpiece_json(keras_tok))
        tokenizer = path

    def resolve(start, end):
        stop = [end] if end is not None else None
        try:
            return resolve_tokenizer(
                embedder, tokenizer, start_token=start, stop_tokens=stop
            )
        except (ValueError, TypeError) as err:
            message = str(err).replace("to_litert_lm", "to_litert_embedder")
            raise type(err)(message) from err

    resolved = resolve(bos, eos)
    if given is not None or resolved.kind != SENTENCEPIECE:
        return resolved, None, bos, eos
    import sentencepiece as spm

    model = spm.SentencePieceProcessor(model_proto=resolved.data)
    pairs = [(_keras_ids(keras_tok, t), list(model.encode(t))) for t in texts]
    if all(k == e for k, e in pairs):
        return resolved, None, bos, eos
    id_map = np.array(
        [keras_tok.token_to_id(model.id_to_piece(i)) for i in range(len(model))],
        np.int32,
    )
    for (k, e), text in zip(pairs, texts, strict=True):
        if k != [int(id_map[i]) for i in e]:
            raise ValueError(
                f"to_litert_embedder: {type(keras_tok).__name__} gives {text!r} "
                f"the ids {k[:8]}..., not its SentencePiece model's "
                f"{e[:8]}... renumbered piece by piece, and LiteRT-LM's engine "
                "tokenizes with the model. Pass tokenizer= a `tokenizer.json` "
                "that gives the embedder's own ids."
            )
    engine_bos, engine_eos = (
        None if t is None else model.piece_to_id(keras_tok.id_to_token(t))
        for t in (bos, eos)
    )
    return resolve(engine_bos, engine_eos), id_map, engine_bos, engine_eos


def _keras_ids(keras_tok, text):
    ids = keras_tok(text)
    ids = ids.numpy() if hasattr(ids, "numpy") else ids
    return [int(i) for i in np.asarray(ids).reshape(-1)]


def embedding_metadata(bos, eos, lengths):
    """The serialized `EmbeddingMetadata`: the generic model type, BOS and
    EOS, and the shortest and longest signature lengths."""
    from litert_lm_builder.runtime.proto import embedding_metadata_pb2

    metadata = embedding_metadata_pb2.EmbeddingMetadata()
    metadata.embedding_model_type.generic_model.SetInParent()
    if bos is not None:
        metadata.bos_token.token_ids.ids.append(int(bos))
    if eos is not None:
        metadata.eos_token.token_ids.ids.append(int(eos))
    metadata.min_input_length = int(min(lengths))
    metadata.max_input_length = int(max(lengths))
    return metadata.SerializeToString()


def write_embedding_bundle(path, lookup, encoder, resolved, metadata):
    from litert_lm_builder import litertlm_builder as builder

    from kerasnorm.export.litert_lm.tokenizer import HF_JSON

    with tempfile.TemporaryDirectory(prefix="kerasnorm_litertlm_") as tmp:
        files = {}
        for name, data in (
            ("embedder.tflite", lookup),
            ("encoder.tflite", encoder),
            ("embedding_metadata.pb", metadata),
            (
                "tokenizer.json" if resolved.kind == HF_JSON else "tokenizer.model",
                resolved.data,
            ),
        ):
            files[name] = os.path.join(tmp, name)
            with open(files[name], "wb") as f:
                f.write(data)
        bundle = builder.LitertLmFileBuilder()
        bundle.add_tflite_model(
            files["embedder.tflite"], builder.TfLiteModelType.EMBEDDER
        )
        bundle.add_tflite_model(
            files["encoder.tflite"], builder.TfLiteModelType.TEXT_ENCODER
        )
        if resolved.kind == HF_JSON:
            bundle.add_hf_tokenizer(files["tokenizer.json"])
        else:
            bundle.add_sentencepiece_tokenizer(files["tokenizer.model"])
        bundle.add_embedding_metadata(files["embedding_metadata.pb"])
        with open(os.fspath(path), "wb") as f:
            bundle.build(f)


def read_embedding_bundle(path):
    """`{"embedder": bytes, "encoder": bytes, "metadata": EmbeddingMetadata,
    "tokenizer": bytes}` of the bundle at `path`."""
    from litert_lm_builder.runtime.proto import embedding_metadata_pb2

    sections = {}
    for name, data in unpacked_sections(path):
        lower = name.lower()
        if "text_encoder" in lower:
            sections["encoder"] = data
        elif "_embedder" in lower:
            sections["embedder"] = data
        elif lower.startswith("embeddingmetadata"):
            sections["metadata"] = parsed_metadata(
                embedding_metadata_pb2.EmbeddingMetadata(), name, data
            )
        elif "tokenizer" in lower:
            sections["tokenizer"] = data
    return sections


# --- LiteRT-LM's EmbeddingEngine, in a child process ------------------------

_SOURCE = r"""
import json
import sys

import litert_lm

ANSWER = "kerasnorm-embedding:"
path, texts, strategy = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
options = {}
if strategy != "default":
    options["input_overflow_strategy"] = getattr(
        litert_lm.InputOverflowStrategy, strategy
    )
answers = []
with litert_lm.EmbeddingEngine(
    path, backend=litert_lm.Backend.CPU(thread_count=1), cache_dir=":nocache"
) as engine:
    for text in texts:
        try:
            response = engine.compute_embedding(
                text, litert_lm.EmbeddingOptions(**options)
            )
            answers.append(response.embedding)
        except Exception as err:
            answers.append(str(err) or type(err).__name__)
print(ANSWER + json.dumps(answers), flush=True)
"""


def embed_in_engine(path, texts, strategy=None, timeout=600):
    """Each of `texts` embedded by LiteRT-LM's `EmbeddingEngine` from the
    bundle at `path` (CPU, in a child process), with `strategy` (None: the
    engine's default; or a name of `litert_lm.InputOverflowStrategy`:
    "CHUNK_AND_AVERAGE", "TRUNCATE", "ERROR"). Returns one entry per text:
    the embedding (a float32 array) or the engine's error message (str).
    Raises `ExportConversionError` where the engine cannot load the file."""
    process = subprocess.run(
        [
            sys.executable,
            "-c",
            _SOURCE,
            os.fspath(path),
            json.dumps(list(texts)),
            strategy or "default",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": ""},
    )
    for line in process.stdout.splitlines():
        if line.startswith(_ANSWER):
            return [
                a if isinstance(a, str) else np.asarray(a, np.float32)
                for a in json.loads(line[len(_ANSWER) :])
            ]
    tail = "\n".join(process.stderr.strip().splitlines()[-6:])
    raise ExportConversionError(
        "to_litert_embedder: LiteRT-LM's EmbeddingEngine could not load the "
        f"bundle (exit code {process.returncode}): {tail}",
        details=process.stderr,
    )
