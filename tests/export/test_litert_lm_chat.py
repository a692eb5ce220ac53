"""Chat-ready `.litertlm` bundles (issue 51): keras-hub presets and
`.keras` CausalLMs in through `kerasnorm export` with the preprocessor's
tokenizer, byte-pair tokenizers written as a `tokenizer.json`, the chat
metadata (model type, stop tokens, Jinja template, sampler defaults) read
back from the bundle, and the bundle run in LiteRT-LM's own engine.

References are independent of the code under test: keras-hub's own
tokenizer and `generate()`, the family's turn format written out here, the
bundle read back with litert-lm-builder's unpacker, and LiteRT-LM's engine.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")
pytest.importorskip("sentencepiece")
litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

from kerasnorm.export import ExportConversionError  # noqa: E402
from kerasnorm.export import ExportVerificationError  # noqa: E402
from kerasnorm.export import to_litert_lm  # noqa: E402
from kerasnorm.export.litert.generator import Generator  # noqa: E402
from kerasnorm.export.litert_lm import chat  # noqa: E402
from kerasnorm.export.litert_lm import families  # noqa: E402
from kerasnorm.export.litert_lm.bundle import read_bundle  # noqa: E402
from kerasnorm.export.litert_lm.tokenizer import byte_pair_json  # noqa: E402
from kerasnorm.export.litert_lm.tokenizer import check_byte_pair_json  # noqa: E402
from kerasnorm.export.litert_lm.tokenizer import resolve_tokenizer  # noqa: E402
from kerasnorm_cli import command  # noqa: E402
from tests.export import lm_models  # noqa: E402
from tests.support.once import once  # noqa: E402

# The export traces with TensorFlow; the JAX pass leaves it out.
pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = (
    "alpha beta, gamma!",
    "Hello world 123 <|im_end|> delta\n\n  omega",
    "kappa<|im_start|>theta",
)


def _ids(tokenizer, text):
    return [int(i) for i in np.asarray(tokenizer.tokenize(text))]


def _model_type(metadata):
    return metadata.llm_model_type.WhichOneof("model_type")


def _stops(metadata):
    return [list(t.token_ids.ids) for t in metadata.stop_tokens]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return once(
        "litert_lm_chat.qwen3",
        lambda: lm_models.keras_hub_lm("qwen3", str(tmp_path_factory.mktemp("qwen3"))),
    )


@pytest.fixture(scope="module")
def qwen3_bundle(qwen3, tmp_path_factory):
    def build():
        path = str(tmp_path_factory.mktemp("qwen3_bundle") / "qwen3.litertlm")
        result = to_litert_lm(qwen3, path, max_sequence_length=24, prefill_lengths=(8,))
        return result, path

    return once("litert_lm_chat.qwen3_bundle", build)


def test_qwen3_bundle_is_chat_ready(qwen3, qwen3_bundle):
    result, path = qwen3_bundle
    vocabulary = qwen3.preprocessor.tokenizer.vocabulary
    sections = read_bundle(path)
    metadata = sections["metadata"]
    assert _model_type(metadata) == "qwen3"
    assert [vocabulary["<|im_end|>"]] in _stops(metadata)
    assert metadata.max_num_tokens == 24
    # Qwen's generate() prepends no start token; neither does the engine.
    assert not metadata.HasField("start_token")
    assert sections["tokenizer"][0] == "hf_tokenizer_json"
    assert metadata.jinja_prompt_template == families.QWEN3.template
    assert (result.model_type, result.chat) == ("qwen3", "qwen3 turn format")
    # Qwen3 calls tools and thinks: the fields the engine parses them by.
    assert metadata.supports_function_calling and metadata.supports_thinking
    fields = metadata.llm_model_type.qwen3
    assert (fields.code_fence_start, fields.code_fence_end) == (
        "<tool_call>",
        "</tool_call>",
    )
    (channel,) = metadata.channels
    assert (channel.start, channel.end, channel.is_reasoning_channel) == (
        "<think>",
        "</think>",
        True,
    )
    assert result.engine.startswith("ran in LiteRT-LM's engine")
    assert result.engine_run.rendered is not None


def test_a_bundle_prefills_the_caches_only_by_default(qwen3, qwen3_bundle, tmp_path):
    """The engine reads logits from `decode` alone: a bundle's prefills
    return the caches only (the head over the prompt is not computed),
    while a `.tflite` file's return the last row's logits by default."""
    result, path = qwen3_bundle
    assert result.prefill_logits == "none"
    bundled = Generator(read_bundle(path)["model"])
    assert bundled.call_signature("prefill", list(range(1, 9))) is None
    alone = to_litert_lm(
        qwen3, tmp_path / "qwen3.tflite", max_sequence_length=24, prefill_lengths=(8,)
    )
    assert alone.prefill_logits == "last"
    logits = Generator((tmp_path / "qwen3.tflite").read_bytes()).call_signature(
        "prefill", list(range(1, 9))
    )
    assert logits.shape == (1, bundled.vocabulary_size)


def test_the_engine_tokenizes_as_keras_hub_does(qwen3, qwen3_bundle):
    _, path = qwen3_bundle
    engine = litert_lm.Engine(path, cache_dir=":nocache")
    try:
        for text in TEXTS:
            assert engine.tokenize(text) == _ids(qwen3.preprocessor.tokenizer, text)
        conversation = engine.create_conversation()
        rendered = conversation.render_message_to_string(
            {"role": "user", "content": "alpha"}
        )
        conversation.close()
        conversation = engine.create_conversation(tools=[_weather])
        with_tool = conversation.render_message_to_string(
            {"role": "user", "content": "alpha"}
        )
        conversation.close()
    finally:
        engine.close()
    assert rendered == "<|im_start|>user\nalpha<|im_end|>\n<|im_start|>assistant\n"
    # A declared tool: Qwen3's system turn, its declaration inside <tools>.
    assert with_tool.startswith("<|im_start|>system\n# Tools\n")
    tools = with_tool[with_tool.index("<tools>\n") + 8 : with_tool.index("\n</tools>")]
    assert json.loads(tools)["function"]["name"] == "_weather"
    assert with_tool.endswith(rendered)


def _weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return "sunny"


def test_engine_tokens_unlike_keras_hubs_are_refused(qwen3):
    from kerasnorm.export.litert_lm.engine import EngineRun
    from kerasnorm.export.litert_lm.ship import same_tokens

    ids = _ids(qwen3.preprocessor.tokenizer, "alpha beta")
    same_tokens(qwen3, None, EngineRun("alpha beta", ids, ids, "", []))
    wrong = ids[::-1]
    with pytest.raises(ExportVerificationError, match="keras-hub's Qwen3Tokenizer"):
        same_tokens(qwen3, None, EngineRun("alpha beta", wrong, wrong, "", []))
    # A tokenizer given in place of the preprocessor's is not keras-hub's.
    same_tokens(qwen3, "tokenizer.json", EngineRun("alpha beta", wrong, wrong, "", []))


# keras-hub's byte-pair tokenizers and the special tokens each needs.
BYTE_PAIR = {
    "GPT2Tokenizer": ("<|endoftext|>",),
    "OPTTokenizer": ("</s>", "<pad>"),
    "BloomTokenizer": ("<s>", "</s>", "<pad>"),
    "FalconTokenizer": ("<|endoftext|>",),
    "GPTNeoXTokenizer": ("<|endoftext|>",),
    "QwenTokenizer": ("<|endoftext|>",),
    "Qwen3Tokenizer": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
}


@pytest.mark.parametrize("name", sorted(BYTE_PAIR))
def test_byte_pair_tokenizers_become_a_tokenizer_json(name):
    from tokenizers import Tokenizer

    vocabulary, merges = lm_models.byte_pair_vocabulary(BYTE_PAIR[name])
    tokenizer = getattr(keras_hub.models, name)(vocabulary=vocabulary, merges=merges)
    resolved = resolve_tokenizer(None, tokenizer)
    assert resolved.kind == "hf_tokenizer_json"
    assert resolved.stop_tokens == (tokenizer.end_token_id,)
    assert resolved.start_token == getattr(tokenizer, "start_token_id", None)
    # The JSON read by the `tokenizers` library tokenizes as keras-hub does.
    written = Tokenizer.from_str(resolved.data.decode("utf-8"))
    for text in (*TEXTS, " leading space", "x" * 40):
        text = text.replace("<|im_end|>", BYTE_PAIR[name][-1])
        assert written.encode(text).ids == _ids(tokenizer, text), text
        assert written.decode(_ids(tokenizer, text), skip_special_tokens=False) == (
            tokenizer.detokenize(_ids(tokenizer, text))
        )


def test_a_tokenizer_json_that_tokenizes_otherwise_is_refused():
    vocabulary, merges = lm_models.byte_pair_vocabulary()
    tokenizer = keras_hub.models.Qwen3Tokenizer(vocabulary=vocabulary, merges=merges)
    spec = json.loads(byte_pair_json(tokenizer))
    spec["model"]["merges"] = spec["model"]["merges"][:3]
    with pytest.raises(ValueError, match="keras-hub as"):
        check_byte_pair_json(tokenizer, json.dumps(spec))


def test_stage_lines_follow_progress_and_verbose(capsys):
    from types import SimpleNamespace

    from kerasnorm.export.litert_lm.ship import stages

    for progress, verbose, shown in [
        (False, False, ""),
        (True, False, "Bundling.\n"),
        (False, True, "Bundling.\n"),
    ]:
        stages(SimpleNamespace(progress=progress, verbose=verbose))("Bundling.")
        assert capsys.readouterr().out == shown


def test_chat_template_sampler_and_tokens_round_trip(qwen3, tmp_path, capsys):
    template = tmp_path / "turns.jinja"
    # The engine passes a message's content as parts.
    text = (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}: "
        "{{ message['content'][0]['text'] }}<|im_end|>{% endfor %}"
        "<|im_start|>assistant: "
    )
    template.write_text(text)
    vocabulary = qwen3.preprocessor.tokenizer.vocabulary
    path = tmp_path / "q.litertlm"
    result = to_litert_lm(
        qwen3,
        path,
        max_sequence_length=16,
        prefill_lengths=(4,),
        chat_template=str(template),
        top_k=5,
        top_p=0.9,
        temperature=0.7,
        start_token="<|im_start|>",
        stop_tokens=["<|endoftext|>", vocabulary["<|im_end|>"]],
    )
    # No stage lines without progress= or verbose=.
    assert capsys.readouterr().out == ""
    metadata = read_bundle(path)["metadata"]
    assert metadata.jinja_prompt_template == text == result.chat_template
    assert result.chat == "the chat template given"
    sampler = metadata.sampler_params
    assert (sampler.k, round(sampler.p, 6), round(sampler.temperature, 6)) == (
        5,
        0.9,
        0.7,
    )
    assert type(sampler).Type.Name(sampler.type) == "TOP_P"
    assert list(metadata.start_token.token_ids.ids) == [vocabulary["<|im_start|>"]]
    assert _stops(metadata) == [
        [vocabulary["<|endoftext|>"]],
        [vocabulary["<|im_end|>"]],
    ]
    engine = litert_lm.Engine(str(path), cache_dir=":nocache")
    try:
        assert engine.bos_token_id == vocabulary["<|im_start|>"]
        conversation = engine.create_conversation()
        assert conversation.render_message_to_string(
            {"role": "user", "content": "hi"}
        ) == ("<|im_start|>user: hi<|im_end|><|im_start|>assistant: ")
        conversation.close()
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 0}, "`top_k` is a positive integer. Received: top_k=0"),
        ({"top_p": 1.5}, r"`top_p` is a number in \(0, 1\]. Received: top_p=1.5"),
        ({"temperature": -1.0}, "`temperature` is a number above 0"),
        ({"chat_template": ""}, "`chat_template` is a Jinja template"),
        ({"chat_template": "no/such/file.jinja"}, "neither a Jinja template"),
        ({"chat_template": "{{ bos_token }}"}, "never reads `messages`"),
        (
            {"chat_template": "{% for m in messages %}{{ m | nope }}{% endfor %}"},
            "not a Jinja template jinja2 parses: .*No filter named 'nope'",
        ),
        (
            {"chat_template": "{{ raise_exception('no ' ~ messages[0].role) }}"},
            "renders no conversation of a user's message.*no user",
        ),
        ({"stop_tokens": ["<|nope|>"]}, "'<|nope|>' is not in the tokenizer"),
    ],
)
def test_bundle_options_are_checked(qwen3, tmp_path, options, message):
    path = tmp_path / "q.litertlm"
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        to_litert_lm(
            qwen3, path, max_sequence_length=8, prefill_lengths=(4,), **options
        )
    assert not path.exists()


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [
        ({"top_k": 1}, ("GREEDY", 1, 0.0, 1.0)),
        ({"top_k": 40, "temperature": 0.5}, ("TOP_K", 40, 0.0, 0.5)),
        ({"temperature": 0.8}, ("TOP_P", 0, 1.0, 0.8)),
        ({"top_p": 0.5}, ("TOP_P", 0, 0.5, 1.0)),
    ],
)
def test_sampler_defaults_in_the_metadata(sampler, expected):
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    from kerasnorm.export.litert_lm.bundle import llm_metadata
    from kerasnorm.export.litert_lm.tokenizer import BundleTokenizer

    tokenizer = BundleTokenizer("sentencepiece", b"", 1, (2,), 8)
    metadata = llm_metadata_pb2.LlmMetadata.FromString(
        llm_metadata(tokenizer, 16, **sampler)
    )
    params = metadata.sampler_params
    found = (type(params).Type.Name(params.type), params.k, params.p)
    assert (*found, round(params.temperature, 6)) == expected
    assert _model_type(metadata) == "generic_model"
    assert not metadata.jinja_prompt_template


def test_help_names_language_models():
    from kerasnorm_cli import arguments

    text = " ".join(arguments.build_parser().format_help().split())
    assert "language models" in text and ".litertlm" in text


def test_bundle_options_on_a_tflite_path_are_refused(qwen3, tmp_path):
    with pytest.raises(ValueError, match=r"`top_k` is the `\.litertlm` bundle's"):
        to_litert_lm(qwen3, tmp_path / "q.tflite", max_sequence_length=8, top_k=3)


@pytest.mark.parametrize(
    ("family", "model_type", "template", "end_of_turn"),
    [
        ("Gemma3CausalLM", "gemma3", "GEMMA", "<end_of_turn>"),
        ("GemmaCausalLM", "generic_model", "GEMMA", "<end_of_turn>"),
        ("QwenCausalLM", "qwen2p5", "CHATML", "<|im_end|>"),
        ("Qwen3CausalLM", "qwen3", "QWEN3", "<|im_end|>"),
        ("Llama3CausalLM", "generic_model", "LLAMA3", "<|eot_id|>"),
    ],
)
def test_each_family_gets_its_model_type_and_turn_format(
    family, model_type, template, end_of_turn
):
    # A subclass of the family is the family (a user's own CausalLM class).
    base = type(family, (), {})
    lm = type("MyCausalLM", (base,), {})()
    tokens = [
        "<start_of_turn>",
        "<end_of_turn>",
        "<|im_start|>",
        "<|im_end|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ]
    found = chat.chat_of(lm, {t: i for i, t in enumerate(tokens)})
    assert (found.model_type, found.template) == (
        model_type,
        getattr(families, template).template,
    )
    assert found.stop_tokens == (end_of_turn,)


def test_a_family_without_a_known_turn_format_says_so():
    class Anon:
        pass

    found = chat.chat_of(Anon(), {"<s>": 0})
    assert (found.model_type, found.template) == ("generic_model", None)
    assert "kerasnorm knows no turn format of Anon" in found.note
    # A known family whose tokenizer lacks the turn tokens: none either.
    lm = type("GemmaCausalLM", (), {})()
    found = chat.chat_of(lm, {"<start_of_turn>": 5})
    assert found.template is None
    assert "lacks GemmaCausalLM's turn token(s) <end_of_turn>" in found.note


def test_a_bundle_the_engine_cannot_load_is_not_written(qwen3, tmp_path):
    # A tokenizer.json LiteRT-LM's tokenizer cannot parse: its engine
    # aborts the process loading it (here a child).
    size = qwen3.preprocessor.tokenizer.vocabulary_size()
    vocabulary = {f"t{i}": i for i in range(size)}
    vocabulary.update({"<s>": 0, "</s>": 1})
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(json.dumps({"model": {"type": "Bogus", "vocab": vocabulary}}))
    path = tmp_path / "bad.litertlm"
    with pytest.raises(ExportConversionError) as caught:
        to_litert_lm(
            qwen3,
            path,
            max_sequence_length=16,
            prefill_lengths=(4,),
            tokenizer=tokenizer,
        )
    message = str(caught.value)
    assert "LiteRT-LM's engine could not run" in message
    assert "SIGABRT" in message and "did not match any variant" in message
    assert "was not written" in message
    assert sorted(os.listdir(tmp_path)) == ["tokenizer.json"]


def test_a_chat_template_the_engine_cannot_render_is_not_written(qwen3, tmp_path):
    # jinja2 renders it; the engine's Jinja has no `center` filter.
    template = (
        "{% for message in messages %}{{ message['content'] | center(20) }}{% endfor %}"
    )
    path = tmp_path / "bad.litertlm"
    with pytest.raises(ExportConversionError, match="unknown filter: filter center"):
        to_litert_lm(
            qwen3,
            path,
            max_sequence_length=16,
            prefill_lengths=(4,),
            chat_template=template,
        )
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def gemma_chat(tmp_path_factory):
    def build():
        directory = tmp_path_factory.mktemp("gemma_chat")
        causal_lm = lm_models.gemma_chat_lm(str(directory))
        path = str(directory / "chat.litertlm")
        result = to_litert_lm(
            causal_lm, path, max_sequence_length=32, prefill_lengths=(8, 32)
        )
        return causal_lm, path, result

    return once("litert_lm_chat.gemma_chat", build)


def test_the_gemma_bundle_answers_through_the_conversation_api(gemma_chat):
    causal_lm, path, result = gemma_chat
    tokenizer = causal_lm.preprocessor.tokenizer
    end_of_turn = tokenizer.token_to_id("<end_of_turn>")
    assert result.chat == "gemma turn format"
    assert set(result.stop_tokens) == {tokenizer.end_token_id, end_of_turn}
    engine = litert_lm.Engine(path, cache_dir=":nocache")
    try:
        for word in ("alpha", "delta", "theta"):
            prompt = lm_models.gemma_turns(word)
            expected = causal_lm.generate(
                prompt, max_length=32, stop_token_ids=[end_of_turn]
            )
            # keras-hub stopped at the end-of-turn token, as trained.
            assert expected.endswith("<end_of_turn>")
            reply = expected[len(prompt) : -len("<end_of_turn>")]
            conversation = engine.create_conversation(
                sampler_config=litert_lm.SamplerConfig(top_k=1)
            )
            assert (
                conversation.render_message_to_string({"role": "user", "content": word})
                == prompt
            )
            answer = conversation.send_message(word)
            conversation.close()
            assert answer.role == litert_lm.Role.MODEL
            assert str(answer).strip() == reply.strip()
    finally:
        engine.close()


def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the export reached for the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _cli_bundle(model, out, capsys, *flags):
    argv = ["export", str(model), "--out", str(out), "--format", "litert_lm"]
    argv += ["--max-sequence-length", "16", "--prefill-lengths", "8", *flags]
    status = command(argv)
    output = capsys.readouterr()
    assert status == 0, output.err
    return output.out


@pytest.mark.parametrize("family", ["llama", "gemma", "gemma3"])
def test_preset_folders_export_to_litertlm_without_a_tokenizer_flag(
    family, tmp_path, capsys, monkeypatch
):
    causal_lm = lm_models.keras_hub_lm(family, str(tmp_path))
    preset = tmp_path / f"{family}_preset"
    causal_lm.save_to_preset(str(preset))
    _no_network(monkeypatch)
    # Gemma's bundle is written without the start token keras-hub's
    # generate() adds; the others keep the tokenizer's.
    flags = ["--no-start-token"] if family == "gemma" else []
    out = _cli_bundle(preset, tmp_path / "out", capsys, *flags)
    bundle = tmp_path / "out" / f"{family}_preset.litertlm"
    assert bundle.is_file()
    # One line per stage, the engine's run among them.
    for stage in ("Tracing", "Verifying", "Bundling", "LiteRT-LM's engine"):
        assert stage in out
    said = {
        "gemma": "generic_model, gemma turn format",
        "gemma3": "gemma3, gemma turn format",
        # Llama has no turn format of its own; the tokenizer holds Gemma's.
        "llama": "generic_model, gemma turn format, inferred from the "
        "tokenizer's special tokens <start_of_turn>, <end_of_turn>",
    }[family]
    assert f"{family}_preset.litertlm: model type {said}" in out
    sections = read_bundle(bundle)
    layout = "llama" if family == "llama" else "gemma"
    with open(lm_models.chat_sentencepiece(str(tmp_path), layout), "rb") as f:
        assert sections["tokenizer"] == ("sentencepiece", f.read())
    tokenizer = causal_lm.preprocessor.tokenizer
    if flags:
        assert not sections["metadata"].HasField("start_token")
    else:
        assert list(sections["metadata"].start_token.token_ids.ids) == [
            tokenizer.start_token_id
        ]
    assert [tokenizer.end_token_id] in _stops(sections["metadata"])


def test_a_keras_causal_lm_with_its_preprocessor_writes_a_bundle(
    qwen3, tmp_path, capsys
):
    model = tmp_path / "qwen3.keras"
    qwen3.save(str(model))
    _cli_bundle(model, tmp_path / "out", capsys)
    metadata = read_bundle(tmp_path / "out" / "qwen3.litertlm")["metadata"]
    assert _model_type(metadata) == "qwen3"


def test_cli_bundle_flags_need_a_tokenizer(tmp_path, capsys):
    import keras

    tokens = keras.Input((None,), dtype="int32")
    logits = keras.layers.Dense(8)(keras.layers.Embedding(8, 4)(tokens))
    model = tmp_path / "bare.keras"
    keras.Model(tokens, logits).save(str(model))
    argv = ["export", str(model), "--out", str(tmp_path / "o"), "--format"]
    argv += ["litert_lm", "--max-sequence-length", "8", "--top-k", "3"]
    assert command(argv) == 2
    assert "--top-k applies to the .litertlm bundle" in capsys.readouterr().err
    assert command([*argv[:-2], "--chat-template", "missing.jinja"]) == 2
    assert "--chat-template file not found" in capsys.readouterr().err
    assert command([*argv[:-2], "--no-start-token"]) == 2
    assert "--no-start-token applies to the .litertlm" in capsys.readouterr().err
    assert command([*argv[:-2], "--start-token", "1", "--no-start-token"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    not_preset = tmp_path / "folder"
    not_preset.mkdir()
    assert command(["export", str(not_preset), "--out", str(tmp_path / "o")]) == 2
    assert "not a keras-hub preset folder" in capsys.readouterr().err


@pytest.mark.slow
def test_a_preset_written_on_jax_exports_in_tensorflow(tmp_path, capsys):
    preset = tmp_path / "jax_llama"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import keras; assert keras.backend.backend() == 'jax';"
        "from tests.export import lm_models;"
        "lm_models.keras_hub_lm('llama', sys.argv[2]).save_to_preset(sys.argv[3])"
    )
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    subprocess.run(
        [sys.executable, "-c", script, ROOT, str(tmp_path), str(preset)],
        env=env,
        check=True,
        capture_output=True,
    )
    _cli_bundle(preset, tmp_path / "out", capsys)
    bundle = tmp_path / "out" / "jax_llama.litertlm"
    reloaded = keras_hub.models.CausalLM.from_preset(str(preset))
    engine = litert_lm.Engine(str(bundle), cache_dir=":nocache")
    try:
        text = "alpha beta gamma"
        assert engine.tokenize(text) == _ids(reloaded.preprocessor.tokenizer, text)
    finally:
        engine.close()


@pytest.mark.slow
def test_a_preset_folder_exports_to_tflite_too(tmp_path, capsys):
    preset = tmp_path / "gemma_preset"
    lm_models.keras_hub_lm("gemma", str(tmp_path)).save_to_preset(str(preset))
    argv = ["export", str(preset), "--out", str(tmp_path / "out"), "--tflite"]
    assert command(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "gemma_preset.tflite").is_file()


# SmolLM2-135M-Instruct's own chat template (its Hugging Face tokenizer
# config): ChatML, joining each message's content to strings with `+`.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
    "'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named "
    "SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
CONVERSATION = [
    ("system", "Be brief."),
    ("user", "What is the capital of France?"),
    ("assistant", "Paris."),
    ("user", "And of Italy?"),
]


def _render(template, conversation, parts):
    import jinja2.sandbox

    messages = [
        {"role": r, "content": [{"type": "text", "text": t}] if parts else t}
        for r, t in conversation
    ]
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment()
    return environment.from_string(template).render(
        messages=messages, add_generation_prompt=True
    )


@pytest.mark.parametrize("start", [0, 1])
def test_a_hugging_face_template_is_written_to_read_content_parts(start):
    """The template as written renders string contents; the engine passes
    parts, on which it fails (`+` of a string and a list). The bundle's
    template renders parts as the original renders strings."""
    pytest.importorskip("jinja2")
    conversation = CONVERSATION[start:]
    with pytest.raises(TypeError, match="can only concatenate str"):
        _render(SMOLLM2_TEMPLATE, conversation, parts=True)
    written = chat.parts_template(SMOLLM2_TEMPLATE)
    assert written.endswith(SMOLLM2_TEMPLATE)
    expected = _render(SMOLLM2_TEMPLATE, conversation, parts=False)
    assert _render(written, conversation, parts=True) == expected
    # Independent of the rewrite: ChatML, turn by turn.
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    turns = ([] if start == 0 else [("system", system)]) + conversation
    assert expected == (
        "".join(f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in turns)
        + "<|im_start|>assistant\n"
    )


def test_a_template_that_reads_parts_is_written_as_it_is():
    pytest.importorskip("jinja2")
    for turns in families.TURN_FORMATS:
        assert chat.parts_template(turns.template) == turns.template


def test_the_engine_renders_a_hugging_face_template_as_jinja2_does(
    qwen3, qwen3_bundle, tmp_path
):
    """SmolLM2's template in a bundle: LiteRT-LM's engine renders a user
    message as jinja2 renders the template as written (string contents)."""
    pytest.importorskip("jinja2")
    from kerasnorm.export.litert_lm.bundle import write_bundle

    _, source = qwen3_bundle
    path = tmp_path / "smol.litertlm"
    _, written = write_bundle(
        read_bundle(source)["model"],
        path,
        model=qwen3,
        max_sequence_length=24,
        chat_template=SMOLLM2_TEMPLATE,
    )
    assert written.note == (
        "the chat template given, written to read the engine's content parts"
    )
    message = "What is the capital of France?"
    engine = litert_lm.Engine(str(path), cache_dir=":nocache")
    try:
        conversation = engine.create_conversation()
        rendered = conversation.render_message_to_string(
            {"role": "user", "content": message}
        )
        conversation.close()
    finally:
        engine.close()
    assert rendered == _render(SMOLLM2_TEMPLATE, [("user", message)], parts=False)


def _tokenizer_json(path, tokens, size=32):
    vocab = {f"w{i}": i for i in range(size - len(tokens))}
    added = [
        {"id": size - len(tokens) + i, "content": t, "special": True}
        for i, t in enumerate(tokens)
    ]
    path.write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": added}))
    return str(path)


@pytest.mark.parametrize(
    ("tokens", "turns"),
    [
        (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "CHATML"),
        (["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "GEMMA"),
        (["<|im_start|>", "<|endoftext|>"], None),
    ],
)
def test_the_turn_format_is_inferred_from_the_tokenizers_special_tokens(
    tmp_path, tokens, turns
):
    """A `Llama3CausalLM` whose tokenizer holds ChatML's turn tokens and not
    Llama 3's (SmolLM2's), and a family with no turn format of its own
    (Phi3) whose tokenizer holds Gemma's: the format the tokens make."""
    path = _tokenizer_json(tmp_path / "tokenizer.json", tokens)
    for name in ("Llama3CausalLM", "Phi3CausalLM"):
        lm = object.__new__(getattr(keras_hub.models, name))
        vocabulary = resolve_tokenizer(lm, path).vocabulary
        found = chat.chat_of(lm, vocabulary)
        if turns is None:
            assert (found.template, found.stop_tokens) == (None, ())
            continue
        expected = getattr(families, turns)
        assert found.template == expected.template
        assert found.stop_tokens == (expected.end_of_turn,)
        assert found.note == (
            f"{expected.name} turn format, inferred from the tokenizer's "
            f"special tokens {', '.join(expected.tokens)}"
        )
