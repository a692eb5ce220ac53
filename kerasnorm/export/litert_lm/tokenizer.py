"""The tokenizer a `.litertlm` bundle carries, and its start and stop tokens.

LiteRT-LM's engine tokenizes the prompt itself, prepends the start token and
stops at a stop token, so the bundle must hold the very tokenizer the model
was trained with: a SentencePiece model (keras-hub's Llama, Gemma, Mistral
tokenizers keep its serialized proto) or a Hugging Face `tokenizer.json`.
keras-hub's byte-pair tokenizers (GPT-2, Qwen, Qwen3, Llama 3, Falcon, OPT,
GPT-NeoX, Bloom...) hold a vocabulary and merges: the `tokenizer.json` is
written from them as keras-hub's own `tokenizers` path builds it (a BPE
model, its split and byte-level pre-tokenizers, the byte-level decoder, its
special tokens added), and checked to tokenize a sample text as keras-hub
does.
"""

from __future__ import annotations

import dataclasses
import json
import os

from kerasnorm._compat.keras_hub_private import byte_pair_split_pattern
from kerasnorm.export.litert_lm.families import FAMILIES
from kerasnorm.export.litert_lm.families import family_of
from kerasnorm.export.litert_lm.families import start_hints
from kerasnorm.export.litert_lm.families import stop_hints

SENTENCEPIECE = "sentencepiece"
HF_JSON = "hf_tokenizer_json"


@dataclasses.dataclass(frozen=True)
class BundleTokenizer:
    """A tokenizer as the bundle stores it.

    `kind` is `"sentencepiece"` (`data`: a serialized SentencePiece model) or
    `"hf_tokenizer_json"` (`data`: the `tokenizer.json` text as bytes).
    """

    kind: str
    data: bytes
    start_token: int | None
    stop_tokens: tuple[int, ...]
    vocabulary_size: int
    # Token text -> id, for the chat tokens (not compared: the rest is).
    vocabulary: dict = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )


def _sentencepiece(proto, what):
    try:
        import sentencepiece as spm
    except ImportError as e:  # pragma: no cover - the extra installs it
        raise ImportError(
            "A `.litertlm` with a SentencePiece tokenizer needs the "
            "`sentencepiece` package: pip install 'kerasnorm[litert_lm]'."
        ) from e
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(bytes(proto))
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"to_litert_lm: {what} is not a SentencePiece model (pass "
            "tokenizer= a `.model` file, its bytes, or a `tokenizer.json` "
            f"path). SentencePiece says: {e}"
        ) from e
    return processor


def _from_sentencepiece(proto, what, start_token, stop_tokens):
    processor = _sentencepiece(proto, what)
    # SentencePiece numbers a disabled special token -1.
    if start_token is None and processor.bos_id() >= 0:
        start_token = processor.bos_id()
    if stop_tokens is None:
        stop_tokens = [processor.eos_id()] if processor.eos_id() >= 0 else []
    size = processor.get_piece_size()
    vocabulary = {processor.id_to_piece(i): i for i in range(size)}
    if start_token is not None:
        start_token = _token_id(start_token, vocabulary, "start_token")
    return BundleTokenizer(
        SENTENCEPIECE,
        bytes(proto),
        start_token,
        tuple(_token_id(t, vocabulary, "stop token") for t in stop_tokens),
        size,
        vocabulary,
    )


def _token_id(token, vocabulary, what):
    if isinstance(token, str):
        if token not in vocabulary:
            raise ValueError(
                f"to_litert_lm: {what} {token!r} is not in the tokenizer's "
                "vocabulary; pass its id or a token the tokenizer has."
            )
        return vocabulary[token]
    return int(token)


def _from_json(path, start_token, stop_tokens, data=None, guess_start=True, row=None):
    """The bundle's tokenizer from a `tokenizer.json`; where no start or stop
    token is given, the first of the model's family row's hints (`row`,
    `families.start_hints` / `stop_hints`) that the vocabulary holds."""
    row = FAMILIES["CausalLM"] if row is None else row
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    try:
        spec = json.loads(data)
        vocabulary = dict(spec["model"]["vocab"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"to_litert_lm: tokenizer={path!r} is not a Hugging Face "
            "`tokenizer.json` (no model.vocab in it)."
        ) from e
    for added in spec.get("added_tokens") or []:
        vocabulary.setdefault(added["content"], added["id"])
    if start_token is None and guess_start:
        start_token = next((t for t in start_hints(row) if t in vocabulary), None)
    if stop_tokens is None:
        stop_tokens = [t for t in stop_hints(row) if t in vocabulary][:1]
        if not stop_tokens:
            raise ValueError(
                f"to_litert_lm: tokenizer={path!r} names none of the usual "
                "end tokens; pass stop_tokens= the token(s) that end a "
                "generation."
            )
    start = (
        None
        if start_token is None
        else _token_id(start_token, vocabulary, "start_token")
    )
    stops = tuple(_token_id(t, vocabulary, "stop token") for t in stop_tokens)
    size = max(vocabulary.values()) + 1
    return BundleTokenizer(HF_JSON, data, start, stops, size, vocabulary)


# What the byte-pair `tokenizer.json` is checked on: words, digits,
# punctuation, runs of spaces and newlines (each split differently).
SAMPLE_TEXT = "Hello, world! It's 2026: 12345 tokens.\n\n  Two  spaces\tand a tab."


def _is_byte_pair(tokenizer):
    return hasattr(tokenizer, "merges") and hasattr(tokenizer, "unsplittable_tokens")


def byte_pair_json(tokenizer) -> str:
    """The `tokenizer.json` text of a keras-hub `BytePairTokenizer`, built
    as keras-hub's `tokenizers` path builds it."""
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers

    vocabulary = dict(tokenizer.vocabulary)
    merges = [
        tuple(str(m).split(" "))
        for m in tokenizer.merges
        if "#version:" not in str(m).lstrip()
    ]
    built = Tokenizer(models.BPE(vocab=vocabulary, merges=merges))
    if tokenizer.unsplittable_tokens:
        built.add_special_tokens(list(tokenizer.unsplittable_tokens))
    built.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                pattern=byte_pair_split_pattern(), behavior="isolated"
            ),
            pre_tokenizers.ByteLevel(
                add_prefix_space=tokenizer.add_prefix_space, use_regex=False
            ),
        ]
    )
    built.decoder = decoders.ByteLevel()
    return built.to_str()


def check_byte_pair_json(tokenizer, text, sample=SAMPLE_TEXT):
    """Raise `ValueError` unless the `tokenizer.json` `text` tokenizes
    `sample` (and the tokenizer's special tokens) as keras-hub's `tokenizer`
    does."""
    from tokenizers import Tokenizer

    sample = sample + "".join(tokenizer.unsplittable_tokens or ())
    ours = Tokenizer.from_str(text).encode(sample).ids
    theirs = [int(i) for i in __import__("numpy").asarray(tokenizer.tokenize(sample))]
    if ours != theirs:
        raise ValueError(
            f"to_litert_lm: the tokenizer.json written from "
            f"{type(tokenizer).__name__}'s vocabulary and merges tokenizes "
            f"{sample!r} as {ours}, keras-hub as {theirs}; pass tokenizer= the "
            "model's own `tokenizer.json` path."
        )


def _from_byte_pair(tokenizer, start_token, stop_tokens):
    name = type(tokenizer).__name__
    if tokenizer.vocabulary is None:
        raise ValueError(
            f"to_litert_lm: {name} has no vocabulary set; pass tokenizer= the "
            "model's `tokenizer.json` path."
        )
    text = byte_pair_json(tokenizer)
    check_byte_pair_json(tokenizer, text)
    if start_token is None:
        start_token = getattr(tokenizer, "start_token_id", None)
    if stop_tokens is None and getattr(tokenizer, "end_token_id", None) is not None:
        stop_tokens = [tokenizer.end_token_id]
    # keras-hub's start token, or none (Qwen's generate() prepends none).
    return _from_json(
        name, start_token, stop_tokens, data=text.encode("utf-8"), guess_start=False
    )


def _from_keras_hub(tokenizer, start_token, stop_tokens):
    if _is_byte_pair(tokenizer):
        return _from_byte_pair(tokenizer, start_token, stop_tokens)
    proto = getattr(tokenizer, "proto", None)
    name = type(tokenizer).__name__
    if proto is None:
        raise ValueError(
            f"to_litert_lm: the bundle holds a SentencePiece model or a "
            f"`tokenizer.json`, and {name} is neither a SentencePiece nor a "
            "byte-pair tokenizer (or has no vocabulary set). Pass tokenizer= "
            "the model's `tokenizer.json` path."
        )
    if isinstance(proto, str):
        with open(proto, "rb") as f:
            proto = f.read()
    # keras-hub's own special tokens win over the proto's: they are what its
    # generate() prepends and stops at.
    if start_token is None:
        start_token = getattr(tokenizer, "start_token_id", None)
    if stop_tokens is None and getattr(tokenizer, "end_token_id", None) is not None:
        stop_tokens = [tokenizer.end_token_id]
    return _from_sentencepiece(proto, name, start_token, stop_tokens)


def resolve_tokenizer(
    model=None, tokenizer=None, *, start_token=None, stop_tokens=None
):
    """The bundle's tokenizer from `tokenizer=` or the model's preprocessor.

    Args:
        model: a keras-hub `CausalLM` (its preprocessor's tokenizer is the
            default) or any model.
        tokenizer: `None`, a SentencePiece model (path or bytes), a
            `tokenizer.json` path, a `sentencepiece.SentencePieceProcessor`
            or a keras-hub SentencePiece or byte-pair tokenizer.
        start_token: the id (or token) the engine prepends to a prompt.
            Defaults to the tokenizer's; `False`: none (a model trained
            without one, whose chat template begins every turn itself).
        stop_tokens: ids (or tokens) that end a generation. Defaults to the
            tokenizer's end token.
    """
    if start_token is True:
        raise ValueError(
            "to_litert_lm: start_token is an id or a token of the tokenizer, "
            "None (the tokenizer's) or False (none). Received: start_token=True"
        )
    if start_token is False:  # none: resolved with the default, then dropped
        resolved = _resolved(model, tokenizer, None, stop_tokens)
        return dataclasses.replace(resolved, start_token=None)
    return _resolved(model, tokenizer, start_token, stop_tokens)


def _resolved(model, tokenizer, start_token, stop_tokens):
    if tokenizer is None:
        preprocessor = getattr(model, "preprocessor", None)
        tokenizer = getattr(preprocessor, "tokenizer", None)
        if tokenizer is None:
            name = getattr(model, "name", type(model).__name__)
            raise ValueError(
                f"to_litert_lm: a `.litertlm` bundle holds a tokenizer, and "
                f"{name!r} has no preprocessor to take one from: pass "
                "tokenizer= a SentencePiece model or `tokenizer.json` path, "
                "or write a `.tflite` path."
            )
    if stop_tokens is not None:
        stop_tokens = (
            [stop_tokens] if isinstance(stop_tokens, (int, str)) else list(stop_tokens)
        )
    if isinstance(tokenizer, (bytes, bytearray)):
        return _from_sentencepiece(
            tokenizer, "tokenizer=<bytes>", start_token, stop_tokens
        )
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"to_litert_lm: tokenizer={path!r} does not exist; pass a "
                "SentencePiece `.model` or a `tokenizer.json` path."
            )
        if os.path.splitext(path)[1] == ".json":
            return _from_json(path, start_token, stop_tokens, row=family_of(model))
        with open(path, "rb") as f:
            proto = f.read()
        return _from_sentencepiece(
            proto, f"tokenizer={path!r}", start_token, stop_tokens
        )
    if hasattr(tokenizer, "serialized_model_proto"):
        proto = tokenizer.serialized_model_proto()
        return _from_sentencepiece(
            proto, type(tokenizer).__name__, start_token, stop_tokens
        )
    if hasattr(tokenizer, "detokenize") and hasattr(tokenizer, "vocabulary_size"):
        return _from_keras_hub(tokenizer, start_token, stop_tokens)
    raise TypeError(
        "to_litert_lm: tokenizer= is a SentencePiece model (path or bytes), a "
        "`tokenizer.json` path or a keras-hub SentencePiece or byte-pair "
        "tokenizer. "
        f"Received: {type(tokenizer).__name__}"
    )
