"""The prompts a generative file is checked on when none are given.

A model with a tokenizer (a keras-hub `CausalLM` with a preprocessor) is
checked on real text: `VERIFY_TEXTS`, a few plain English sentences,
tokenized with the model's own tokenizer (its start token first where its
preprocessor adds one). Random ids judge a real model on text it never
sees: its logits there are flat, their top two close, and a quantized file
loses the greedy token far more often than on text (issue 58: 77 % on
invented prompts, 85 % on real ones, for the same SmolLM2 file). A model
without one is checked on two prompts of random ids (`invented_prompts`).
"""

from __future__ import annotations

import numpy as np

# Where the check's prompts came from (`GenerationCheck.source`).
GIVEN, TEXT, INVENTED = "verify_inputs", "tokenizer text", "invented"
# Generated after each prompt and compared (the check's `NEW_TOKENS`).
NEW_TOKENS = 12
# Plain English of several registers: narrative, instructions, history, a
# question answered. Each is a prompt of its own.
VERIFY_TEXTS = (
    "The weather was cold and grey when the train finally left the station, "
    "and most of the passengers fell asleep long before it reached the coast.",
    "To make bread, mix flour, water, salt and yeast into a soft dough, let it "
    "rise for an hour, shape it into a loaf and bake it until the crust is brown.",
    "In 1969 two astronauts walked on the surface of the Moon while a third "
    "orbited above them, and hundreds of millions of people watched on television.",
    "Question: What is the capital of France? Answer: The capital of France is "
    "Paris, a city known for its museums, its cafes and the Eiffel Tower.",
)
# What GPTQ (and smoothing, where asked) calibrates on when the check's
# prompts are `VERIFY_TEXTS`: other text, so that the check judges the
# rounding on text it was not fitted to (`calibration_prompts`). Several
# registers again, longer, none of the check's sentences.
CALIBRATION_TEXTS = (
    "Dear Anna, thank you for your letter and for the photographs of the "
    "garden. We arrived home on Sunday after a long drive through the "
    "mountains. The children slept most of the way, and we stopped twice for "
    "coffee in small villages where nobody seemed to be in a hurry. Next "
    "month we hope to visit you, if the roads are open and the weather "
    "allows it. Please write again soon and tell us how your father is.",
    "A battery stores energy in chemical form and releases it as an electric "
    "current when a circuit connects its two terminals. Inside, ions move "
    "through an electrolyte from one electrode to the other, while electrons "
    "flow through the outer circuit. When the battery is charged, the process "
    "runs backwards. Its capacity is measured in ampere hours, and its "
    "voltage depends on the materials of the electrodes.",
    "User: Can you recommend a good book for a long flight?\nAssistant: Sure. "
    "If you enjoy adventure, try a classic sea story; if you prefer something "
    "quiet, a collection of short stories is easy to pick up and put down. "
    "Would you like suggestions in a particular genre?\nUser: Something "
    "about history, please.\nAssistant: Then a popular account of an ancient "
    "empire would keep you busy for hours.",
    "The city council met on Tuesday evening to discuss the new bus routes. "
    "Several residents said that the changes would leave the northern "
    "districts without a direct connection to the hospital. The transport "
    "office replied that a shuttle would run every twenty minutes during the "
    "day. A final decision is expected next week, after a second public "
    "meeting in the library.",
    "def average(numbers):\n    if not numbers:\n        raise ValueError("
    "'empty list')\n    total = 0\n    for n in numbers:\n        total += n\n"
    "    return total / len(numbers)\n\nprint(average([3, 4, 5]))  # 4.0\n",
    "Water boils at one hundred degrees Celsius at sea level, but at lower "
    "temperatures high in the mountains, where the air pressure is lower. "
    "That is why pasta takes longer to cook there. Salt raises the boiling "
    "point only a little; cooks add it for the taste.",
)
# Text prompts are teacher-forced from this many tokens on: each later
# position of the text is a step of the check.
TEXT_HEAD = 4


def invented_prompts(vocabulary_size, max_sequence_length, seed=0):
    """Two prompts of random ids (3 and 7 tokens, fewer in a short context)."""
    rng = np.random.default_rng(seed)
    lengths = [min(n, max(1, max_sequence_length // 4)) for n in (3, 7)]
    return [rng.integers(1, vocabulary_size, n).tolist() for n in lengths]


def text_prompts(model, vocabulary_size, max_sequence_length, texts=VERIFY_TEXTS):
    """`texts` as token ids of `model`'s own tokenizer, each cut to leave
    room for the generated tokens; None when the model has no tokenizer, a
    text gives ids outside the vocabulary, or the context is too short for
    more than `TEXT_HEAD` tokens of text."""
    preprocessor = getattr(model, "preprocessor", None)
    tokenizer = getattr(preprocessor, "tokenizer", None)
    if tokenizer is None:
        return None
    room = max_sequence_length - 1 - min(NEW_TOKENS, max_sequence_length // 2)
    if room <= TEXT_HEAD:
        return None
    start = getattr(tokenizer, "start_token_id", None)
    if not getattr(preprocessor, "add_start_token", False):
        start = None
    prompts = []
    for text in texts:
        ids = np.asarray(tokenizer(text)).reshape(-1).astype(int).tolist()
        if start is not None:
            ids = [int(start), *ids]
        ids = ids[:room]
        if len(ids) <= TEXT_HEAD or not all(0 <= i < vocabulary_size for i in ids):
            return None
        prompts.append(ids)
    return prompts


def check_prompts(verify_inputs, model, vocabulary, max_sequence_length):
    """The check's prompts and where they came from: `verify_inputs`, else
    `prompts.VERIFY_TEXTS` in the model's tokenizer, else random ids."""
    if verify_inputs is None:
        texts = text_prompts(model, vocabulary, max_sequence_length)
        if texts is not None:
            return texts, TEXT
        return invented_prompts(vocabulary, max_sequence_length), INVENTED
    prompts = [np.asarray(p).reshape(-1).astype(int).tolist() for p in verify_inputs]
    for prompt in prompts:
        if not 1 <= len(prompt) < max_sequence_length:
            raise ValueError(
                f"A verify_inputs prompt has {len(prompt)} tokens; a prompt "
                f"needs 1 to max_sequence_length - 1 = {max_sequence_length - 1}"
                " tokens (room for one generated token). Shorten it or export "
                "with a larger max_sequence_length."
            )
    return prompts, GIVEN


def calibration_prompts(prompts, source, model, vocabulary, max_sequence_length):
    """The sequences the weights are fitted to (GPTQ, smoothing): the user's
    `verify_inputs` (`GIVEN`) as they are; for `TEXT`, `CALIBRATION_TEXTS`
    in the model's tokenizer, held out from the check's prompts (fitted to
    the check's own text, GPTQ flattered it: SmolLM2-135M-Instruct's int4
    file agreed 0.976 with its check, 0.713 on a paragraph of other text);
    `INVENTED` prompts as they are (GPTQ does not fit to them)."""
    if source != TEXT:
        return prompts
    held = text_prompts(model, vocabulary, max_sequence_length, CALIBRATION_TEXTS)
    return prompts if held is None else held
