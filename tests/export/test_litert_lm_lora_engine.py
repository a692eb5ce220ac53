"""Runtime LoRA in LiteRT-LM's own engine: two fine-tunes of one base model
shipped as one `.litertlm` and two adapter files.

A keras-hub Llama CausalLM with a word-level SentencePiece tokenizer
(`test_litert_lm_engine`) learns a cycle of eight words (each word followed
by the next); two copies of it, each with `enable_lora(4)`, learn in
seconds another task each: the cycle backwards, and every other word. The
base bundle (`lora="runtime"`, written from the first copy: its frozen
base weights) and the two adapters (`write_lora_adapter`) run in the
engine (`Engine(..., lora_rank_config=LoraRankConfig(16))`): with each
adapter the engine's greedy text is its Keras model's `generate()`, token
for token, and with the zero adapter (`base=True`) the base model's;
each task's answer differs from the base's (LiteRT-LM #3173: an adapter
that loads and has no effect). The conversation API takes the adapter as
the session does.
"""

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")
spm = pytest.importorskip("sentencepiece")
litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

import keras  # noqa: E402

from kerasnorm.export import to_litert_lm  # noqa: E402
from kerasnorm.export import write_lora_adapter  # noqa: E402
from tests.export import lm_models  # noqa: E402
from tests.export.test_litert_lm_engine import SENTENCE  # noqa: E402
from tests.export.test_litert_lm_engine import WORDS  # noqa: E402
from tests.export.test_litert_lm_engine import _sentencepiece  # noqa: E402

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]
CONTEXT = 24
TASKS = {"base": 1, "backwards": -1, "skip": 2}  # the step through the cycle


def _sentences(step, count, seed=0):
    starts = np.random.default_rng(seed).integers(0, len(WORDS), count)
    return [
        " ".join(WORDS[(s + step * i) % len(WORDS)] for i in range(SENTENCE))
        for s in starts
    ]


def _fit(model, preprocessor, texts, epochs):
    x, y, weights = preprocessor(texts)
    lm_models.fit_preprocessed(model, x, y, weights, epochs)


@pytest.fixture(scope="module")
def fine_tunes(tmp_path_factory):
    """`{task: CausalLM}`: the base and two LoRA fine-tunes of it."""
    directory = tmp_path_factory.mktemp("lora")
    with open(_sentencepiece(str(directory)), "rb") as f:
        tokenizer = keras_hub.models.LlamaTokenizer(proto=f.read())
    preprocessor = keras_hub.models.LlamaCausalLMPreprocessor(
        tokenizer, sequence_length=SENTENCE + 2
    )
    keras.utils.set_random_seed(0)
    base = lm_models.backbone("llama", vocabulary_size=tokenizer.vocabulary_size())
    _fit(
        keras_hub.models.LlamaCausalLM(base, None), preprocessor, _sentences(1, 256), 6
    )
    models = {}
    for task, step in TASKS.items():
        backbone = base.from_config(base.get_config())
        backbone.set_weights(base.get_weights())
        if task != "base":
            backbone.enable_lora(4)
            trainer = keras_hub.models.LlamaCausalLM(backbone, None)
            _fit(trainer, preprocessor, _sentences(step, 256, seed=abs(step)), 8)
        models[task] = keras_hub.models.LlamaCausalLM(backbone, preprocessor)
        models[task].compile(sampler="greedy")
    return models, directory


def _engine_text(engine, prompt, adapter=None):
    lora = None if adapter is None else litert_lm.LoraConfig(lora_path=adapter)
    session = engine.create_session(
        apply_prompt_template=False,
        sampler_config=litert_lm.SamplerConfig(top_k=1),
        max_output_tokens=CONTEXT,
        lora_config=lora,
    )
    try:
        session.run_prefill([prompt])
        return session.run_decode().texts[0].strip()
    finally:
        session.close()


def test_two_fine_tunes_one_bundle_two_adapters(fine_tunes):
    models, directory = fine_tunes
    bundle = str(directory / "base.litertlm")
    # The base file from a fine-tune: its frozen base weights, unmerged.
    result = to_litert_lm(
        models["backwards"],
        bundle,
        max_sequence_length=CONTEXT,
        prefill_lengths=(4,),
        lora="runtime",
    )
    assert result.lora_rank == 16 and "with its adapter" in result.engine
    adapters = {
        task: write_lora_adapter(models[task], directory / f"{task}.tflite").path
        for task in ("backwards", "skip")
    }
    # The base model's conversation: the zero adapter (without one the
    # engine leaves the adapter inputs unset).
    base = write_lora_adapter(models["skip"], directory / "base.tflite", base=True)
    adapters["base"] = base.path
    engine = litert_lm.Engine(
        bundle,
        backend=litert_lm.Backend.CPU(thread_count=1),
        cache_dir=":nocache",
        lora_rank_config=litert_lm.LoraRankConfig(lora_rank=result.lora_rank),
    )
    try:
        prompt = "gamma delta"
        answers = {}
        for task, model in models.items():
            expected = model.generate(prompt, max_length=CONTEXT)[len(prompt) :]
            answers[task] = _engine_text(engine, prompt, adapters[task])
            assert answers[task] == expected.strip(), task
        # Each adapter changes the answer, each its own way.
        assert len(set(answers.values())) == 3, answers
        # The conversation API takes the adapter as the session does: its
        # reply is the session's on the prompt its template renders.
        lora = litert_lm.LoraConfig(lora_path=adapters["skip"])
        conversation = engine.create_conversation(
            lora_config=lora, sampler_config=litert_lm.SamplerConfig(top_k=1)
        )
        message = {"role": "user", "content": prompt}
        rendered = conversation.render_message_to_string(message)
        reply = conversation.send_message(message)
        conversation.close()
        text = "".join(part["text"] for part in reply["content"])
        assert text.strip() == _engine_text(engine, rendered, adapters["skip"])
    finally:
        engine.close()
