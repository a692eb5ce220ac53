"""What kerasnorm knows about each keras-hub CausalLM family, in one table:
one row per class, read by every module that decides by family (`hub_step`,
`steps`, `chat`, `tokenizer`, through them `bundle`). No other module names
a family to decide its policy; a new family is one row.

Each row (`Family`) holds:

- `refused`: why the family cannot be written (its cached call keeps a
  state the file's per-layer key/value caches do not hold, or it reads an
  input the file has none for), or None;
- `corrections`: where keras-hub's cached call differs from its own full
  pass, the names of the corrections the generic step applies
  (`hub_step`'s mechanism implements each name);
- `model_type`: LiteRT-LM's model type (`llm_model_type`) for the bundle;
- `turns`: the family's turn format (`TurnFormat`: the Jinja template, its
  turn tokens, its end-of-turn token), or None;
- `start_tokens`, `stop_tokens`: the start and end tokens to look for in a
  `tokenizer.json` given without them, tried before the `CausalLM` row's.

Every row's model generates through the one generic step (its own
`call_with_cache`, `hub_step`).

**The matching rule: the nearest class in the model's MRO that has a row.**
A user's subclass of `GemmaCausalLM` keeps Gemma's backbone, tokenizer,
turn format and cache, so it finds Gemma's row; so does
`Llama3CausalLM`'s subclass find Llama 3's row before Llama's. Rows are
keyed by class name, not by class: keras-hub is imported only where a
model is, and its classes' names are what its releases keep stable. A
model with no row in its MRO (a functional Keras decoder) gets the
`CausalLM` row, the facts that hold for any model.
"""

from __future__ import annotations

import dataclasses

GENERIC = "generic_model"

# The text of a message, whether the engine passes a string or a list of
# parts ({"type": "text", "text": ...}).
CONTENT = (
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class TurnFormat:
    """A turn format: its Jinja template, the tokens it is made of, and the
    token that ends a turn. `tool_calls`: the fields of the model type's
    message in LiteRT-LM's metadata that say how the model writes a tool
    call (code fences, quotes, the start of a tool's answer), or None where
    the format has no tool calls; `thinking`: the reasoning channel
    `(name, start, end)` the model thinks in, or None."""

    name: str
    template: str
    tokens: tuple[str, ...]
    end_of_turn: str
    tool_calls: dict | None = None
    thinking: tuple[str, str, str] | None = None


GEMMA = TurnFormat(
    "gemma",
    "{% for message in messages %}"
    "{% if message['role'] in ['assistant', 'model'] %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "<start_of_turn>{{ role }}\n" + CONTENT + "<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    ("<start_of_turn>", "<end_of_turn>"),
    "<end_of_turn>",
)
CHATML = TurnFormat(
    "chatml",
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n" + CONTENT + "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    ("<|im_start|>", "<|im_end|>"),
    "<|im_end|>",
)
LLAMA3 = TurnFormat(
    "llama3",
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    + CONTENT
    + "<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "<|eot_id|>",
)
# Gemma 4's turn format (the tokens LiteRT-LM's `gemma4` processor reads):
# turns `<|turn>role\n ... <turn|>\n`; a system turn holds the system
# message, `<|think|>` where thinking is enabled and each declared tool as
# `<|tool>...<tool|>` (the engine formats a tool's declaration); the
# model's calls are `<|tool_call>call:name{...}<tool_call|>`, strings in
# them quoted `<|"|>`, a tool's answer `<|tool_response>response:...
# <tool_response|>`; its thoughts `<|channel>thought\n...<channel|>`.
GEMMA4_TEMPLATE = (
    "{% set thinking = enable_thinking is defined and enable_thinking %}"
    "{% set ns = namespace(previous=None) %}"
    "{% set loop_messages = messages %}"
    "{% set system = messages and messages[0]['role'] in ['system', 'developer'] %}"
    "{% if system %}{% set loop_messages = messages[1:] %}{% endif %}"
    "{% if thinking or tools or system %}"
    "<|turn>system\n{% if thinking %}<|think|>\n{% endif %}"
    "{% if system %}{% set message = messages[0] %}" + CONTENT + "{% endif %}"
    "{% if tools %}{% for tool in tools %}<|tool>{{ tool | trim }}<tool|>"
    "{% endfor %}{% endif %}"
    "<turn|>\n{% endif %}"
    "{% for message in loop_messages %}"
    "{% if message['role'] == 'tool' %}"
    "<|tool_response>response:" + CONTENT + "<tool_response|>"
    "{% set ns.previous = 'tool_response' %}"
    "{% else %}"
    "{% if message['role'] in ['assistant', 'model'] %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    # A model's answer to a tool's response continues its turn.
    "{% if ns.previous != 'tool_response' %}<|turn>{{ role }}\n{% endif %}"
    "{% set ns.previous = None %}"
    "{% if 'content' in message and message['content'] %}" + CONTENT + "{% endif %}"
    "{% if 'tool_calls' in message and message['tool_calls'] %}"
    "{% for tool_call in message['tool_calls'] %}"
    "{% if 'function' in tool_call %}{% set tool_call = tool_call['function'] %}"
    "{% endif %}"
    "<|tool_call>call:{{ tool_call['name'] }}{{ '{' }}"
    "{% if 'arguments' in tool_call %}"
    "{% for key in tool_call['arguments'] %}"
    "{% set value = tool_call['arguments'][key] %}"
    '{{ key }}:{% if value is string %}<|"|>{{ value }}<|"|>{% else %}{{ value }}'
    "{% endif %}{% if not loop.last %},{% endif %}"
    "{% endfor %}{% endif %}{{ '}' }}<tool_call|>"
    "{% endfor %}{% set ns.previous = 'tool_call' %}{% endif %}"
    "{% if ns.previous != 'tool_call' %}<turn|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt"
    " and ns.previous not in ['tool_call', 'tool_response'] %}"
    "<|turn>model\n{% endif %}"
)
GEMMA4 = TurnFormat(
    "gemma4",
    GEMMA4_TEMPLATE,
    ("<|turn>", "<turn|>"),
    "<turn|>",
    tool_calls={
        "code_fence_start": "<|tool_call>",
        "code_fence_end": "<tool_call|>",
        "syntax_type": "fc",
        "escape_fence_strings": True,
        "open_quote": '<|"|>',
        "close_quote": '<|"|>',
        "function_response_start": "<|tool_response>",
    },
    thinking=("thought", "<|channel>thought\n", "<channel|>"),
)
# Qwen3's: ChatML, with declared tools in the system turn (one JSON
# declaration a line inside `<tools>`), the model's calls as
# `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, a tool's
# answer as a user turn's `<tool_response>`; its thoughts `<think>...</think>`.
# A newline right after a tag is an expression: the engine renders as
# Hugging Face does, dropping the first newline after a block tag.
QWEN3_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% set system = messages and messages[0]['role'] == 'system' %}"
    "{% if system %}{% set loop_messages = messages[1:] %}{% endif %}"
    "{% if tools or system %}<|im_start|>system\n"
    "{% if system %}{% set message = messages[0] %}" + CONTENT + "{% endif %}"
    "{% if tools %}{% if system %}{{ '\\n\\n' }}{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | trim }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>{% endif %}<|im_end|>\n{% endif %}"
    "{% for message in loop_messages %}"
    "{% if message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n" + CONTENT + "{{ '\\n' }}</tool_response>"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n"
    "{% if 'content' in message and message['content'] %}" + CONTENT + "{% endif %}"
    "{% if 'tool_calls' in message and message['tool_calls'] %}"
    "{% for tool_call in message['tool_calls'] %}"
    "{% if 'function' in tool_call %}{% set tool_call = tool_call['function'] %}"
    "{% endif %}"
    "{{ '\\n' }}<tool_call>\n"
    '{"name": "{{ tool_call[\'name\'] }}", "arguments": '
    "{{ tool_call['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3 = TurnFormat(
    "qwen3",
    QWEN3_TEMPLATE,
    CHATML.tokens,
    CHATML.end_of_turn,
    tool_calls={
        "code_fence_start": "<tool_call>",
        "code_fence_end": "</tool_call>",
        "escape_fence_strings": True,
    },
    thinking=("thinking", "<think>", "</think>"),
)
# The turn formats kerasnorm writes, in the order a tokenizer's special
# tokens are matched against them where a family's row names none.
TURN_FORMATS = (GEMMA, CHATML, LLAMA3, GEMMA4, QWEN3)


@dataclasses.dataclass(frozen=True)
class Family:
    """One keras-hub CausalLM class's row (see the module docstring)."""

    name: str
    refused: str | None = None
    corrections: tuple[str, ...] = ()
    model_type: str = GENERIC
    turns: TurnFormat | None = None
    start_tokens: tuple[str, ...] = ()
    stop_tokens: tuple[str, ...] = ()


# The correction `hub_step` applies to GPT-NeoX: its attention rotates the
# query at positions from 0 whatever `cache_update_index` is (keras-hub
# 0.32), so its `generate()` drifts from its forward pass; the query is
# rotated from the step's start.
QUERY_ROTATION_FROM_START = "query_rotation_from_start"
# The correction `hub_step` applies to Qwen and Qwen2: with
# `use_sliding_window_attention`, their attention asks `if
# cache_update_index` of a tensor (keras-hub 0.32; `generate()` fails on
# it); the window is taken from the step's integer positions instead.
WINDOW_FROM_POSITIONS = "window_from_positions"

_ENCODER_DECODER = (
    "is an encoder-decoder (Seq2SeqLM): its decoder attends to the "
    "encoder's output, which the file has no input for; it would take an "
    "encoder signature and its output held beside the caches"
)
_LINEAR_ATTENTION = (
    "mixes linear-attention layers (a convolution window and a recurrent "
    "state per layer) with attention layers: the file would need those "
    "states beside the key/value caches"
)

ROWS = (
    # Any CausalLM without a nearer row, and any model that is not one.
    Family(
        "CausalLM",
        start_tokens=(
            "<s>",
            "<bos>",
            "<|begin_of_text|>",
            "<|im_start|>",
            "<|endoftext|>",
        ),
        stop_tokens=(
            "</s>",
            "<eos>",
            "<|end_of_text|>",
            "<|eot_id|>",
            "<|im_end|>",
            "<|endoftext|>",
        ),
    ),
    Family("BloomCausalLM"),
    Family("FalconCausalLM"),
    Family("GPT2CausalLM"),
    Family("GPTNeoXCausalLM", corrections=(QUERY_ROTATION_FROM_START,)),
    Family("GemmaCausalLM", turns=GEMMA),
    Family("Gemma3CausalLM", model_type="gemma3", turns=GEMMA),
    # Per-layer inputs, key/value sharing, larger global heads: the generic
    # step's own caches per layer (`hub_step._written`).
    Family("Gemma4CausalLM", model_type="gemma4", turns=GEMMA4),
    Family("GptOssCausalLM"),
    Family("LlamaCausalLM"),
    Family("Llama3CausalLM", turns=LLAMA3),
    Family("MistralCausalLM"),
    Family("MixtralCausalLM"),
    Family("OPTCausalLM"),
    Family("Phi3CausalLM"),
    Family(
        "QwenCausalLM",
        corrections=(WINDOW_FROM_POSITIONS,),
        model_type="qwen2p5",
        turns=CHATML,
    ),
    Family("QwenMoeCausalLM"),
    Family("Qwen3CausalLM", model_type="qwen3", turns=QWEN3),
    Family("Qwen3MoeCausalLM"),
    Family("SmolLM3CausalLM"),
    # Refused: a state the per-layer key/value caches do not hold, or an
    # input the file has none for.
    Family(
        "RWKV7CausalLM",
        refused=(
            "keeps a recurrent state per layer (RWKV's time mixing), not keys "
            "and values at positions: the file would need the state as its "
            "cache and a step that carries it"
        ),
    ),
    Family("Qwen3_5CausalLM", refused=_LINEAR_ATTENTION),
    Family("Qwen3_5MoeCausalLM", refused=_LINEAR_ATTENTION),
    Family(
        "PaliGemmaCausalLM",
        refused=(
            "reads an image: its prompt starts with the vision encoder's "
            "embeddings, which a text-only file has no input for"
        ),
    ),
    Family(
        "BLIP2CausalLM",
        refused=(
            "reads an image: its prompt starts with the Q-Former's query "
            "embeddings, which a text-only file has no input for"
        ),
    ),
    Family(
        "Gemma3nCausalLM",
        refused=(
            "reads images and audio and keeps per-layer inputs and key/value "
            "sharing across layers, which the file's per-layer caches do not "
            "hold"
        ),
    ),
    Family(
        "Gemma4AssistantCausalLM",
        refused=(
            "drafts from another model's hidden state and cache (speculative "
            "decoding), not from token ids: pass it as its Gemma4CausalLM's "
            "drafter= (to_litert_lm(base, path, drafter=assistant))"
        ),
    ),
    Family(
        "PARSeqCausalLM",
        refused=(
            "reads text from an image: its decoder attends to the image's "
            "features and keeps a cache of queries as well as content"
        ),
    ),
    Family("Seq2SeqLM", refused=_ENCODER_DECODER),
    Family("BartSeq2SeqLM", refused=_ENCODER_DECODER),
    Family("BLIP2Seq2SeqLM", refused=_ENCODER_DECODER),
    Family("EdRecSeq2SeqLM", refused=_ENCODER_DECODER),
    Family("MoonshineAudioToText", refused=_ENCODER_DECODER),
    Family("T5Seq2SeqLM", refused=_ENCODER_DECODER),
    Family("T5GemmaSeq2SeqLM", refused=_ENCODER_DECODER),
    Family("T5Gemma2Seq2SeqLM", refused=_ENCODER_DECODER),
)

# Class name -> row: the table every reader looks up (through `family_of`).
FAMILIES = {row.name: row for row in ROWS}
if len(FAMILIES) != len(ROWS):  # pragma: no cover - a row named twice
    raise RuntimeError("kerasnorm: a keras-hub class has two family rows")


def family_of(model) -> Family:
    """`model`'s row: the nearest class in its MRO with a row, else the
    `CausalLM` row."""
    for cls in type(model).__mro__:
        if cls.__name__ in FAMILIES:
            return FAMILIES[cls.__name__]
    return FAMILIES["CausalLM"]


def start_hints(row: Family) -> tuple[str, ...]:
    """The start tokens to look for: `row`'s, then the `CausalLM` row's."""
    return _hints(row.start_tokens, FAMILIES["CausalLM"].start_tokens)


def stop_hints(row: Family) -> tuple[str, ...]:
    """The end tokens to look for: `row`'s, then the `CausalLM` row's."""
    return _hints(row.stop_tokens, FAMILIES["CausalLM"].stop_tokens)


def _hints(first, then):
    return tuple(dict.fromkeys((*first, *then)))
