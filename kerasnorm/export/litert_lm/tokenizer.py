"""The tokenizer a `.litertlm` bundle carries, and its start and stop tokens.

LiteRT-LM's engine tokenizes the prompt itself, prepends the start token and
stops at a stop token, so the bundle must hold the very tokenizer the model
was trained with: a SentencePiece model (keras-hub's Llama, Gemma, Mistral,
Phi-3 tokenizers keep its serialized proto) or a Hugging Face
`tokenizer.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os

SENTENCEPIECE = "sentencepiece"
HF_JSON = "hf_tokenizer_json"

# Start tokens a `tokenizer.json` names, in the order they are tried, for
# when the caller gives none.
_KNOWN_START = ("<s>", "<bos>", "<|begin_of_text|>", "<|im_start|>", "<|endoftext|>")
_KNOWN_STOP = (
    "</s>",
    "<eos>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|endoftext|>",
)


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
    return BundleTokenizer(
        SENTENCEPIECE,
        bytes(proto),
        start_token,
        tuple(stop_tokens),
        processor.get_piece_size(),
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


def _from_json(path, start_token, stop_tokens):
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
    if start_token is None:
        start_token = next((t for t in _KNOWN_START if t in vocabulary), None)
    if stop_tokens is None:
        stop_tokens = [t for t in _KNOWN_STOP if t in vocabulary][:1]
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
    return BundleTokenizer(HF_JSON, data, start, stops, size)


def _from_keras_hub(tokenizer, start_token, stop_tokens):
    proto = getattr(tokenizer, "proto", None)
    name = type(tokenizer).__name__
    if proto is None:
        raise ValueError(
            f"to_litert_lm: the bundle holds a SentencePiece model or a "
            f"`tokenizer.json`, and {name} is neither (or has no vocabulary "
            "set). Pass tokenizer= the model's `tokenizer.json` path."
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
            or a keras-hub SentencePiece tokenizer.
        start_token: the id (or token) the engine prepends to a prompt.
            Defaults to the tokenizer's.
        stop_tokens: ids (or tokens) that end a generation. Defaults to the
            tokenizer's end token.
    """
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
            return _from_json(path, start_token, stop_tokens)
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
        "`tokenizer.json` path or a keras-hub SentencePiece tokenizer. "
        f"Received: {type(tokenizer).__name__}"
    )
