"""Speculative decoding (issue 60 item 3): a Gemma 4 base and its
`Gemma4AssistantCausalLM` drafter as one `.litertlm` bundle. The base's
`verify` signature is checked against the base's forward pass (logits) and
the hidden states keras-hub's `generate()` hands its assistant
(activations); the drafter file against keras-hub's assistant; in
LiteRT-LM's engine, greedy text with `enable_speculative_decoding` equals
the text without it and the base's own."""

import importlib.util
import os

import numpy as np
import pytest

from kerasnorm.export.litert_lm.export import to_litert_lm
from tests.export import drafter_models
from tests.export import lm_models
from tests.support.once import once

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only
CONTEXT = 16
DRAFT_STEPS = 3


def _reference(base, ids):
    """The base's full forward logits, and the hidden states and cache of
    its cached call from position 0 (keras-hub's own, no kerasnorm)."""
    from keras import ops

    ids = np.asarray(ids, np.int32)[None]
    logits = base(
        {
            "token_ids": ids,
            "padding_mask": np.ones_like(ids, bool),
            "position_ids": np.arange(ids.shape[1], dtype=np.int32)[None],
        }
    )
    backbone = base.backbone
    size = max(
        max(layer.attention.head_dim for layer in backbone.transformer_layers), 1
    )
    heads = max(
        layer.attention.effective_num_kv_heads for layer in backbone.transformer_layers
    )
    cache = ops.zeros(
        (1, len(backbone.transformer_layers), 2, ids.shape[1], heads, size)
    )
    _, hidden, cache = base.call_with_cache(ids, cache, 0)
    return np.asarray(logits)[0], np.asarray(hidden)[0], cache


def _written(base, drafter):
    from kerasnorm.export.litert_lm.speculative_files import write_speculative

    return write_speculative(
        base,
        drafter,
        max_sequence_length=CONTEXT,
        prefill_lengths=(8,),
        draft_steps=DRAFT_STEPS,
    )


def _files(ordered):
    def build():
        base = lm_models.gemma4_causal_lm("per_layer", seed=0)
        drafter = drafter_models.gemma4_assistant(
            base, ordered=ordered, draft_steps=DRAFT_STEPS
        )
        return base, drafter, _written(base, drafter)

    return once(f"litert_lm_speculative.files.{ordered}", build)


def test_verify_and_the_drafter_compute_the_models():
    """Default tier: random weights. The base's `verify` (4 tokens at
    positions 5 to 8, after a prefill of 5) against the forward pass and
    the cached call's hidden states; the drafter file at each of those
    positions, on the caches `verify` wrote, against keras-hub's assistant
    on keras-hub's own cache."""
    from kerasnorm.export.litert_lm.speculative_check import SpeculativeFileRunner

    base, drafter, files = _files(ordered=True)
    assert files.signatures == {"prefill": 8, "decode": 1, "verify": 4}
    sequence = [int(t) for t in lm_models.rule_sequences(1, seed=3)[0, :9]]
    logits, hidden, cache = _reference(base, sequence)
    runner = SpeculativeFileRunner(files, files.cache_length)
    runner.run("prefill", sequence[:5], 0)
    out = runner.run("verify", sequence[5:9], 5)
    scale = np.abs(logits[5:9]).max()
    assert np.abs(out["logits"][0] - logits[5:9]).max() <= 1e-4 * scale
    assert (
        np.abs(out["activations"][0] - hidden[5:9]).max() <= 1e-4 * np.abs(hidden).max()
    )
    sources = {"global": 1, "sliding": 2}  # the last layer of each kind writing one
    embedded, _ = runner.embedded(sequence)
    for p in range(5, 8):
        got_logits, got_projected = runner.draft(
            sequence[p + 1], out["activations"][:, p - 5][None], p
        )
        want_logits, want_projected = drafter.call_with_cache(
            last_token_embedding=embedded[:, p + 1 : p + 2],
            last_hidden_state=hidden[None, p : p + 1],
            target_cache=cache,
            cache_update_index=p,
            target_kv_source_full_idx=sources["global"],
            target_kv_source_local_idx=sources["sliding"],
        )
        want_logits = np.asarray(want_logits)
        assert (
            np.abs(got_logits - want_logits).max() <= 1e-4 * np.abs(want_logits).max()
        )
        assert np.allclose(got_projected, np.asarray(want_projected), atol=1e-5)
    # The embedder is the base's scaled token embedding.
    table = np.asarray(base.backbone.token_embedding.embeddings)
    np.testing.assert_allclose(
        embedded[0], table[sequence] * np.sqrt(32.0), rtol=1e-6, atol=1e-6
    )


def test_a_base_with_lora_is_written_with_its_adapters_merged():
    """A base with `enable_lora` (adapters nonzero): `verify` computes the
    LoRA model's logits, not the base's without them."""
    from kerasnorm.export.litert_lm.speculative_check import SpeculativeFileRunner

    base = lm_models.gemma4_causal_lm("per_layer", seed=0)
    drafter = drafter_models.gemma4_assistant(base, draft_steps=DRAFT_STEPS)
    sequence = [int(t) for t in lm_models.rule_sequences(1, seed=3)[0, :9]]
    without, _, _ = _reference(base, sequence)
    base.backbone.enable_lora(2)
    rng = np.random.default_rng(0)
    adapters = [w for w in base.backbone.weights if "lora_kernel_b" in w.path]
    assert adapters
    for w in adapters:
        w.assign(rng.standard_normal(w.shape).astype("float32") * 0.5)
    logits, _, _ = _reference(base, sequence)
    scale = np.abs(logits[5:9]).max()
    assert np.abs(logits[5:9] - without[5:9]).max() > 0.05 * scale
    files = _written(base, drafter)
    runner = SpeculativeFileRunner(files, files.cache_length)
    runner.run("prefill", sequence[:5], 0)
    out = runner.run("verify", sequence[5:9], 5)
    assert np.abs(out["logits"][0] - logits[5:9]).max() <= 1e-4 * scale


def test_the_file_layout_is_the_engines():
    """The names and shapes LiteRT-LM's drafter reads
    (`llm_litert_mtp_drafter.cc`): `verify` takes `input_pos` of `draft
    steps + 1`, `embeddings`, `per_layer_embeddings` and every cache, and
    returns `logits` and `activations`; the drafter's one signature takes
    `activations` of twice the width, `input_pos` and the caches it reads
    under the base's names, and returns `logits` and
    `projected_activations`."""
    from kerasnorm.export.litert.runner import unallocated

    base, _, files = _files(ordered=True)
    verify = unallocated(files.base).get_signature_runner("verify")
    inputs = {n: tuple(d["shape"]) for n, d in verify.get_input_details().items()}
    outputs = {n: tuple(d["shape"]) for n, d in verify.get_output_details().items()}
    caches = {n: s for n, s in inputs.items() if n.startswith("kv_cache_")}
    length = CONTEXT + DRAFT_STEPS + 1
    assert inputs.pop("input_pos") == (4,)
    assert inputs.pop("embeddings") == (1, 4, 32)
    assert inputs.pop("per_layer_embeddings") == (1, 4, 4, 32)
    assert set(inputs) == set(caches) and len(caches) == 6
    assert all(s[2] == length for s in caches.values())
    assert outputs.pop("logits") == (1, 4, 24)
    assert outputs.pop("activations") == (1, 4, 32)
    assert outputs == caches
    interp = unallocated(files.drafter)
    (key,) = interp.get_signature_list()
    runner = interp.get_signature_runner(key)
    inputs = {n: tuple(d["shape"]) for n, d in runner.get_input_details().items()}
    outputs = {n: tuple(d["shape"]) for n, d in runner.get_output_details().items()}
    assert inputs.pop("activations") == (1, 1, 64)
    assert inputs.pop("input_pos") == (1,)
    assert inputs == {n: caches[n] for n in inputs} and len(inputs) == 4
    assert outputs == {"logits": (1, 1, 24), "projected_activations": (1, 1, 32)}
    del base


def _pair(config="per_layer", **assistant):
    base = lm_models.gemma4_causal_lm(config, seed=0)
    return base, drafter_models.gemma4_assistant(base, **assistant)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not_a_drafter", "takes a keras-hub Gemma4AssistantCausalLM"),
        ("not_gemma4", "drafts for a Gemma4CausalLM"),
        ("no_per_layer", "has no per-layer inputs"),
        ("unordered", "token_ordering is not an ordering"),
        ("quantized", "takes none of \\['quantize'\\]"),
        ("runtime_lora", "takes none of \\['lora', 'lora_rank'\\]"),
        ("tflite", "goes into a `.litertlm` bundle"),
    ],
)
def test_pairs_that_do_not_draft_are_refused_by_name(case, message, tmp_path):
    base, drafter = _pair()
    options = {}
    path = tmp_path / "lm.litertlm"
    if case == "not_a_drafter":
        drafter = lm_models.gemma4_causal_lm("per_layer", seed=1)
    elif case == "not_gemma4":
        base = lm_models.hub_causal_lm("gemma3", seed=0)
    elif case == "no_per_layer":
        base = lm_models.gemma4_causal_lm("dense", seed=0)
    elif case == "unordered":
        drafter = drafter_models.gemma4_assistant(base, ordered=True)
        drafter.token_ordering.assign(np.zeros(24, "float32"))
    elif case == "quantized":
        options["quantize"] = "dynamic"
    elif case == "runtime_lora":
        options.update(lora="runtime", lora_rank=16)
    else:
        path = tmp_path / "lm.tflite"
    with pytest.raises((TypeError, ValueError), match=message):
        to_litert_lm(
            base, path, max_sequence_length=CONTEXT, drafter=drafter, **options
        )
    assert not path.exists()


def test_a_drafter_reading_other_caches_is_refused(tmp_path):
    base = lm_models.gemma4_causal_lm("per_layer", seed=0)
    drafter = drafter_models.gemma4_assistant(base)
    wide = lm_models.gemma4_causal_lm("per_layer", seed=0, hidden_dim=64)
    with pytest.raises(TypeError, match="reads activations of width 32"):
        to_litert_lm(
            wide, tmp_path / "lm.litertlm", max_sequence_length=CONTEXT, drafter=drafter
        )


@pytest.fixture(scope="module")
def trained_pair(tmp_path_factory):
    def build():
        directory = tmp_path_factory.mktemp("speculative")
        base = lm_models.gemma4_chat_lm(str(directory))
        drafter = drafter_models.gemma4_assistant(base, draft_steps=DRAFT_STEPS)
        drafter_models.train_assistant(
            drafter, base, drafter_models.chat_token_ids(base), steps=300
        )
        return base, drafter, directory

    return once("litert_lm_speculative.trained", build)


@pytest.mark.slow
def test_the_engine_drafts_the_same_greedy_text(trained_pair):
    """A base trained for seconds on the toy chat, its drafter distilled on
    the base's greedy tokens: in LiteRT-LM's engine (CPU) the text with the
    drafter equals the text without it and the base's greedy tokens, on
    every chat prompt; the drafter's acceptance rate is the engine's."""
    pytest.importorskip("litert_lm")
    from kerasnorm.export.litert.runner import unallocated
    from kerasnorm.export.litert_lm.bundle import read_bundle
    from kerasnorm.export.litert_lm.speculative import base_greedy
    from kerasnorm.export.litert_lm.speculative_engine import run_speculative

    base, drafter, directory = trained_pair
    path = str(directory / "speculative.litertlm")
    result = to_litert_lm(
        base, path, max_sequence_length=48, prefill_lengths=(16,), drafter=drafter
    )
    assert result.model_type == "gemma4"
    assert result.check.max_error <= 1e-4 and result.check.tokens_equal
    sections = read_bundle(path)
    assert {"model", "tf_lite_embedder", "tf_lite_per_layer_embedder"} < set(sections)
    assert "verify" in unallocated(sections["model"]).get_signature_list()
    drafter_file = unallocated(sections["tf_lite_mtp_drafter"])
    assert list(drafter_file.get_signature_list()) == ["mtp_drafter"]
    assert sections["metadata"].max_num_tokens == 48
    texts = [lm_models.gemma4_turns(word) for word in lm_models.CHAT_WORDS]
    run = run_speculative(path, texts, base_greedy(base, result.stop_tokens, 48), 24)
    end_of_turn = base.preprocessor.tokenizer.token_to_id("<turn|>")
    expected = [
        base.generate(text, max_length=48, stop_token_ids=[end_of_turn])[len(text) :]
        for text in texts
    ]
    assert [r.strip() for r in run.replies] == [
        e.removesuffix("<turn|>").strip() for e in expected
    ]
    assert run.acceptance is not None and run.acceptance >= 0.5, run


def test_an_assistant_alone_points_at_its_base(tmp_path):
    _, drafter = _pair()
    with pytest.raises(ValueError, match="pass it as its Gemma4CausalLM's drafter="):
        to_litert_lm(drafter, tmp_path / "lm.tflite", max_sequence_length=CONTEXT)


@pytest.mark.slow
def test_preset_folders_export_with_a_drafter_through_the_cli(
    trained_pair, tmp_path, capsys
):
    """`save_to_preset` of the base and of its assistant, then `kerasnorm
    export BASE --drafter ASSISTANT`: the speculative bundle (the base's
    `verify`, the MTP_DRAFTER section). A drafter folder holding no
    assistant (the base's own) is refused by `to_litert_lm`'s name for it,
    before any tracing, and nothing is written."""
    from kerasnorm.export.litert.runner import unallocated
    from kerasnorm.export.litert_lm.bundle import read_bundle
    from kerasnorm_cli import command

    base, drafter, _ = trained_pair
    base.save_to_preset(str(tmp_path / "gemma4_base"))
    drafter.save_to_preset(str(tmp_path / "assistant"))
    out = tmp_path / "out"
    argv = ["export", str(tmp_path / "gemma4_base"), "--out", str(out)]
    argv += ["--format", "litert_lm", "--max-sequence-length", "48"]
    argv += ["--prefill-lengths", "16", "--drafter"]
    assert command([*argv, str(tmp_path / "gemma4_base")]) == 2
    err = capsys.readouterr().err
    assert "takes a keras-hub Gemma4AssistantCausalLM" in err, err
    assert not out.exists()
    status = command([*argv, str(tmp_path / "assistant")])
    output = capsys.readouterr()
    assert status == 0, output.err
    assert f"MTP drafter of {DRAFT_STEPS} draft steps; model type gemma4" in (
        output.out
    )
    sections = read_bundle(out / "gemma4_base.litertlm")
    assert "verify" in unallocated(sections["model"]).get_signature_list()
    drafter_file = unallocated(sections["tf_lite_mtp_drafter"])
    assert list(drafter_file.get_signature_list()) == ["mtp_drafter"]
    assert sections["metadata"].max_num_tokens == 48
    if importlib.util.find_spec("litert_lm") is not None:
        assert "ran in LiteRT-LM's engine with and without the drafter" in (output.out)
    assert os.listdir(out) == ["gemma4_base.litertlm"]
