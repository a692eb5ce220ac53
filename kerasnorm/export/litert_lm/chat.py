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

from kerasnorm.export.litert_lm.families import family_of


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
    # The turn format's tool-call fields and reasoning channel (`TurnFormat`),
    # where the bundle's template is the family's own.
    tool_calls: dict | None = None
    thinking: tuple[str, str, str] | None = None


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

    The model type and turn format are the family row's (`families`). The
    template is `chat_template` (see `user_template`) where given, else the
    family's turn format when the tokenizer holds its turn tokens, else
    none.
    """
    row = family_of(model)
    family, model_type, turns = row.name, row.model_type, row.turns
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
            f"no chat template: kerasnorm knows no turn format of "
            f"{type(model).__name__}; "
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
    return Chat(
        model_type,
        turns.template,
        stops,
        f"{turns.name} turn format",
        tool_calls=turns.tool_calls,
        thinking=turns.thinking,
    )
