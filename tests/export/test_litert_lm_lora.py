"""Runtime LoRA: `to_litert_lm(..., lora="runtime")` writes the base file
with LiteRT-LM's adapter inputs, `write_lora_adapter` the adapter it is fed.

The references are independent of the export's LoRA path: the LoRA model's
output is the plain twin's (a model without LoRA given `kernel + alpha /
rank * a @ b`, computed here in numpy, `test_export_lora_half`), the base
model's is the LoRA model's with its adapters switched off. The file fed
the adapter (read back from the adapter file) must match the former, the
file fed zeros (the engine's fill for a conversation without one) the
latter: float32 logits within 1e-4 of the largest, the same greedy tokens.
"""

import keras
import numpy as np
import pytest

from kerasnorm._compat.keras_lora import set_lora_enabled
from kerasnorm.export import to_litert_lm
from kerasnorm.export import write_lora_adapter
from kerasnorm.export.litert.generator import Generator
from kerasnorm.export.litert_lm.adapter_file import PAGE
from kerasnorm.export.litert_lm.adapter_file import read_adapter
from kerasnorm.export.litert_lm.check import reference_logits
from tests.export import lm_models
from tests.export.test_export_lora_half import _lora_layers
from tests.export.test_export_lora_half import _plain_twin

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only
PROMPTS = lm_models.rule_sequences(2, seed=7)[:, :5]
CONTEXT = 24


def _lora_lm(family, seed=0, steps=16, **config):
    keras.utils.set_random_seed(0)
    model = lm_models.causal_lm(family, num_layers=2, **config)
    model.backbone.enable_lora(4)
    return lm_models.train_causal_lm(model, steps=steps, seed=seed)


def _greedy(content, prompt, adapter, steps=6):
    """The file's greedy continuation of `prompt` and every step's logits."""
    generator = Generator(content, adapter)
    rows = [generator.prefill(prompt)[-1]]
    sequence = [int(t) for t in prompt]
    for _ in range(steps):
        sequence.append(int(np.argmax(rows[-1])))
        rows.append(generator.decode(sequence[-1]))
    return sequence, np.stack(rows[:-1])


def _matches(model, content, adapter):
    """The file fed `adapter` against `model` (the reference's logits of
    the file's own greedy sequence): the largest error over the largest
    logit; the greedy tokens must be the reference's."""
    worst = 0.0
    for prompt in PROMPTS:
        sequence, got = _greedy(content, prompt, adapter)
        ref = reference_logits(model, sequence)[len(prompt) - 1 : -1]
        assert np.array_equal(got.argmax(-1), ref.argmax(-1))
        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
    return worst


def _check_runtime_file(family, tmp_path, **export):
    model = _lora_lm(family)
    result = to_litert_lm(
        model,
        tmp_path / "base.tflite",
        max_sequence_length=CONTEXT,
        prefill_lengths=(8,),
        verify_inputs=PROMPTS,
        lora="runtime",
        **export,
    )
    assert result.merged_lora == ()
    # The model's rank 4, zero-padded to the engine's smallest, 16.
    assert result.lora_rank == export.get("lora_rank", 16)
    # query and value in each of the two layers, A' and B' each.
    assert result.adapter_inputs == tuple(
        f"lora_atten_{p}_{s}_prime_weight_{i}"
        for i in range(2)
        for p in "qv"
        for s in "ab"
    )
    adapter = write_lora_adapter(
        model, tmp_path / "task.tflite", lora_rank=export.get("lora_rank")
    )
    with open(adapter.path, "rb") as f:
        rank, tensors = read_adapter(f.read())
    assert rank == result.lora_rank and tuple(tensors) == result.adapter_inputs
    with open(result.path, "rb") as f:
        content = f.read()
    plain = _plain_twin(model)
    fed = _matches(plain, content, tensors)
    for layer in _lora_layers(model):
        set_lora_enabled(layer, False)
    try:
        base = _matches(model, content, None)
    finally:
        for layer in _lora_layers(model):
            set_lora_enabled(layer, True)
    # The adapter changes the answer (LiteRT-LM #3173: one that loads and
    # has no effect).
    with_adapter = Generator(content, tensors).prefill(PROMPTS[0])
    without = Generator(content).prefill(PROMPTS[0])
    assert np.abs(with_adapter - without).max() > 100 * 1e-4 * np.abs(without).max()
    return result, adapter, fed, base


def test_runtime_lora_llama_file_and_adapter(tmp_path):
    result, adapter, fed, base = _check_runtime_file("llama", tmp_path)
    assert fed <= 1e-4 and base <= 1e-4
    # The export's own checks: the LoRA model with its adapter fed, the
    # base model with zeros.
    assert result.check.max_error <= 1e-4 and result.check.agreement == 1.0
    assert result.base_check.max_error <= 1e-4
    assert adapter.rank == 16 and adapter.inputs == result.adapter_inputs
    # The LoRA weights zero-padded from rank 4 to 16 (4x), a table per
    # tensor (a name of ~30 bytes, the shape, the offset: ~110 bytes each),
    # the file's end on a 16 KiB page.
    padded = 4 * adapter.lora_bytes
    assert padded <= adapter.size_bytes <= -(-(padded + 128 * 8) // PAGE) * PAGE


@pytest.mark.slow
def test_runtime_lora_gemma_file_and_adapter(tmp_path):
    result, _, fed, base = _check_runtime_file("gemma", tmp_path)
    assert fed <= 1e-4 and base <= 1e-4
    assert result.base_check.agreement == 1.0


@pytest.mark.slow
def test_runtime_lora_reserves_a_larger_rank(tmp_path):
    """`lora_rank=32` on a rank-4 model: the inputs take rank 32, the
    adapter is zero-padded to it and computes the same."""
    _, adapter, fed, _ = _check_runtime_file("llama", tmp_path, lora_rank=32)
    assert fed <= 1e-4 and adapter.rank == 32


def test_adapter_size_within_a_tenth_of_its_lora_weights(tmp_path):
    """A rank-16 LoRA (the engine's rank, no padding) at hidden 128 (heads
    4 / 2, head 32; 104 KiB of LoRA weights): the tables and the last page
    are under a tenth of the weights; A' and B' are Keras' own factors,
    not a block-diagonal expansion of the per-head LoRA."""
    keras.utils.set_random_seed(0)
    model = lm_models.causal_lm(
        "llama", num_layers=2, hidden_dim=128, intermediate_dim=64
    )
    model.backbone.enable_lora(16)
    base = write_lora_adapter(model, tmp_path / "base.tflite", base=True)
    assert base.size_bytes <= 1.1 * base.lora_bytes
    with open(base.path, "rb") as f:
        assert not any(np.any(t) for t in read_adapter(f.read())[1].values())
    for layer in _lora_layers(model):
        b = layer.lora_kernel_b
        b.assign(np.random.default_rng(0).normal(size=b.shape).astype("float32"))
    adapter = write_lora_adapter(model, tmp_path / "a.tflite")
    assert adapter.size_bytes <= 1.1 * adapter.lora_bytes


def test_lora_on_a_feed_forward_is_refused_by_name(tmp_path):
    keras.utils.set_random_seed(0)
    model = lm_models.causal_lm("llama", num_layers=1)
    model.backbone.enable_lora(
        2, target_layer_names=["query", "feedforward_gate_dense"]
    )
    refusal = r"'feedforward_gate_dense'.*lora=\"merge\""
    with pytest.raises(ValueError, match=refusal):
        write_lora_adapter(model, tmp_path / "a.tflite")
    with pytest.raises(ValueError, match=refusal):
        to_litert_lm(
            model, tmp_path / "m.tflite", max_sequence_length=8, lora="runtime"
        )
    assert not (tmp_path / "m.tflite").exists()


def test_runtime_lora_options_refused(tmp_path):
    keras.utils.set_random_seed(0)
    model = lm_models.causal_lm("llama", num_layers=1)
    given = {"max_sequence_length": 8}
    with pytest.raises(ValueError, match="no LoRA adapters"):
        to_litert_lm(model, tmp_path / "m.tflite", lora="runtime", **given)
    model.backbone.enable_lora(4)
    with pytest.raises(ValueError, match=r"`lora` is one of .*lora='merged'"):
        to_litert_lm(model, tmp_path / "m.tflite", lora="merged", **given)
    with pytest.raises(ValueError, match="Received: lora_rank=16"):
        to_litert_lm(model, tmp_path / "m.tflite", lora_rank=16, **given)
    with pytest.raises(ValueError, match=r"model's \(4\): 16 or 32.*lora_rank=8"):
        to_litert_lm(model, tmp_path / "m.tflite", lora="runtime", lora_rank=8, **given)
    with pytest.raises(ValueError, match='smooth=None with lora="runtime"'):
        to_litert_lm(
            model,
            tmp_path / "m.tflite",
            lora="runtime",
            quantize="dynamic",
            smooth=True,
            **given,
        )


# CI's slow tier runs int4 (its own weights pass: blocks, GPTQ's
# calibration beside the adapter inputs); the other modes are `exhaustive`.
@pytest.mark.slow
@pytest.mark.parametrize(
    "quantize",
    [
        pytest.param(mode, marks=() if mode == "int4" else (pytest.mark.exhaustive,))
        for mode in ("float16", "dynamic", "int4", "weight_only_int8")
    ],
)
def test_runtime_lora_in_every_quantized_mode(quantize, tmp_path):
    """The base weights quantized as the mode quantizes, the adapters fed
    in float32 (their products read no constant): checked as the mode's
    files are, fed the adapter against the LoRA model and fed zeros
    against the base model."""
    model = _lora_lm("llama")
    result = to_litert_lm(
        model,
        tmp_path / "base.tflite",
        max_sequence_length=CONTEXT,
        prefill_lengths=(8,),
        verify_inputs=PROMPTS,
        lora="runtime",
        quantize=quantize,
    )
    assert result.quantize == quantize and result.lora_rank == 16
    for check in (result.check, result.base_check):
        assert check.min_agreement is not None
        assert check.agreement >= check.min_agreement


@pytest.mark.slow
def test_kerasnorm_export_adapter_and_export_lora_runtime(tmp_path, capsys):
    """The command line: the base `.keras` and the fine-tune's
    `save_lora_weights` file to the base file (`export --lora runtime
    --lora-weights`) and the adapter (`export-adapter`), as the Python API
    writes them from the fine-tuned model."""
    from kerasnorm_cli import command

    keras.utils.set_random_seed(0)
    model = lm_models.causal_lm("llama", num_layers=2)
    base = tmp_path / "base.keras"
    model.save(base)
    model.backbone.enable_lora(4)
    lm_models.train_causal_lm(model, steps=16)
    weights = str(tmp_path / "task.lora.h5")
    model.backbone.save_lora_weights(weights)
    out = tmp_path / "out"
    argv = ["export-adapter", str(base), "--lora-weights", weights, "--out", str(out)]
    assert command(argv) == 0, capsys.readouterr()
    expected = write_lora_adapter(model, tmp_path / "api.tflite")
    assert (out / "base.lora.tflite").read_bytes() == open(expected.path, "rb").read()
    argv = ["export", str(base), "--out", str(out), "--format", "litert_lm"]
    argv += ["--max-sequence-length", "24", "--prefill-lengths", "8"]
    assert command([*argv, "--lora", "runtime", "--lora-weights", weights]) == 0
    content = (out / "base.tflite").read_bytes()
    with open(expected.path, "rb") as f:
        _, tensors = read_adapter(f.read())
    assert _matches(_plain_twin(model), content, tensors) <= 1e-4


def test_lora_weights_flag_refused_before_any_work(tmp_path, capsys):
    from kerasnorm_cli import command

    base = tmp_path / "base.keras"
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(base)
    argv = ["export-adapter", str(base), "--out", str(tmp_path / "out")]
    assert command([*argv, "--lora-weights", str(tmp_path / "x.h5")]) == 2
    assert "save_lora_weights' .lora.h5 file" in capsys.readouterr().err
    assert command([*argv, "--lora-weights", str(tmp_path / "x.lora.h5")]) == 2
    assert "--lora-weights file not found" in capsys.readouterr().err
    (tmp_path / "x.lora.h5").write_bytes(b"")
    assert command([*argv, "--lora-weights", str(tmp_path / "x.lora.h5")]) == 2
    assert "backbone" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_runtime_file_is_the_base_files_graph_plus_the_adapter_inputs(tmp_path):
    """Against the base model written plainly (no LoRA, the same base
    weights): the same ops plus, per adapted projection, the two products
    on activations, their two reshapes and the add, and per adapted value
    one reshape more (its part of the fused query/key/value product is
    reshaped to heads before the add; the base file's one reshape to the
    cache's layout takes the slice); the same partitions."""
    from tests.export.test_export_lora_half import _without_lora

    model = _lora_lm("llama")
    config = keras.saving.serialize_keras_object(model)
    plain = keras.saving.deserialize_keras_object(_without_lora(config))
    sources = {w.path: w for w in model.weights}
    for weight in plain.weights:
        weight.assign(sources[weight.path].numpy())
    given = {"max_sequence_length": CONTEXT, "prefill_lengths": (8,)}
    runtime = to_litert_lm(model, tmp_path / "r.tflite", lora="runtime", **given)
    base = to_litert_lm(plain, tmp_path / "b.tflite", **given)
    adapted = len(runtime.adapter_inputs) // 2
    values = sum(name.startswith("lora_atten_v_a") for name in runtime.adapter_inputs)
    added = {
        "ADD": adapted,
        "RESHAPE": 2 * adapted + values,
        "BATCH_MATMUL": 2 * adapted,
    }
    ops = set(runtime.op_counts) | set(base.op_counts)
    assert {
        op: runtime.op_counts.get(op, 0) - base.op_counts.get(op, 0)
        for op in ops
        if runtime.op_counts.get(op, 0) != base.op_counts.get(op, 0)
    } == added
    assert runtime.delegation.partitions == base.delegation.partitions == 1
