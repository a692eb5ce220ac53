"""Every text CausalLM family of keras-hub through one cached step, the
model's own `call_with_cache` (`litert_lm.hub_step`): each family in a small
configuration trained for seconds on the sequence rule, exported float32 and
`"dynamic"`, and checked by `to_litert_lm` against the model's full forward
pass (greedy tokens and every step's logits within 1e-4 of the largest in
float32; 90 % teacher-forced agreement in `"dynamic"`).

The default tier runs a pairwise cover (each family in one mode); the slow
tier every family in both, with `test_litert_lm_matrix.py` (Llama, Qwen3,
GPT-2 and Gemma there, in float32, float16 and "dynamic")."""

import keras
import numpy as np
import pytest

from kerasnorm._compat import interpreter_ops
from kerasnorm.export import to_litert_lm
from kerasnorm.export.litert.runner import interpreter
from kerasnorm.export.litert_lm.check import check_generation
from kerasnorm.export.litert_lm.decode_report import decode_delegation
from kerasnorm.export.litert_lm.families import ROWS
from kerasnorm.export.litert_lm.hub_step import cached_hub_model
from kerasnorm.export.litert_lm.steps import CachePathError
from kerasnorm.export.litert_lm.steps import cached_model
from kerasnorm.export.litert_lm.write import write_generative
from tests.export import lm_models
from tests.export.flatbuffer_ops import cache_writes

# The oldest-stack pass installs no keras-hub.
keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only
FAMILIES = list(lm_models.HUB_FAMILIES)
# The float32 decode step's XNNPACK partitions (the generation guide's
# family table): one, the causal mask compared in integers before the first
# delegated op (`hub_views.causal_mask`), a mixture of experts' routing in
# float arithmetic (`litert.routing`) and GPT-OSS's experts' interleaved
# halves as reshapes (`litert.lowering`).
PARTITIONS = dict.fromkeys(FAMILIES, 1)
# Default tier: one mode per family, covering sliding windows shorter than
# the context (Gemma3 interleaved with a global layer), ALiBi, Phi3's
# rotary scaling (float32, random weights: the check is as strict), and
# GPT-NeoX's partial rotary and a mixture of experts in "dynamic" (trained).
COVER = [
    ("gemma3_window", None),
    ("bloom", None),
    ("phi3", None),
    ("gpt_neox", "dynamic"),
    ("qwen_moe", "dynamic"),
]
CONTEXT = 24


_TRAINED = {}
# Training steps: learned position tables (GPT-2, OPT) and ALiBi (Bloom,
# whose "dynamic" file needs clear choices) learn the rule more slowly.
STEPS = {"gpt2": 320, "opt": 320, "bloom": 256}
PROMPTS = lm_models.rule_sequences(2, seed=11)[:, :5]


def trained(family):
    if family not in _TRAINED:
        model = lm_models.hub_causal_lm(family, seed=0)
        lm_models.train(model, steps=STEPS.get(family, 128))
        _TRAINED[family] = model
    return _TRAINED[family]


def _learned(model, family):
    """The model learned the rule: its greedy choices follow it at least
    three times as often as chance (1 in 23), so the checks compare against
    a model that attends where it should."""
    rule = lm_models.rule_sequences(2, seed=11)
    full = np.asarray(
        model({"token_ids": rule, "padding_mask": np.ones_like(rule, bool)})
    )
    assert (full[:, 1:-1].argmax(-1) == rule[:, 2:]).mean() > 0.15, family


def _generates(family, quantize, tmp_path, train=True):
    model = trained(family) if train else lm_models.hub_causal_lm(family, seed=0)
    if train:
        _learned(model, family)
    prompts = PROMPTS
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=CONTEXT,
        prefill_lengths=(8,),
        quantize=quantize,
        verify_inputs=prompts,
    )
    # 12 generated steps from each prompt, and the one prefill signature's
    # last row on a full chunk.
    assert result.check.steps == 24 + 1
    if quantize is None:
        assert result.check.max_error <= 1e-4
        assert result.check.agreement == 1.0
        assert result.delegation.partitions == PARTITIONS[family], result.delegation
        # The decode step's cache writes are its last ops, after the
        # partition: one per cache.
        writes = cache_writes((tmp_path / "lm.tflite").read_bytes())
        assert writes == result.delegation.undelegated["DYNAMIC_UPDATE_SLICE"]
        assert writes == 2 * len(cached_model(model, CONTEXT).cache_shapes)
    else:
        assert result.check.agreement >= 0.9
    return result


@pytest.mark.parametrize("family, quantize", COVER)
def test_family_generates(family, quantize, tmp_path):
    _generates(family, quantize, tmp_path, train=quantize is not None)


# test_litert_lm_matrix.py generates with the (generic) step of Llama,
# Qwen3, GPT-2 and Gemma, trained on the same rule, in float32, "dynamic"
# and float16, and the default tier's COVER runs five more families: their
# cells here join the `exhaustive` tier. CI's slow tier runs every other
# family once, float32 and "dynamic" alternating down the table (each mode
# on six families); the family's other mode is `exhaustive`.
MATRIX_COVERED = ("llama", "qwen3", "gpt2", "gemma")


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, quantize",
    list(
        lm_models.one_mode_each(
            FAMILIES,
            [(None,), ("dynamic",)],
            "hub-family",
            covered=MATRIX_COVERED + tuple(c for c, _ in COVER),
        )
    ),
)
def test_every_family_generates(family, quantize, tmp_path):
    _generates(family, quantize, tmp_path)


def _generic(model, quantize):
    """The generic step's file of `model`, checked as `to_litert_lm` checks."""
    content = write_generative(
        cached_hub_model(model),
        prefill_lengths=(8,),
        max_sequence_length=CONTEXT,
        quantize=quantize,
    )
    check = check_generation(model, content, PROMPTS, quantize=quantize, invented=False)
    return check, decode_delegation(content)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_the_decode_step_reads_the_file_cache_in_place(family):
    """The generic step's decode graph holds no TRANSPOSE and no repeat of
    the cache (keras-hub's `[B, L, g, d]` kept as the file's `[B, g, L,
    d]`, grouped query heads reshaped around one product); each attention
    product has the cache, `(1, g, L, d)`, as its right-hand side; the
    causal mask is compared in integers before the first delegated op:
    one partition. Llama groups 4 query heads over 2 key/value heads,
    Gemma3 writes its own grouped einsum, GPT-2's Keras attention puts the
    key first."""
    model = lm_models.hub_causal_lm(family, seed=0)
    cached = cached_hub_model(model)
    content = write_generative(
        cached, prefill_lengths=(8,), max_sequence_length=CONTEXT
    )
    found = interpreter(content)
    shapes = {t["index"]: tuple(t["shape"]) for t in found.get_tensor_details()}
    ops = interpreter_ops(found)
    names = [op["op_name"] for op in ops]
    assert not {"TRANSPOSE", "TILE", "BROADCAST_TO", "GATHER_ND"} & set(names)
    caches = {(1, g, CONTEXT, d) for g, d in cached.cache_shapes}
    products = [op for op in ops if op["op_name"] == "BATCH_MATMUL"]
    # Two products read each cache pair in place (the scores, the weighted
    # values); the others read the new row, kept apart (`hub_views.HeadsFirst`).
    reading = [op for op in products if shapes[int(op["inputs"][1])] in caches]
    rows = {(1, g, 1, d) for g, d in cached.cache_shapes}
    assert len(reading) == 2 * len(cached.cache_shapes)
    assert all(
        shapes[int(op["inputs"][1])] in rows for op in products if op not in reading
    )
    assert decode_delegation(content).partitions == 1
    assert cache_writes(content) == 2 * len(cached.cache_shapes)


@pytest.mark.parametrize("quantize", ["dynamic", "int4"])
def test_a_quantized_decode_step_is_one_partition(quantize):
    """The quantized files keep the float32 file's one partition (Gemma3:
    query/key norms, soft caps, its own grouped einsum)."""
    model = lm_models.hub_causal_lm("gemma3", seed=0)
    content = write_generative(
        cached_hub_model(model),
        prefill_lengths=(8,),
        max_sequence_length=CONTEXT,
        quantize=quantize,
    )
    assert decode_delegation(content).partitions == 1


def test_every_causal_lm_takes_the_generic_step():
    """No family has a step of its own: Llama, Gemma and GPT-2 too go
    through their `call_with_cache` (`hub_step`)."""
    for family in ("llama", "gemma", "gpt2", "mistral"):
        model = lm_models.hub_causal_lm(family, seed=0)
        assert cached_model(model, 8).step.__module__.endswith("hub_step")


def test_the_window_is_shorter_than_the_context_and_masks():
    """Gemma3's sliding-window layers see 6 tokens of the tests' 24: the
    same weights with a window as long as the context give other logits
    past it, so the file's agreement with the full pass covers the
    window's mask."""
    model = lm_models.hub_causal_lm("gemma3_window", seed=0)
    plain = lm_models.hub_causal_lm(
        "gemma3_window", seed=0, sliding_window_size=CONTEXT
    )
    plain.set_weights(model.get_weights())
    window = model.backbone.transformer_layers[0].attention.sliding_window_size
    assert window < CONTEXT
    ids = lm_models.rule_sequences(1, length=CONTEXT, seed=3)
    batch = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    a, b = np.asarray(model(batch)), np.asarray(plain(batch))
    np.testing.assert_allclose(a[:, :window], b[:, :window], atol=1e-5)
    assert np.abs(a[:, window + 1 :] - b[:, window + 1 :]).max() > 1e-3


@pytest.mark.parametrize("family", ["qwen", "qwen2"])
def test_a_qwen_sliding_window_follows_the_full_pass(family):
    """Qwen's cached call asks `if cache_update_index` of a tensor
    (keras-hub 0.32's `generate()` fails on it); the file follows the
    full pass, whose window of 6 of the 24 positions changes the logits
    (checked against the same weights with a window as long as the
    context), in one partition."""
    window = {"use_sliding_window_attention": True, "sliding_window_size": 6}
    model = lm_models.hub_causal_lm(family, seed=0, **window)
    plain = lm_models.hub_causal_lm(
        family, seed=0, **{**window, "sliding_window_size": CONTEXT}
    )
    plain.set_weights(model.get_weights())
    ids = lm_models.rule_sequences(1, length=CONTEXT, seed=3)
    batch = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    assert np.abs(np.asarray(model(batch)) - np.asarray(plain(batch))).max() > 1e-3
    check, delegation = _generic(model, None)
    assert check.max_error <= 1e-4 and check.agreement == 1.0
    assert delegation.partitions == 1, delegation


def test_every_causal_lm_class_is_covered_or_refused_by_name():
    """Each CausalLM subclass keras-hub exports either has a family in the
    matrix or is refused by name with what it would take (encoder-decoders,
    `Seq2SeqLM`, all together)."""
    covered = {lm for lm, _, _ in lm_models.HUB_FAMILIES.values()}
    # Gemma 4's configurations: test_litert_lm_gemma4.py.
    covered.add("Gemma4CausalLM")
    models = keras_hub.models
    classes = {
        name
        for name in dir(models)
        if isinstance(getattr(models, name), type)
        and issubclass(getattr(models, name), models.CausalLM)
        and not issubclass(getattr(models, name), models.Seq2SeqLM)
        and name != "CausalLM"
    }
    refused = {row.name for row in ROWS if row.refused is not None}
    assert classes - covered - refused == set()
    assert covered & refused == set()


def test_a_recurrent_family_is_refused_by_name(tmp_path):
    backbone = keras_hub.models.RWKV7Backbone(
        hidden_size=32,
        head_size=16,
        num_layers=1,
        vocabulary_size=lm_models.VOCAB,
        intermediate_dim=64,
    )
    model = keras_hub.models.RWKV7CausalLM(backbone=backbone, preprocessor=None)
    with pytest.raises(CachePathError, match=r"RWKV7CausalLM .* recurrent state"):
        to_litert_lm(model, tmp_path / "lm.tflite", max_sequence_length=8)
    assert not list(tmp_path.iterdir())


def test_an_encoder_decoder_is_refused(tmp_path):
    backbone = keras_hub.models.BartBackbone(
        vocabulary_size=lm_models.VOCAB,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
    )
    model = keras_hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=None)
    with pytest.raises(CachePathError, match=r"BartSeq2SeqLM .* encoder-decoder"):
        to_litert_lm(model, tmp_path / "lm.tflite", max_sequence_length=8)
    assert not list(tmp_path.iterdir())


class _StateLM(keras_hub.models.LlamaCausalLM):
    """A family whose cached call keeps something other than keys and
    values: here a dict of a running sum, as a recurrent family would."""

    def _build_cache(self, token_ids):
        hidden = self.backbone.token_embedding(token_ids)
        return hidden, {"state": keras.ops.sum(hidden, axis=1)}


def test_a_cache_that_is_not_keys_and_values_is_refused_naming_it(tmp_path):
    llama = lm_models.hub_causal_lm("llama", seed=0)
    model = _StateLM(backbone=llama.backbone, preprocessor=None)
    with pytest.raises(
        CachePathError, match=r"_StateLM .*keeps \{'state': \(1, 32\)\}"
    ):
        to_litert_lm(model, tmp_path / "lm.tflite", max_sequence_length=8)
    assert not list(tmp_path.iterdir())


class _BrokenLM(keras_hub.models.LlamaCausalLM):
    """A cached call that fails."""

    def call_with_cache(self, token_ids, cache, cache_update_index):
        raise NotImplementedError("no cache here")


class _IndexLM(keras_hub.models.LlamaCausalLM):
    """A cached call that reads its layers' caches otherwise than
    `cache[:, i, ...]` (keras-hub's CausalLMs all read them so)."""

    def call_with_cache(self, token_ids, cache, cache_update_index):
        if not keras.ops.is_tensor(cache):
            cache[0]  # the step's view of the caches refuses this
        return super().call_with_cache(token_ids, cache, cache_update_index)


def test_a_failing_or_unusual_cached_call_is_refused(tmp_path):
    llama = lm_models.hub_causal_lm("llama", seed=0)
    broken = _BrokenLM(backbone=llama.backbone, preprocessor=None)
    with pytest.raises(CachePathError, match=r"_BrokenLM .*failed: .*no cache"):
        to_litert_lm(broken, tmp_path / "lm.tflite", max_sequence_length=8)
    index = _IndexLM(backbone=llama.backbone, preprocessor=None)
    with pytest.raises(TypeError, match=r"indexed its cache with 0"):
        to_litert_lm(index, tmp_path / "lm.tflite", max_sequence_length=8)
    assert not list(tmp_path.iterdir())


class _BranchingLM(keras_hub.models.LlamaCausalLM):
    """A cached call written for `tf.function`: it branches on a tensor,
    which autograph turns into a `tf.cond` (the steps trace without it
    first, `write._traced`). The branch is never taken."""

    def call_with_cache(self, token_ids, cache, cache_update_index):
        logits, hidden, cache = super().call_with_cache(
            token_ids, cache, cache_update_index
        )
        if keras.ops.min(token_ids) < 0:
            logits = keras.ops.zeros_like(logits)
        return logits, hidden, cache


def test_a_cached_call_that_branches_on_a_tensor_generates(tmp_path):
    llama = lm_models.hub_causal_lm("llama", seed=0)
    model = _BranchingLM(backbone=llama.backbone, preprocessor=None)
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=CONTEXT,
        prefill_lengths=(8,),
        verify_inputs=PROMPTS,
    )
    assert result.check.max_error <= 1e-4 and result.check.agreement == 1.0
