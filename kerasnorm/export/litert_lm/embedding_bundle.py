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
    """The bundle's tokenizer (`tokenizer.BundleTokenizer`): `tokenizer=`
    as `to_litert_lm` takes it, else the embedder's preprocessor's
    (SentencePiece as it is; byte-pair and WordPiece written as a
    `tokenizer.json`). A preprocessor SentencePiece tokenizer whose ids on
    `texts` are not its model's own (XLM-RoBERTa's renumber them) is
    refused: the engine would feed the model other tokens."""
    from kerasnorm.export.litert_lm.tokenizer import SENTENCEPIECE
    from kerasnorm.export.litert_lm.tokenizer import resolve_tokenizer

    stop = [eos] if eos is not None else None
    given = tokenizer
    keras_tok = keras_tokenizer(embedder)
    if tokenizer is None and any(
        c.__name__ == "WordPieceTokenizer" for c in type(keras_tok).__mro__
    ):
        path = os.path.join(tmp, "wordpiece.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_wordpiece_json(keras_tok))
        tokenizer = path
    try:
        resolved = resolve_tokenizer(
            embedder, tokenizer, start_token=bos, stop_tokens=stop
        )
    except (ValueError, TypeError) as err:
        raise type(err)(str(err).replace("to_litert_lm", "to_litert_embedder")) from err
    if given is None and resolved.kind == SENTENCEPIECE:
        import sentencepiece as spm

        model = spm.SentencePieceProcessor(model_proto=resolved.data)
        for text in texts:
            ids = keras_tok(text)
            ids = ids.numpy() if hasattr(ids, "numpy") else ids
            ids = [int(i) for i in np.asarray(ids).reshape(-1)]
            if ids != list(model.encode(text)):
                raise ValueError(
                    f"to_litert_embedder: {type(keras_tok).__name__} gives "
                    f"{text!r} the ids {ids[:8]}..., its SentencePiece model "
                    f"{list(model.encode(text))[:8]}...: keras-hub renumbers "
                    "the model's ids, and LiteRT-LM's engine would feed the "
                    "embedder the model's. Pass tokenizer= a `tokenizer.json` "
                    "that gives the embedder's own ids."
                )
    return resolved


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
    from google.protobuf import text_format
    from litert_lm_builder import litertlm_builder as builder
    from litert_lm_builder.runtime.proto import embedding_metadata_pb2

    sections = {}
    with tempfile.TemporaryDirectory(prefix="kerasnorm_litertlm_") as tmp:
        builder.unpack(os.fspath(path), tmp)
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as f:
                data = f.read()
            lower = name.lower()
            if "text_encoder" in lower:
                sections["encoder"] = data
            elif "_embedder" in lower:
                sections["embedder"] = data
            elif lower.startswith("embeddingmetadata"):
                metadata = embedding_metadata_pb2.EmbeddingMetadata()
                if os.path.splitext(name)[1] == ".pbtext":
                    text_format.Parse(data.decode("utf-8"), metadata)
                else:
                    metadata.ParseFromString(data)
                sections["metadata"] = metadata
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
