"""The one table of keras-hub families (`litert_lm.families`): every
CausalLM class keras-hub exports has exactly one row, the matching rule is
the nearest class in the MRO, and a family added by one row reaches every
reader (the refusal, the turn format and model type, the tokenizer's stop
token, the hand-written step) — each through the table, so a reader that
kept its own list would fail here."""

import json

import keras
import pytest

from kerasnorm.export import to_litert_lm
from kerasnorm.export.litert_lm import families
from kerasnorm.export.litert_lm.cached import CachePathError
from kerasnorm.export.litert_lm.chat import chat_of
from kerasnorm.export.litert_lm.hub_step import refusal
from kerasnorm.export.litert_lm.tokenizer import resolve_tokenizer

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only


def _causal_lm_classes():
    models = keras_hub.models
    return {
        value
        for value in vars(models).values()
        if isinstance(value, type) and issubclass(value, models.CausalLM)
    }


def test_every_keras_hub_causal_lm_class_has_exactly_one_row():
    """Each class keras-hub exports (aliases are one class) has a row of its
    own name, and every row names a class keras-hub has: no class falls
    back to an ancestor's row unnoticed, no row is stale."""
    classes = _causal_lm_classes()
    names = [cls.__name__ for cls in classes]
    assert len(names) == len(set(names))
    for cls in classes:
        rows = [row for row in families.ROWS if row.name == cls.__name__]
        assert len(rows) == 1, cls.__name__
        assert families.family_of(object.__new__(cls)) is rows[0]
    assert {row.name for row in families.ROWS} == set(names)


def test_the_nearest_class_in_the_mro_matches():
    class MyGemma(keras_hub.models.GemmaCausalLM):
        pass

    class MyLlama3(keras_hub.models.Llama3CausalLM):
        pass

    assert families.family_of(object.__new__(MyGemma)).name == "GemmaCausalLM"
    # Llama 3's row, not its parent Llama's.
    assert families.family_of(object.__new__(MyLlama3)).turns is families.LLAMA3
    # A model that is no CausalLM gets the generic row.
    assert families.family_of(keras.Sequential()).name == "CausalLM"


class TinyLM(keras_hub.models.GPT2CausalLM):
    """A family keras-hub does not have: GPT-2's model under a new class."""


def _tiny():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=16,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=16,
    )
    return TinyLM(backbone=backbone, preprocessor=None)


def _tokenizer_json(path, tokens):
    vocab = {f"w{i}": i for i in range(16 - len(tokens))}
    added = [
        {"id": 16 - len(tokens) + i, "content": t, "special": True}
        for i, t in enumerate(tokens)
    ]
    path.write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": added}))
    return path


def test_a_family_is_added_by_one_row(monkeypatch, tmp_path):
    """One row for `TinyLM` gives it LiteRT-LM's model type, Llama 3's turn
    format (where the tokenizer's tokens alone would make ChatML), its own
    end token (before the generic row's `</s>`), and no hand-written step;
    other rows give it one, or refuse it with the row's reason."""
    model = _tiny()
    tokens = ["</s>", "<|stop|>", "<|im_start|>", "<|im_end|>"]
    tokens += ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    path = _tokenizer_json(tmp_path / "tokenizer.json", tokens)
    vocabulary = resolve_tokenizer(model, str(path)).vocabulary

    # Before the row: GPT-2's (no turn format: the one the tokenizer's
    # tokens make, ChatML first; the generic end token).
    chat = chat_of(model, vocabulary)
    assert (chat.model_type, chat.template) == (
        families.GENERIC,
        families.CHATML.template,
    )
    assert resolve_tokenizer(model, str(path)).stop_tokens == (vocabulary["</s>"],)
    assert refusal(model, families.family_of(model)) is None

    row = families.Family(
        "TinyLM", model_type="qwen3", turns=families.LLAMA3, stop_tokens=("<|stop|>",)
    )
    monkeypatch.setitem(families.FAMILIES, "TinyLM", row)
    chat = chat_of(model, vocabulary)
    assert (chat.model_type, chat.template) == ("qwen3", families.LLAMA3.template)
    assert (chat.stop_tokens, chat.note) == (("<|eot_id|>",), "llama3 turn format")
    resolved = resolve_tokenizer(model, str(path))
    assert resolved.stop_tokens == (vocabulary["<|stop|>"],)

    monkeypatch.setitem(
        families.FAMILIES,
        "TinyLM",
        families.Family("TinyLM", refused="keeps a state no file holds"),
    )
    with pytest.raises(CachePathError, match=r"TinyLM .* keeps a state no file holds"):
        to_litert_lm(model, tmp_path / "lm.tflite", max_sequence_length=8)
