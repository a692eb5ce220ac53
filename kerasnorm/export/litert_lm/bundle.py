"""The `.litertlm` bundle LiteRT-LM's engine loads: the generative `.tflite`,
the tokenizer and the LLM metadata (start and stop tokens, context length),
written with `litert-lm-builder`.

The engine drives the file in a fixed way, and `check_engine_contract` refuses
a file it would misread: signatures `decode` and `prefill*`, inputs `tokens`,
`input_pos` and `kv_cache_k_<i>` / `kv_cache_v_<i>` whose dimension 2 is the
context (the engine reads its token limit there), and `logits` of rank 3 from
`decode` (the only logits it reads).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import zlib

from kerasnorm._core.dependencies import require_litert_lm
from kerasnorm.export.litert.runner import signature_shape
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.litert_lm.chat import chat_of
from kerasnorm.export.litert_lm.families import GENERIC
from kerasnorm.export.litert_lm.sections import parsed_metadata
from kerasnorm.export.litert_lm.sections import unpacked_sections
from kerasnorm.export.litert_lm.tokenizer import HF_JSON
from kerasnorm.export.litert_lm.tokenizer import SENTENCEPIECE
from kerasnorm.export.litert_lm.tokenizer import resolve_tokenizer


def _details(interp, key):
    runner = interp.get_signature_runner(key)
    inputs = {
        name: signature_shape(d) for name, d in runner.get_input_details().items()
    }
    outputs = {
        name: signature_shape(d) for name, d in runner.get_output_details().items()
    }
    return inputs, outputs


def check_engine_contract(content: bytes, max_sequence_length: int) -> int:
    """Raise `ValueError` where LiteRT-LM's engine would misread the file;
    return its vocabulary size (the last dimension of `decode`'s logits)."""
    interp = unallocated(content)
    keys = list(interp.get_signature_list())
    prefills = [k for k in keys if k.startswith("prefill")]
    if "decode" not in keys or not prefills:
        raise ValueError(
            "to_litert_lm: LiteRT-LM's engine runs a file with a `decode` "
            f"signature and `prefill` or `prefill_<T>` ones; this one has {keys}."
        )
    for key in [*prefills, "decode"]:
        inputs, outputs = _details(interp, key)
        # Token ids, or the embeddings of the bundle's embedder sections.
        fed = "embeddings" if "embeddings" in inputs else "tokens"
        missing = [n for n in (fed, "input_pos", "kv_cache_k_0") if n not in inputs]
        if missing:
            raise ValueError(
                f"to_litert_lm: signature {key!r} lacks the input(s) {missing} "
                f"LiteRT-LM's engine feeds; it has {sorted(inputs)}."
            )
        caches = {n: s for n, s in inputs.items() if n.startswith("kv_cache_")}
        for name, shape in caches.items():
            if len(shape) != 4 or shape[2] != max_sequence_length:
                raise ValueError(
                    f"to_litert_lm: cache {name!r} of {key!r} has shape {shape}; "
                    "LiteRT-LM's engine reads the context from dimension 2 "
                    f"(batch, kv heads, time, head size), so it must be "
                    f"{max_sequence_length} there."
                )
            if name not in outputs:
                raise ValueError(
                    f"to_litert_lm: signature {key!r} reads cache {name!r} but "
                    "does not output it under the same name."
                )
    inputs, outputs = _details(interp, "decode")
    logits = outputs.get("logits")
    if logits is None or len(logits) != 3 or logits[:2] != (1, 1):
        raise ValueError(
            "to_litert_lm: `decode` must output `logits` of shape (1, 1, vocab) "
            f"for LiteRT-LM's engine; it outputs {outputs.get('logits')}."
        )
    return logits[2]


def check_sampler(top_k=None, top_p=None, temperature=None):
    """The sampler defaults checked: `top_k` a positive integer, `top_p` in
    (0, 1], `temperature` above 0 (None: not set)."""
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
    ):
        raise ValueError(
            f"to_litert_lm: `top_k` is a positive integer. Received: top_k={top_k!r}"
        )
    for name, value, low in (("top_p", top_p, 0.0), ("temperature", temperature, 0.0)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            ok = False
        else:
            ok = value > low and (name != "top_p" or value <= 1)
        if not ok:
            span = "in (0, 1]" if name == "top_p" else "above 0"
            raise ValueError(
                f"to_litert_lm: `{name}` is a number {span}. Received: {name}={value!r}"
            )


def llm_metadata(
    tokenizer,
    max_sequence_length,
    chat=None,
    *,
    top_k=None,
    top_p=None,
    temperature=None,
):
    """The serialized `LlmMetadata`: start and stop tokens, the context,
    the model type and chat template of `chat` (a `chat.Chat`; None: the
    generic type, no template) and the sampler defaults given."""
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    metadata = llm_metadata_pb2.LlmMetadata()
    if tokenizer.start_token is not None:
        metadata.start_token.token_ids.ids.append(int(tokenizer.start_token))
    for token in tokenizer.stop_tokens:
        metadata.stop_tokens.add().token_ids.ids.append(int(token))
    metadata.max_num_tokens = int(max_sequence_length)
    model_type = GENERIC if chat is None else chat.model_type
    getattr(metadata.llm_model_type, model_type).SetInParent()
    if chat is not None and chat.template is not None:
        metadata.jinja_prompt_template = chat.template
    _capabilities(metadata, chat, model_type)
    if (top_k, top_p, temperature) != (None, None, None):
        # top-p where given (or a temperature alone: the whole distribution
        # at that temperature), top-k where given (1: greedy).
        params = metadata.sampler_params
        kinds = type(params).Type
        if top_p is None and temperature is not None and top_k is None:
            top_p = 1.0
        if top_p is not None:
            params.type = kinds.Value("TOP_P")
            params.p = float(top_p)
        elif top_k == 1:
            params.type = kinds.Value("GREEDY")
        else:
            params.type = kinds.Value("TOP_K")
        if top_k is not None:
            params.k = int(top_k)
        params.temperature = float(1.0 if temperature is None else temperature)
    return metadata.SerializeToString()


def _capabilities(metadata, chat, model_type):
    """Whether the model calls tools and thinks: set in every bundle
    (litert-lm-builder's `validate_metadata()` requires both); true where
    the bundle's template is a turn format that has them, with the fields
    the engine parses calls (the model type's message) and thoughts (a
    reasoning channel) by."""
    tool_calls = None if chat is None else chat.tool_calls
    thinking = None if chat is None else chat.thinking
    fields = getattr(metadata.llm_model_type, model_type)
    if tool_calls is not None and not set(tool_calls) <= set(
        fields.DESCRIPTOR.fields_by_name
    ):
        # The model type's message has no such fields: the engine would
        # not parse the calls.
        tool_calls = None
    metadata.supports_function_calling = tool_calls is not None
    metadata.supports_thinking = thinking is not None
    for name, value in (tool_calls or {}).items():
        setattr(fields, name, value)
    if thinking is not None:
        name, start, end = thinking
        channel = metadata.channels.add()
        channel.channel_name, channel.start, channel.end = name, start, end
        channel.is_reasoning_channel = True


def read_bundle(path):
    """The sections of the `.litertlm` bundle at `path`, read back with
    `litert-lm-builder`'s unpacker: `{"metadata": LlmMetadata message,
    "tokenizer": (kind, bytes), "model": bytes}`, and any other model section
    under its type (`"tf_lite_mtp_drafter"`: bytes)."""
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    sections = {}
    for name, data in unpacked_sections(path):
        if name.startswith("Section") and "TFLiteModel" in name:
            # The base under "model", any other model section under its type.
            kind = name.split("TFLiteModel_", 1)[1].rsplit(".", 1)[0]
            sections["model" if kind == "tf_lite_prefill_decode" else kind] = data
        elif name.startswith("LlmMetadata"):
            sections["metadata"] = parsed_metadata(
                llm_metadata_pb2.LlmMetadata(), name, data
            )
        elif "HF_Tokenizer" in name:
            if not data.lstrip().startswith(b"{"):
                data = zlib.decompress(data[8:] if data[:1] != b"x" else data)
            sections["tokenizer"] = (HF_JSON, data)
        elif "SP_Tokenizer" in name:
            sections["tokenizer"] = (SENTENCEPIECE, data)
    return sections


def write_bundle(
    content: bytes,
    path,
    *,
    model=None,
    tokenizer=None,
    max_sequence_length: int,
    start_token=None,
    stop_tokens=None,
    chat_template=None,
    top_k=None,
    top_p=None,
    temperature=None,
    sections=(),
    cache_length=None,
):
    """Write a `.litertlm` holding `content` (a generative `.tflite`), the
    tokenizer and the LLM metadata: start and stop tokens (the family's
    end-of-turn token among them), the context, LiteRT-LM's model type, the
    chat template (`chat.chat_of`) and the sampler defaults given.

    Args:
        content: the `.tflite` flatbuffer (`prefill*` and `decode`).
        path: where the bundle goes (written in place; the caller stages it).
        model: the exported model; a keras-hub `CausalLM`'s preprocessor's
            tokenizer is the default tokenizer.
        tokenizer: see `resolve_tokenizer`.
        max_sequence_length: the cache length (prompt plus generated tokens).
        start_token: the token the engine prepends to a prompt (`False`:
            none). Defaults to the tokenizer's.
        stop_tokens: the token(s) that end a generation. Defaults to the
            tokenizer's end token and the family's end-of-turn token.
        chat_template: a Jinja chat template or its file; None: the
            family's turn format where kerasnorm knows it.
        top_k: the engine's default top-k. None: not set.
        top_p: the engine's default top-p. None: not set.
        temperature: the engine's default temperature. None: not set.
        sections: further model sections, `(TfLiteModelType name, bytes)`
            pairs (a speculative bundle's embedders and drafter).
        cache_length: the caches' length where it exceeds the context
            (a speculative bundle's room for its last `verify`). None: the
            context.

    Returns:
        `(BundleTokenizer, chat.Chat)`: the tokenizer and chat metadata
        written.
    """
    require_litert_lm("Writing a .litertlm bundle")
    from litert_lm_builder import litertlm_builder as builder

    check_sampler(top_k, top_p, temperature)
    resolved = resolve_tokenizer(
        model, tokenizer, start_token=start_token, stop_tokens=stop_tokens
    )
    chat = chat_of(model, resolved.vocabulary, chat_template)
    if stop_tokens is None:
        extra = [
            resolved.vocabulary[t]
            for t in chat.stop_tokens
            if resolved.vocabulary[t] not in resolved.stop_tokens
        ]
        resolved = dataclasses.replace(
            resolved, stop_tokens=(*resolved.stop_tokens, *extra)
        )
    vocabulary = check_engine_contract(content, cache_length or max_sequence_length)
    if resolved.vocabulary_size > vocabulary:
        raise ValueError(
            f"to_litert_lm: the tokenizer has {resolved.vocabulary_size} tokens "
            f"and the model's logits {vocabulary}: they are not the same "
            "model's. Pass the tokenizer the model was trained with."
        )
    specials = [
        t for t in (resolved.start_token, *resolved.stop_tokens) if t is not None
    ]
    if any(not 0 <= t < vocabulary for t in specials):
        raise ValueError(
            f"to_litert_lm: start/stop token ids {specials} must lie in "
            f"[0, {vocabulary}), the model's vocabulary."
        )
    if not resolved.stop_tokens:
        raise ValueError(
            "to_litert_lm: the tokenizer has no end token; pass stop_tokens= "
            "the token(s) that end a generation."
        )
    # The builder reads every section from a file.
    with tempfile.TemporaryDirectory(prefix="kerasnorm_litertlm_") as tmp:
        model_path = os.path.join(tmp, "model.tflite")
        with open(model_path, "wb") as f:
            f.write(content)
        metadata_path = os.path.join(tmp, "llm_metadata.pb")
        with open(metadata_path, "wb") as f:
            f.write(
                llm_metadata(
                    resolved,
                    max_sequence_length,
                    chat,
                    top_k=top_k,
                    top_p=top_p,
                    temperature=temperature,
                )
            )
        tokenizer_path = os.path.join(
            tmp, "tokenizer.json" if resolved.kind == HF_JSON else "tokenizer.model"
        )
        with open(tokenizer_path, "wb") as f:
            f.write(resolved.data)
        bundle = builder.LitertLmFileBuilder()
        bundle.add_tflite_model(model_path, builder.TfLiteModelType.PREFILL_DECODE)
        for n, (kind, data) in enumerate(sections):
            section_path = os.path.join(tmp, f"section_{n}.tflite")
            with open(section_path, "wb") as f:
                f.write(data)
            bundle.add_tflite_model(section_path, builder.TfLiteModelType[kind])
        if resolved.kind == HF_JSON:
            bundle.add_hf_tokenizer(tokenizer_path)
        else:
            bundle.add_sentencepiece_tokenizer(tokenizer_path)
        bundle.add_llm_metadata(metadata_path)
        with open(os.fspath(path), "wb") as f:
            bundle.build(f, validate_metadata=True)
    return resolved, chat
