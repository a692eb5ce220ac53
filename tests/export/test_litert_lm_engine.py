"""`.litertlm` bundles run by LiteRT-LM's own engine (`litert-lm-api`).

A keras-hub Llama CausalLM with a SentencePiece tokenizer trained here on a
word rule (each word is followed by the next word of a fixed cycle, eight
words a sentence), trained for seconds so that greedy choices are clear, is
exported to `.litertlm`; the engine's greedy continuation must be the text
keras-hub's `generate()` writes with its greedy sampler. Bad inputs: a
`.litertlm` without a tokenizer, a tokenizer of another vocabulary, a file
the engine would misread.
"""

import dataclasses
import os

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")
spm = pytest.importorskip("sentencepiece")
litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

import keras  # noqa: E402
from litert_lm_builder.runtime.proto import llm_metadata_pb2  # noqa: E402

from kerasnorm.export import to_litert_lm  # noqa: E402
from kerasnorm.export.litert_lm.bundle import check_engine_contract  # noqa: E402
from kerasnorm.export.litert_lm.bundle import llm_metadata  # noqa: E402
from kerasnorm.export.litert_lm.bundle import write_bundle  # noqa: E402
from kerasnorm.export.litert_lm.tokenizer import resolve_tokenizer  # noqa: E402
from tests.export import lm_models  # noqa: E402

# The export traces with TensorFlow; the JAX pass leaves it out.
pytestmark = pytest.mark.tf_only

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
SENTENCE = 8  # words; the end token always follows the eighth
CONTEXT = 24


def _sentences(count, seed=0):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(WORDS), count)
    return [
        " ".join(WORDS[(s + i) % len(WORDS)] for i in range(SENTENCE)) for s in starts
    ]


def _sentencepiece(directory):
    """A word-level SentencePiece model (ids: <unk> 0, <s> 1, </s> 2, as
    Llama's), trained from generated text."""
    prefix = os.path.join(directory, "words")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(200, seed=1)),
        model_prefix=prefix,
        model_type="word",
        vocab_size=len(WORDS) + 3,
        minloglevel=2,
    )
    return prefix + ".model"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A trained tiny keras-hub Llama CausalLM and its SentencePiece file."""
    directory = tmp_path_factory.mktemp("llama")
    sp_path = _sentencepiece(str(directory))
    with open(sp_path, "rb") as f:
        tokenizer = keras_hub.models.LlamaTokenizer(proto=f.read())
    backbone = lm_models.backbone(
        "llama", vocabulary_size=tokenizer.vocabulary_size(), seed=0
    )
    preprocessor = keras_hub.models.LlamaCausalLMPreprocessor(
        tokenizer, sequence_length=SENTENCE + 2
    )
    # Trained on token ids the preprocessor makes up front: keras-hub's
    # SentencePiece op inside fit's tf.data map loses its resource.
    x, y, weights = preprocessor(_sentences(256))
    trainer = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    lm_models.fit_preprocessed(trainer, x, y, weights, epochs=6)
    causal_lm = keras_hub.models.LlamaCausalLM(backbone, preprocessor)
    causal_lm.compile(sampler="greedy")
    return causal_lm, sp_path, directory


def _engine_text(path, prompt, max_tokens):
    engine = litert_lm.Engine(
        path, backend=litert_lm.Backend.CPU(thread_count=1), cache_dir=":nocache"
    )
    try:
        session = engine.create_session(
            apply_prompt_template=False,
            sampler_config=litert_lm.SamplerConfig(top_k=1),
            max_output_tokens=max_tokens,
        )
        try:
            session.run_prefill([prompt])
            return session.run_decode().texts[0]
        finally:
            session.close()
    finally:
        engine.close()


@pytest.mark.slow
def test_llama_litertlm_generates_what_keras_hub_generates(llama):
    causal_lm, _, directory = llama
    path = str(directory / "llama.litertlm")
    # Tokenizer from the CausalLM's preprocessor; two prefill lengths, so
    # that a prompt is fed in more than one call.
    to_litert_lm(
        causal_lm,
        path,
        max_sequence_length=CONTEXT,
        prefill_lengths=(2, 4),
        overwrite=True,
    )
    engine = litert_lm.Engine(path, cache_dir=":nocache")
    assert engine.bos_token_id == 1
    assert engine.eos_token_ids == [[2]]
    engine.close()
    for prompt in ("gamma delta", "kappa theta alpha beta gamma"):
        expected = causal_lm.generate(prompt, max_length=CONTEXT)
        assert expected.startswith(prompt)
        continuation = expected[len(prompt) :].strip()
        # Trained enough that the rule holds, so the comparison is about
        # the engine, not a coin flip between close logits.
        start = WORDS.index(prompt.split()[-1])
        rule = [WORDS[(start + 1 + i) % len(WORDS)] for i in range(SENTENCE)]
        assert continuation.split()[:3] == rule[:3]
        assert _engine_text(path, prompt, CONTEXT).strip() == continuation


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dynamic", "int4", "weight_only_int8"])
def test_quantized_bundles_generate_in_the_engine(llama, mode):
    """The engine loads each quantized bundle (int4 blocks, DEQUANTIZE'd
    int8 weights, int8 / int4 embedding lookups, prefills returning their
    last row) and continues a prompt as the rule says, as Keras does."""
    causal_lm, _, directory = llama
    path = str(directory / f"llama_{mode}.litertlm")
    to_litert_lm(
        causal_lm,
        path,
        max_sequence_length=CONTEXT,
        prefill_lengths=(2, 4),
        quantize=mode,
        overwrite=True,
    )
    prompt = "gamma delta"
    expected = causal_lm.generate(prompt, max_length=CONTEXT)
    continuation = expected[len(prompt) :].strip().split()
    got = _engine_text(path, prompt, CONTEXT).strip().split()
    assert got[:3] == continuation[:3] == ["omega", "sigma", "kappa"]


@pytest.mark.slow
def test_a_bundle_whose_prefills_return_the_caches_only_generates(llama):
    """`prefill_logits="none"` (litert-torch's prefills): the engine reads
    logits from `decode` only, so the file generates as Keras does."""
    causal_lm, _, directory = llama
    path = str(directory / "llama_cache_only.litertlm")
    to_litert_lm(
        causal_lm,
        path,
        max_sequence_length=CONTEXT,
        prefill_lengths=(2, 4),
        prefill_logits="none",
        overwrite=True,
    )
    for prompt in ("gamma delta", "kappa theta alpha beta gamma"):
        expected = causal_lm.generate(prompt, max_length=CONTEXT)
        continuation = expected[len(prompt) :].strip()
        assert _engine_text(path, prompt, CONTEXT).strip() == continuation


@pytest.mark.slow
def test_sentencepiece_path_and_bytes_give_the_same_bundle_tokenizer(llama):
    causal_lm, sp_path, _ = llama
    from_model = resolve_tokenizer(causal_lm)
    from_path = resolve_tokenizer(None, sp_path)
    with open(sp_path, "rb") as f:
        from_bytes = resolve_tokenizer(None, f.read())
    assert from_model == from_path == from_bytes
    assert (from_model.start_token, from_model.stop_tokens) == (1, (2,))
    assert from_model.vocabulary_size == len(WORDS) + 3


def test_hf_tokenizer_json(tmp_path):
    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3}
    spec = {"model": {"type": "WordLevel", "vocab": vocab, "unk_token": "a"}}
    path = tmp_path / "tokenizer.json"
    path.write_text(__import__("json").dumps(spec))
    resolved = resolve_tokenizer(None, str(path))
    assert (resolved.kind, resolved.start_token, resolved.stop_tokens) == (
        "hf_tokenizer_json",
        0,
        (1,),
    )
    resolved = resolve_tokenizer(None, str(path), start_token=None, stop_tokens="b")
    assert resolved.stop_tokens == (3,)
    # False: no start token at all (a model trained without one, SmolLM2's
    # ChatML), and the metadata declares none; the rest as resolved.
    none = resolve_tokenizer(None, str(path), start_token=False, stop_tokens="b")
    assert none == dataclasses.replace(resolved, start_token=None)
    metadata = llm_metadata_pb2.LlmMetadata()
    metadata.ParseFromString(llm_metadata(none, 16))
    assert not metadata.HasField("start_token")
    metadata.ParseFromString(llm_metadata(resolved, 16))
    assert list(metadata.start_token.token_ids.ids) == [0]
    with pytest.raises(ValueError, match="start_token=True"):
        resolve_tokenizer(None, str(path), start_token=True)
    with pytest.raises(ValueError, match="'zz' is not in the tokenizer"):
        resolve_tokenizer(None, str(path), stop_tokens=["zz"])


def test_litertlm_without_a_tokenizer_is_refused(tmp_path):
    tokens = keras.Input((None,), dtype="int32")
    logits = keras.layers.Dense(8)(keras.layers.Embedding(8, 4)(tokens))
    model = keras.Model(tokens, logits, name="bare_lm")
    with pytest.raises(ValueError, match="'bare_lm' has no preprocessor"):
        to_litert_lm(model, tmp_path / "m.litertlm", max_sequence_length=8)
    assert not os.path.exists(tmp_path / "m.litertlm")


def test_bad_tokenizers_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_tokenizer(None, str(tmp_path / "missing.model"))
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a sentencepiece model")
    with pytest.raises(ValueError, match="is not a SentencePiece model"):
        resolve_tokenizer(None, str(junk))
    with pytest.raises(TypeError, match="Received: int"):
        resolve_tokenizer(None, 3)


@pytest.mark.slow
def test_tokenizer_of_another_vocabulary_is_refused(llama, tmp_path):
    causal_lm, _, directory = llama
    tflite = str(directory / "llama.tflite")
    to_litert_lm(
        causal_lm,
        tflite,
        max_sequence_length=CONTEXT,
        prefill_lengths=(4,),
        overwrite=True,
    )
    with open(tflite, "rb") as f:
        content = f.read()
    assert check_engine_contract(content, CONTEXT) == len(WORDS) + 3
    bigger = os.path.join(str(tmp_path), "big")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(
            [*_sentences(50), "zeta eta iota lambda mu nu xi pi rho"]
        ),
        model_prefix=bigger,
        model_type="word",
        vocab_size=len(WORDS) + 12,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    with pytest.raises(ValueError, match="not the same model's"):
        write_bundle(
            content,
            tmp_path / "x.litertlm",
            tokenizer=bigger + ".model",
            max_sequence_length=CONTEXT,
        )
    with pytest.raises(ValueError, match="reads the context from dimension 2"):
        check_engine_contract(content, CONTEXT + 1)
