"""keras-hub's decoder language models through `to_tflite`: Gemma, Gemma3
(query/key norms, sliding window), Llama, Mistral, Qwen3, Phi3 and GPT-2,
their backbones and CausalLMs, built from small configurations with random
weights (nothing is downloaded).

Two shapes: the backbone as keras-hub builds it (batch and length open,
verified by the export at two lengths and here run in a raw LiteRT
interpreter at two more), and one fixed at 1 x 32 tokens, where a float32
file runs in one XNNPACK partition with only the token lookup and the
mask's integer preparation outside it, before the first layer
(`kerasnorm.export.litert.lowering`).

The matrix is family x mode x shape (x backbone or CausalLM for float32);
the default tier runs one cell per family, the cells chosen so that every
mode meets every shape; the slow tier runs float32's family x shape x head
pairwise (each family's backbone and CausalLM, each family at both shapes,
every shape with both heads) and the open shape's int8-weight files; the
exhaustive tier the rest of float32, the float16 files and the int8-weight
ones at 1 x 32.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from kerasnorm._compat import interpreter_ops
from kerasnorm.export import litert
from kerasnorm.export import to_tflite
from kerasnorm.export.litert.runner import interpreter as litert_interpreter
from kerasnorm.export.verify.delegation import delegation
from kerasnorm.export.verify.delegation import placement
from tests.export import lm_models

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only

VOCABULARY = lm_models.SIZES["decoder"]["vocabulary_size"]
FIXED = 32
# max |tflite - keras| / max |keras| of a float32 file (two graphs);
# rms(tflite - keras) / rms(keras) of the float16 and int8-weight files.
TOLERANCE = {None: 1e-4, "float16": 1e-2, "dynamic": 0.1}


FAMILIES = sorted(lm_models.BACKBONES)


def build(family, head="backbone"):
    keras.utils.set_random_seed(FAMILIES.index(family))
    options = lm_models.GEMMA3_SLIDING if family == "gemma3" else {}
    make = lm_models.causal_lm if head == "causal_lm" else lm_models.backbone
    return make(family, "decoder", **options)


def tokens(length, batch, seed=0):
    """Token ids and a padding mask: the first row padded at its tail, the
    second (where there is one) at its head, so that some of its queries
    attend to no key at all (Gemma wipes those rows)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), "int32")
    mask[0, length - length // 4 :] = 0
    if batch > 1:
        mask[1, : length // 4] = 0
    ids = rng.integers(1, VOCABULARY, (batch, length)).astype("int32") * mask
    return {"token_ids": ids, "padding_mask": mask}


def error(got, want, quantize):
    if quantize is None:
        return np.max(np.abs(got - want)) / np.max(np.abs(want))
    return np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))


def run_raw(content, feed):
    """The file's signature in a raw LiteRT interpreter, resized to `feed`."""
    runner = litert_interpreter(content).get_signature_runner(litert.SIGNATURE_KEY)
    (out,) = runner(**feed).values()
    return out


def outside_ops(content):
    """`(name, input dtypes, output dtypes, reads a partition's output)` of
    every op XNNPACK does not run."""
    interpreter = litert_interpreter(content)
    ops = interpreter_ops(interpreter)
    inside = placement(ops)
    dtypes = {
        t["index"]: np.dtype(t["dtype"]) for t in interpreter.get_tensor_details()
    }
    written = {
        int(t) for op in ops if op["op_name"] == "DELEGATE" for t in op["outputs"]
    }
    return [
        (
            op["op_name"],
            [dtypes[int(t)] for t in op["inputs"] if int(t) >= 0],
            [dtypes[int(t)] for t in op["outputs"] if int(t) >= 0],
            any(int(t) in written for t in op["inputs"]),
        )
        for op in ops
        if op["op_name"] != "DELEGATE" and not inside[op["index"]]
    ]


def check_open(family, quantize, head, tmp_path):
    model = build(family, head)
    path = tmp_path / f"{family}.tflite"
    result = to_tflite(model, path, quantize=quantize, verify_inputs=tokens(8, 2))
    assert result.verification.passed
    assert [{shape[1] for shape in call} for call in result.verification.shapes] == [
        {8},
        {4},
    ]
    content = path.read_bytes()
    assert not any(op.startswith("Flex") for op in litert.op_names(content))
    for length, batch in ((5, 2), (11, 1)):
        feed = tokens(length, batch, seed=length)
        want = np.asarray(model(feed, training=False))
        got = run_raw(content, feed)
        assert got.shape == want.shape
        assert error(got, want, quantize) <= TOLERANCE[quantize], (length, batch)


def check_fixed(family, quantize, head, tmp_path):
    model = build(family, head)
    path = tmp_path / f"{family}_fixed.tflite"
    feed = tokens(FIXED, 1)
    result = to_tflite(
        model,
        path,
        quantize=quantize,
        batch_size=1,
        input_signature={name: (1, FIXED) for name in model.input},
        verify_inputs=feed,
    )
    assert result.verification.passed
    content = path.read_bytes()
    want = np.asarray(model(feed, training=False))
    assert error(run_raw(content, feed), want, quantize) <= TOLERANCE[quantize]
    if quantize is not None:
        return
    assert delegation(content).partitions == 1
    floats = ("float16", "float32")
    for name, inputs, outputs, after in outside_ops(content):
        # Before the first layer: nothing outside reads a partition's output.
        assert not after, name
        # Integer / boolean preparation, the token lookup (GATHER of the
        # float table by int ids), and the mask's CAST from bool / int.
        computes_floats = any(d.name in floats for d in outputs)
        if name == "CAST":
            assert not any(d.name in floats for d in inputs), name
        elif name != "GATHER":
            assert not computes_floats, (name, inputs, outputs)


def _cells():
    fast = {
        ("gemma", None, "open", "backbone"),
        ("gemma3", "float16", "fixed", "causal_lm"),
        ("gpt2", None, "fixed", "causal_lm"),
        ("llama", "dynamic", "open", "causal_lm"),
        ("mistral", None, "fixed", "backbone"),
        ("phi3", "float16", "open", "backbone"),
        ("qwen3", "dynamic", "fixed", "backbone"),
    }
    cells = set(fast)
    for family in FAMILIES:
        for shape in ("open", "fixed"):
            for quantize in (None, "float16", "dynamic"):
                cells.add((family, quantize, shape, "backbone"))
            cells.add((family, None, shape, "causal_lm"))
    return [
        pytest.param(*cell, marks=_marks(cell, fast)) for cell in sorted(cells, key=str)
    ]


def _marks(cell, fast):
    """None for a default-tier cell; `slow` for the rest, `exhaustive` too
    for a float16 file and an int8-weight one at the fixed shape (float16
    weights change no op of the float32 graph; the open shape is the one
    users of "dynamic" ask for), and for the float32 cells beyond the
    pairwise cover (`_pairwise`)."""
    if cell in fast:
        return []
    family, quantize, shape, head = cell
    if quantize == "float16" or (quantize is not None and shape == "fixed"):
        return [pytest.mark.slow, pytest.mark.exhaustive]
    if quantize is None and (shape, head) not in _pairwise(family):
        return [pytest.mark.slow, pytest.mark.exhaustive]
    return [pytest.mark.slow]


def _pairwise(family):
    """The float32 (shape, head) cells of `family` in the slow tier: the
    open backbone and the fixed CausalLM, or the open CausalLM and the fixed
    backbone, alternately by family, so that every family meets both shapes
    and both heads, and every shape both heads."""
    if FAMILIES.index(family) % 2 == 0:
        return {("open", "backbone"), ("fixed", "causal_lm")}
    return {("open", "causal_lm"), ("fixed", "backbone")}


@pytest.mark.parametrize("family, quantize, shape, head", _cells())
def test_decoder_exports_builtins_only(family, quantize, shape, head, tmp_path):
    check = check_open if shape == "open" else check_fixed
    check(family, quantize, head, tmp_path)
