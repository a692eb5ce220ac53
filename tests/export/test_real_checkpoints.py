"""The real-checkpoint loader's pieces (tests/support/real_models.py), on
small arrays: llama.cpp's query/key permutation undone, and each GGUF
block type's quantization step (what `perturb=True` scales its noise by)."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from tests.support import real_models  # noqa: E402

Q = gguf.GGMLQuantizationType


def llama_cpp_permute(weights, n_head, n_head_kv=None):
    """llama.cpp convert_hf_to_gguf.py's `LlamaModel.permute`, as written
    there."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_permute(heads):
    w = np.random.default_rng(0).standard_normal((heads * 8, 5)).astype(np.float32)
    permuted = llama_cpp_permute(w, heads)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(real_models.unpermute(permuted, heads), w)


def _grid(values, step, offset=0.0):
    """How far (in steps) `values - offset` lies from a whole multiple of
    `step`, at most."""
    q = (values - offset) / step
    return float(np.abs(q - np.round(q)).max())


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_0, Q.Q8_0])
def test_symmetric_blocks_step_is_the_grid(qtype):
    rows = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    raw = gguf.quants.quantize(rows, qtype)
    values = gguf.quants.dequantize(raw, qtype)
    step = real_models.steps(raw, qtype)
    assert step.shape == rows.shape and (step > 0).all()
    # Every value is a whole number of its block's steps, and the step is
    # the rounding's: values within half a step of the input (but where the
    # scale's float16 rounding or the range's one-sided end clips).
    assert _grid(values, step) < 1e-3
    error = np.abs(values - rows) / step
    assert np.mean(error <= 0.5 + 1e-3) > 0.95 and error.max() <= 1.0


def test_q4_1_step_is_the_grid_above_the_block_minimum():
    rows = np.random.default_rng(2).standard_normal((3, 96)).astype(np.float32)
    raw = gguf.quants.quantize(rows, Q.Q4_1)
    values = gguf.quants.dequantize(raw, Q.Q4_1)
    step = real_models.steps(raw, Q.Q4_1)
    minimum = np.repeat(values.reshape(-1, 32).min(-1, keepdims=True), 32, 1)
    assert _grid(values, step, minimum.reshape(values.shape)) < 1e-3
    assert (np.abs(values - rows) <= 0.5 * step + 1e-3).all()


def _k_blocks(qtype, n, rng):
    """`n` random super-blocks of a K type with finite, positive scales."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    d = np.full((n, 1), 0.01, np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        raw[:, 208:210] = d
    else:
        raw[:, 0:2] = d
        raw[:, 2:4] = np.full((n, 1), 0.02, np.float16).view(np.uint8)
    return raw


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_k_quant_sub_block_step_is_the_grid(qtype):
    raw = _k_blocks(qtype, 3, np.random.default_rng(3))
    values = gguf.quants.dequantize(raw, qtype)
    step = real_models.steps(raw, qtype)
    assert step.shape == values.shape
    sub = 32 if qtype == Q.Q4_K else 16
    nonzero = step > 0
    if qtype == Q.Q6_K:
        assert _grid(values[nonzero], step[nonzero]) < 1e-3
    else:
        # d * sc * q - dmin * m: whole steps above each sub-block's offset.
        blocks = values.reshape(-1, sub)
        low = np.repeat(blocks.min(-1, keepdims=True), sub, 1).reshape(values.shape)
        assert _grid(values[nonzero], step[nonzero], low[nonzero]) < 1e-3
    # One step per sub-block.
    per_sub = step.reshape(-1, sub)
    assert (per_sub == per_sub[:, :1]).all()


def test_float_tensors_have_no_step():
    assert real_models.steps(np.zeros((2, 8), np.float32), Q.F32) is None
