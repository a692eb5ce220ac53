"""What makes a `.litertlm` bundle a chat model to LiteRT-LM's engine: the
model type, the Jinja chat template (the family's turn format, or the
user's), and the end-of-turn token among the stop tokens.

The engine's conversation API (`Engine.create_conversation`, messages with
roles) renders the messages with the bundle's template and stops at its stop
tokens. A family's turn format is written only when the tokenizer holds its
turn tokens as single tokens (the format the model was trained on);
otherwise the bundle has no template and the result says why.
"""

from __future__ import annotations

import dataclasses
import os

GENERIC = "generic_model"

# The text of a message, whether the engine passes a string or a list of
# parts ({"type": "text", "text": ...}).
_CONTENT = (
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
)

GEMMA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] in ['assistant', 'model'] %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "<start_of_turn>{{ role }}\n" + _CONTENT + "<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n" + _CONTENT + "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    + _CONTENT
    + "<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class TurnFormat:
    """A family's turn format: its template, the tokens it is made of, and
    the token that ends a turn."""

    name: str
    template: str
    tokens: tuple[str, ...]
    end_of_turn: str


GEMMA = TurnFormat(
    "gemma", GEMMA_TEMPLATE, ("<start_of_turn>", "<end_of_turn>"), "<end_of_turn>"
)
CHATML = TurnFormat(
    "chatml", CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>"), "<|im_end|>"
)
LLAMA3 = TurnFormat(
    "llama3",
    LLAMA3_TEMPLATE,
    ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "<|eot_id|>",
)

# keras-hub CausalLM class -> (LiteRT-LM model type, turn format or None).
FAMILIES = {
    "GemmaCausalLM": (GENERIC, GEMMA),
    "Gemma3CausalLM": ("gemma3", GEMMA),
    "QwenCausalLM": ("qwen2p5", CHATML),
    "Qwen3CausalLM": ("qwen3", CHATML),
    "Llama3CausalLM": (GENERIC, LLAMA3),
}


@dataclasses.dataclass(frozen=True)
class Chat:
    """The chat part of a bundle's metadata.

    `model_type` is LiteRT-LM's (`"gemma3"`, `"qwen3"`, `"qwen2p5"`,
    `"generic_model"`); `template` the Jinja chat template (None: none);
    `stop_tokens` the end-of-turn token(s) to stop at besides the
    tokenizer's end token; `note` what the result says about the template
    (where it came from, or why there is none).
    """

    model_type: str
    template: str | None
    stop_tokens: tuple[str, ...]
    note: str


def _family(model):
    """The keras-hub CausalLM class name the model is (or derives from)."""
    for cls in type(model).__mro__:
        if cls.__name__ in FAMILIES:
            return cls.__name__
    return type(model).__name__


def user_template(chat_template):
    """`chat_template=`: a Jinja string, or the path of a file holding one."""
    if chat_template is None:
        return None
    if isinstance(chat_template, os.PathLike):
        chat_template = os.fspath(chat_template)
    if not isinstance(chat_template, str) or not chat_template.strip():
        raise ValueError(
            "to_litert_lm: `chat_template` is a Jinja template (a string with "
            "`{% for message in messages %}`...) or the path of a file holding "
            f"one. Received: chat_template={chat_template!r}"
        )
    if "{" not in chat_template and "\n" not in chat_template:
        if not os.path.isfile(chat_template):
            raise FileNotFoundError(
                f"to_litert_lm: chat_template={chat_template!r} is neither a "
                "Jinja template nor a file that exists."
            )
        with open(chat_template, encoding="utf-8") as f:
            chat_template = f.read()
    if "messages" not in chat_template:
        raise ValueError(
            "to_litert_lm: the chat template never reads `messages`, the "
            "conversation LiteRT-LM's engine renders with it. Received: "
            f"chat_template={chat_template[:80]!r}"
        )
    return chat_template


def chat_of(model, vocabulary, chat_template=None):
    """The bundle's `Chat` for `model` whose tokenizer holds `vocabulary`
    (token text -> id).

    The model type is the family's where LiteRT-LM has one. The template is
    `chat_template` (see `user_template`) where given, else the family's
    turn format when the tokenizer holds its turn tokens, else none.
    """
    family = _family(model)
    model_type, turns = FAMILIES.get(family, (GENERIC, None))
    template = user_template(chat_template)
    stops = ()
    if turns is not None and turns.end_of_turn in vocabulary:
        stops = (turns.end_of_turn,)
    if template is not None:
        return Chat(model_type, template, stops, "the chat template given")
    if turns is None:
        return Chat(
            model_type,
            None,
            stops,
            f"no chat template: kerasnorm knows no turn format of {family}; "
            "pass chat_template= (--chat-template FILE) for the conversation "
            "API",
        )
    missing = [t for t in turns.tokens if t not in vocabulary]
    if missing:
        return Chat(
            model_type,
            None,
            stops,
            f"no chat template: the tokenizer lacks {family}'s turn token(s) "
            f"{', '.join(missing)}; pass chat_template= (--chat-template FILE) "
            "for the conversation API",
        )
    return Chat(model_type, turns.template, stops, f"{turns.name} turn format")
