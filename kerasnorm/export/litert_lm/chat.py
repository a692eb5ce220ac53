"""What makes a `.litertlm` bundle a chat model to LiteRT-LM's engine: the
model type, the Jinja chat template (the family's turn format, or the
user's), and the end-of-turn token among the stop tokens.

The engine's conversation API (`Engine.create_conversation`, messages with
roles) renders the messages with the bundle's template and stops at its stop
tokens. A family's turn format is written only when the tokenizer holds its
turn tokens as single tokens (the format the model was trained on); where
it does not, or the family has none, the turn format whose tokens the
tokenizer holds (ChatML's `<|im_start|>`/`<|im_end|>`...); otherwise the
bundle has no template and the result says why. A template the user gives
(a Hugging Face one, which reads each message's content as a string) is
written to read the engine's content parts (`parts_template`).
"""

from __future__ import annotations

import dataclasses
import os

from kerasnorm.export.litert_lm.families import TURN_FORMATS
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


# Prepended to a chat template the user gives: the engine passes a
# message's content as a list of parts ({"type": "text", "text": ...}), a
# Hugging Face template reads it as a string (`'<|im_start|>' + message[
# 'content']`). `messages` is rebuilt with each content the join of its text
# parts (a string stays as it is); the template below reads it unchanged.
# No whitespace control: the template's own first characters are kept.
PARTS_PREAMBLE = (
    "{% set _kerasnorm = namespace(messages=[], text='') %}"
    "{% for _message in messages %}"
    "{% if _message['content'] is string %}"
    "{% set _kerasnorm.text = _message['content'] %}"
    "{% else %}{% set _kerasnorm.text = '' %}"
    "{% for _part in _message['content'] %}"
    "{% if _part['type'] == 'text' %}"
    "{% set _kerasnorm.text = _kerasnorm.text + _part['text'] %}"
    "{% endif %}{% endfor %}{% endif %}"
    "{% set _kerasnorm.messages = _kerasnorm.messages"
    " + [dict(_message, content=_kerasnorm.text)] %}"
    "{% endfor %}"
    "{% set messages = _kerasnorm.messages %}"
)

# The conversations a rewritten template is checked on, the shortest first
# (a template may refuse a system turn, or one that does not alternate).
_SAMPLES = (
    [("user", "Hello there.")],
    [("user", "Hello there."), ("assistant", "Hi!"), ("user", "What is 2+2?")],
    [
        ("system", "You are terse."),
        ("user", "Hello there."),
        ("assistant", "Hi!"),
        ("user", "What is 2+2?"),
    ],
)


def parts_template(template):
    """`template` as the bundle holds it, checked with jinja2 on sample
    conversations (`_SAMPLES`).

    A template that renders each message's text from content parts (the
    engine's messages) is written as it is. Any other (a Hugging Face
    template, which reads a string) gets `PARTS_PREAMBLE`, and each sample
    it renders with string contents must render the same with the rewritten
    template and parts contents. `ValueError` where jinja2 cannot parse it,
    it renders no sample, or the rewrite renders differently.
    """
    try:
        import jinja2
        import jinja2.sandbox
    except ImportError as e:  # pragma: no cover - the extra installs it
        raise ImportError(
            "A `.litertlm` with chat_template= needs the `jinja2` package, "
            "which checks the template: pip install 'kerasnorm[litert_lm]'."
        ) from e

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment()
    environment.globals["raise_exception"] = raise_exception
    written = PARTS_PREAMBLE + template
    try:
        original = environment.from_string(template)
        rewritten = environment.from_string(written)
    except jinja2.TemplateError as error:
        raise ValueError(
            "to_litert_lm: the chat template is not a Jinja template jinja2 "
            f"parses: {type(error).__name__}: {error}"
        ) from error
    samples = [_rendered(original, sample, parts=False) for sample in _SAMPLES]
    if all(isinstance(r, Exception) for r in samples):
        raise ValueError(
            "to_litert_lm: the chat template renders no conversation of a "
            f"user's message (with replies, a system message): {samples[0]}"
        )
    if all(_reads_parts(original, sample) for sample in _SAMPLES):
        return template
    for sample, expected in zip(_SAMPLES, samples, strict=True):
        if isinstance(expected, Exception):  # it refuses this conversation
            continue
        got = _rendered(rewritten, sample, parts=True)
        if got != expected:
            raise ValueError(
                "to_litert_lm: the chat template cannot be rewritten to read "
                "LiteRT-LM's content parts (a list of {'type': 'text', "
                "'text': ...} per message): a conversation it renders as "
                f"{expected!r} with string contents renders as {got!r}. Pass "
                "chat_template= a template that reads message['content'] "
                "as a list of parts."
            )
    return written


def _rendered(template, sample, parts):
    """`template` rendered on `sample` ((role, text) pairs), each content a
    string or a list of one text part; the exception where it raises."""
    messages = [
        {"role": r, "content": [{"type": "text", "text": t}] if parts else t}
        for r, t in sample
    ]
    try:
        return template.render(messages=messages, add_generation_prompt=True)
    except Exception as error:
        return error


def _reads_parts(template, sample):
    """Whether `template` renders every text of `sample` from parts contents
    (not a part's printed form)."""
    got = _rendered(template, sample, parts=True)
    return (
        isinstance(got, str)
        and "'type'" not in got
        and all(t in got for _, t in sample)
    )


def user_template(chat_template):
    """`chat_template=`: a Jinja string, or the path of a file holding one,
    as the bundle holds it (`parts_template`)."""
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
    return parts_template(chat_template)


def chat_of(model, vocabulary, chat_template=None):
    """The bundle's `Chat` for `model` whose tokenizer holds `vocabulary`
    (token text -> id).

    The model type is the family row's (`families`). The turn format is the
    row's when the tokenizer holds its turn tokens, else the first of
    `families.TURN_FORMATS` whose turn tokens the tokenizer holds (a
    `Llama3CausalLM` with ChatML's `<|im_start|>`/`<|im_end|>`, as
    SmolLM2's), else none; its end-of-turn token is a stop token. The
    template is `chat_template` (see `user_template`) where given, else the
    turn format's.
    """
    row = family_of(model)
    template = user_template(chat_template)
    turns, inferred = row.turns, False
    if turns is None or not _holds(vocabulary, turns):
        found = next((f for f in TURN_FORMATS if _holds(vocabulary, f)), None)
        turns, inferred = (found, True) if found is not None else (turns, False)
    stops = ()
    if turns is not None and turns.end_of_turn in vocabulary:
        stops = (turns.end_of_turn,)
    if template is not None:
        note = "the chat template given"
        if template.startswith(PARTS_PREAMBLE):
            note += ", written to read the engine's content parts"
        return Chat(row.model_type, template, stops, note)
    if turns is None:
        return Chat(
            row.model_type,
            None,
            stops,
            f"no chat template: kerasnorm knows no turn format of "
            f"{type(model).__name__}, and the tokenizer holds none of "
            "ChatML's, Gemma's or Llama 3's turn tokens; pass chat_template= "
            "(--chat-template FILE) for the conversation API",
        )
    if not _holds(vocabulary, turns):
        missing = [t for t in turns.tokens if t not in vocabulary]
        return Chat(
            row.model_type,
            None,
            stops,
            f"no chat template: the tokenizer lacks {row.name}'s turn token(s) "
            f"{', '.join(missing)}; pass chat_template= (--chat-template FILE) "
            "for the conversation API",
        )
    note = f"{turns.name} turn format"
    if inferred:
        note += (
            f", inferred from the tokenizer's special tokens {', '.join(turns.tokens)}"
        )
    return Chat(
        row.model_type,
        turns.template,
        stops,
        note,
        tool_calls=turns.tool_calls,
        thinking=turns.thinking,
    )


def _holds(vocabulary, turns):
    """Whether the tokenizer holds every turn token of `turns`."""
    return all(t in vocabulary for t in turns.tokens)
