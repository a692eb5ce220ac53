"""Gemma 4's text decoders generate (issue 60): per-layer inputs, key/value
sharing across layers, global layers with a larger head size than the
sliding-window ones, the mixture-of-experts block. The file holds one cache
per layer that writes one, at that layer's own head size; a sharing layer
reads its source layer's cache."""

from types import SimpleNamespace

import numpy as np
import pytest

from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.litert_lm.export import to_litert_lm
from tests.export import lm_models
from tests.export.flatbuffer_ops import cache_writes
from tests.support.once import once

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only
CONTEXT = 24
PROMPTS = lm_models.rule_sequences(2, seed=11)[:, :5]
# The float32 decode step's XNNPACK partitions: one, the experts' routing
# included (`litert.routing`).
PARTITIONS = {"per_layer": 1, "dense": 1, "moe": 1}
_TRAINED = {}


def trained(config, wide=False):
    """`config` trained on the rule; `wide`: 64 wide and trained 600 steps,
    for int4 (whose rounding a 32-wide model trained briefly does not keep
    its greedy tokens through, as test_litert_lm_quantize.py found)."""
    if (config, wide) not in _TRAINED:
        size = {"hidden_dim": 64, "intermediate_dim": 128} if wide else {}
        model = lm_models.gemma4_causal_lm(config, seed=0, **size)
        _TRAINED[config, wide] = lm_models.train(model, steps=600 if wide else 128)
    return _TRAINED[config, wide]


def _cache_shapes(content):
    runner = unallocated(content).get_signature_runner("decode")
    return {
        name: tuple(d["shape"])
        for name, d in runner.get_input_details().items()
        if name.startswith("kv_cache_")
    }


def _generates(config, quantize, tmp_path, train=True):
    if train:
        model = trained(config, wide=quantize == "int4")
    else:
        model = lm_models.gemma4_causal_lm(config, seed=0)
    path = tmp_path / "lm.tflite"
    result = to_litert_lm(
        model,
        path,
        max_sequence_length=CONTEXT,
        prefill_lengths=(8,),
        quantize=quantize,
        verify_inputs=PROMPTS,
    )
    assert result.check.steps == 24 + 1
    if quantize is None:
        assert result.check.max_error <= 1e-4
        assert result.check.agreement == 1.0
        assert result.delegation.partitions == PARTITIONS[config], result.delegation
        # The cache writes are the step's last ops, one per cache.
        writes = cache_writes(path.read_bytes())
        assert writes == result.delegation.undelegated["DYNAMIC_UPDATE_SLICE"]
    else:
        assert result.check.agreement >= 0.9
    # One cache per layer that writes one, each at its own size: sliding
    # layers (even) head size 8, global layers (odd) 16; "dense"'s global
    # layers one key/value head; the sharing layer (the last of
    # "per_layer") none.
    backbone = model.backbone
    written = [
        layer for layer in backbone.transformer_layers if not layer.is_kv_shared_layer
    ]
    expected = {}
    for i in range(len(written)):
        heads = 1 if config == "dense" and i % 2 else 2
        size = 16 if i % 2 else 8
        for kind in "kv":
            expected[f"kv_cache_{kind}_{i}"] = (1, heads, CONTEXT, size)
    assert _cache_shapes(path.read_bytes()) == expected
    assert len(written) == (3 if config == "per_layer" else 4)
    return result


def test_gemma4_per_layer_inputs_and_shared_caches_generate(tmp_path):
    """Default tier: the 2B/4B layout, random weights, float32."""
    _generates("per_layer", None, tmp_path, train=False)


# CI's slow tier: each layout once, the 2B/4B layout quantized ("dynamic";
# the default tier runs it in float32), the 31B layout in float32 and the
# experts quantized ("dynamic"); the other cells, int4 among them, are
# `exhaustive` (each configuration and the int4 one trained once per
# process: a trained model's cells share a process).
_CELLS = {
    ("per_layer", "dynamic"),
    ("dense", None),
    ("moe", "dynamic"),
}


def _cell(config, quantize):
    marks = [pytest.mark.xdist_group(f"gemma4-{config}-{quantize == 'int4'}")]
    if (config, quantize) not in _CELLS:
        marks.append(pytest.mark.exhaustive)
    return pytest.param(config, quantize, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "quantize"),
    [_cell(c, q) for c in lm_models.GEMMA4 for q in (None, "dynamic", "int4")],
)
def test_every_gemma4_config_generates(config, quantize, tmp_path):
    """Each configuration trained on the rule for seconds, in every mode."""
    model = trained(config, wide=quantize == "int4")
    rule = lm_models.rule_sequences(2, seed=11)
    full = np.asarray(lm_models._TokenIds(model)(rule))
    assert (full[:, 1:-1].argmax(-1) == rule[:, 2:]).mean() > 0.15
    _generates(config, quantize, tmp_path)


# --- the `gemma4` bundle ---------------------------------------------------


def test_every_bundle_declares_tools_and_thinking():
    """litert-lm-builder's validate_metadata() refuses an LLM bundle whose
    metadata lacks `supports_thinking` / `supports_function_calling`: every
    bundle sets both, true with the fields the engine parses by where the
    turn format has them (Gemma 4), false where it has none."""
    builder = pytest.importorskip("litert_lm_builder.litertlm_builder")
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    from kerasnorm.export.litert_lm import chat
    from kerasnorm.export.litert_lm import families
    from kerasnorm.export.litert_lm.bundle import llm_metadata

    tokenizer = SimpleNamespace(start_token=2, stop_tokens=(1,))
    gemma4 = chat.Chat(
        "gemma4",
        families.GEMMA4.template,
        ("<turn|>",),
        "gemma4 turn format",
        tool_calls=families.GEMMA4.tool_calls,
        thinking=families.GEMMA4.thinking,
    )
    generic = chat.Chat(families.GENERIC, None, (), "no chat template")
    for given in (None, generic, gemma4):
        metadata = llm_metadata_pb2.LlmMetadata()
        metadata.ParseFromString(llm_metadata(tokenizer, 16, given))
        assert metadata.HasField("supports_thinking")
        assert metadata.HasField("supports_function_calling")
        assert metadata.supports_function_calling == (given is gemma4)
        assert metadata.supports_thinking == (given is gemma4)
        check = builder.LitertLmFileBuilder()
        check._llm_metadata, check._has_llm_metadata = metadata, True
        check.validate_metadata()
    fields = metadata.llm_model_type.gemma4
    assert (fields.code_fence_start, fields.code_fence_end) == (
        "<|tool_call>",
        "<tool_call|>",
    )
    assert (fields.open_quote, fields.close_quote) == ('<|"|>', '<|"|>')
    assert fields.function_response_start == "<|tool_response>"
    assert fields.syntax_type == "fc"
    (channel,) = metadata.channels
    assert channel.is_reasoning_channel
    assert (channel.start, channel.end) == ("<|channel>thought\n", "<channel|>")


@pytest.fixture(scope="module")
def gemma4_chat(tmp_path_factory):
    def build():
        directory = tmp_path_factory.mktemp("gemma4_chat")
        causal_lm = lm_models.gemma4_chat_lm(str(directory))
        path = str(directory / "chat.litertlm")
        result = to_litert_lm(
            causal_lm, path, max_sequence_length=32, prefill_lengths=(16,)
        )
        return causal_lm, path, result

    return once("litert_lm_gemma4.chat", build)


def _weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return "sunny"


@pytest.mark.slow
def test_the_gemma4_bundle_converses_as_generate_does(gemma4_chat):
    """A Gemma 4 trained for seconds on a toy chat in its turn format,
    bundled: model type `gemma4`, `<turn|>` among the stop tokens, tool
    calling and thinking declared; in LiteRT-LM's engine the conversation
    API answers as keras-hub's generate() does, a declared tool is rendered
    in the system turn and thinking turns on `<|think|>`."""
    litert_lm = pytest.importorskip("litert_lm")
    from kerasnorm.export.litert_lm.bundle import read_bundle

    causal_lm, path, result = gemma4_chat
    tokenizer = causal_lm.preprocessor.tokenizer
    end_of_turn = tokenizer.token_to_id("<turn|>")
    assert (result.model_type, result.chat) == ("gemma4", "gemma4 turn format")
    assert set(result.stop_tokens) == {tokenizer.end_token_id, end_of_turn}
    metadata = read_bundle(path)["metadata"]
    assert metadata.llm_model_type.WhichOneof("model_type") == "gemma4"
    assert metadata.supports_function_calling and metadata.supports_thinking
    assert result.engine.startswith("ran in LiteRT-LM's engine")
    engine = litert_lm.Engine(path, cache_dir=":nocache")
    greedy = litert_lm.SamplerConfig(top_k=1)
    try:
        for word in ("alpha", "delta", "theta"):
            prompt = lm_models.gemma4_turns(word)
            expected = causal_lm.generate(
                prompt, max_length=32, stop_token_ids=[end_of_turn]
            )
            assert expected.endswith("<turn|>")
            reply = expected[len(prompt) : -len("<turn|>")]
            conversation = engine.create_conversation(sampler_config=greedy)
            rendered = conversation.render_message_to_string(
                {"role": "user", "content": word}
            )
            answer = conversation.send_message(word)
            conversation.close()
            assert rendered == prompt
            assert str(answer).strip() == reply.strip()
        conversation = engine.create_conversation(
            tools=[_weather], sampler_config=greedy
        )
        rendered = conversation.render_message_to_string(
            {"role": "user", "content": "alpha"}
        )
        conversation.close()
        assert rendered.startswith("<|turn>system\n<|tool>")
        assert "_weather" in rendered and "the city's name." in rendered
        assert rendered.endswith("<tool|><turn|>\n" + lm_models.gemma4_turns("alpha"))
        conversation = engine.create_conversation(
            thinking_config=litert_lm.ThinkingConfig(enable_thinking=True)
        )
        rendered = conversation.render_message_to_string(
            {"role": "user", "content": "alpha"}
        )
        conversation.close()
        assert rendered == "<|turn>system\n<|think|>\n<turn|>\n" + (
            lm_models.gemma4_turns("alpha")
        )
    finally:
        engine.close()


@pytest.mark.slow
def test_a_gemma4_preset_folder_exports_through_the_cli(gemma4_chat, tmp_path, capsys):
    """`save_to_preset`, then `kerasnorm export DIR`: a `gemma4` bundle with
    the preprocessor's tokenizer, the same chat metadata as the Python
    call's."""
    from kerasnorm.export.litert_lm.bundle import read_bundle
    from kerasnorm_cli import command

    causal_lm, path, _ = gemma4_chat
    preset = tmp_path / "gemma4_preset"
    causal_lm.save_to_preset(str(preset))
    argv = ["export", str(preset), "--out", str(tmp_path / "out")]
    argv += ["--format", "litert_lm", "--max-sequence-length", "32"]
    status = command([*argv, "--prefill-lengths", "16"])
    output = capsys.readouterr()
    assert status == 0, output.err
    assert "gemma4_preset.litertlm: model type gemma4, gemma4 turn format" in (
        output.out
    )
    ours = read_bundle(tmp_path / "out" / "gemma4_preset.litertlm")
    theirs = read_bundle(path)
    assert ours["tokenizer"] == theirs["tokenizer"]
    assert ours["metadata"] == theirs["metadata"]
