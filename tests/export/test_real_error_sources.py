"""The real-model error simulation's int8 rounding (`export/real_error_sources.py`),
against loops over each channel and block."""

import numpy as np
import pytest

from export.real_error_sources import int8_channels

pytestmark = pytest.mark.tf_only


def _rounded(values):
    step = np.abs(values).max() / 127.0
    return np.round(values / step) * step if step else values


def test_one_scale_per_output_channel():
    kernel = np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32)
    want = np.stack([_rounded(kernel[:, j]) for j in range(5)], axis=1)
    np.testing.assert_allclose(int8_channels(kernel, (0,)), want, rtol=1e-6)


@pytest.mark.parametrize("block", [2, 4, 12])
def test_one_scale_per_block_of_inputs(block):
    # An attention output kernel: [heads, head_dim, hidden], inputs on (0, 1).
    kernel = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    kernel[0, 0, 0] = 40.0  # an outlier coarsens its own block only
    flat = kernel.reshape(12, 5)
    want = np.empty_like(flat)
    for j in range(5):
        for start in range(0, 12, block):
            want[start : start + block, j] = _rounded(flat[start : start + block, j])
    got = int8_channels(kernel, (0, 1), block)
    np.testing.assert_allclose(got, want.reshape(kernel.shape), rtol=1e-6)
    if block == 12:
        np.testing.assert_allclose(got, int8_channels(kernel, (0, 1)), rtol=1e-6)
    else:
        assert (
            np.abs(got - kernel)[1:].max()
            < np.abs(int8_channels(kernel, (0, 1)) - kernel)[1:].max()
        )


def test_a_table_rounds_per_row_in_blocks():
    table = np.random.default_rng(2).standard_normal((6, 8)).astype(np.float32)
    want = np.concatenate(
        [np.stack([_rounded(r) for r in table[:, s : s + 4]]) for s in (0, 4)], axis=1
    )
    np.testing.assert_allclose(int8_channels(table, (1,), 4), want, rtol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_each_kernel_is_summed_over_the_axes_it_is_rounded_along(family):
    # Gemma's query/key/value kernels are [heads, hidden, head_dim]: their
    # input is axis 1, not 0; each product computed from the axes found
    # must be the layer's own output.
    pytest.importorskip("keras_hub")
    from export.real_error_sources import linear_kinds
    from tests.export import lm_models

    model = lm_models.causal_lm(family, "quick", num_layers=1, seed=0)
    kinds = linear_kinds(model)
    assert sorted(kinds) == ["down", "gate_up", "o", "qkv"]
    rng = np.random.default_rng(3)
    for layer, axes, x_axes in [e for entries in kinds.values() for e in entries]:
        kernel = np.asarray(layer.kernel)
        rest = [a for a in range(kernel.ndim) if a not in axes]
        inputs = [kernel.shape[a] for a in axes]
        x = rng.standard_normal((1, 3, *inputs)).astype(np.float32)
        want = np.tensordot(x, kernel, axes=(list(range(2, 2 + x_axes)), list(axes)))
        got = np.asarray(layer(x))
        if hasattr(layer, "bias") and layer.bias is not None:
            got = got - np.asarray(layer.bias)
        assert got.shape == (1, 3, *[kernel.shape[a] for a in rest])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rotation_mixes_each_kernels_inputs_only():
    # Gemma's query kernel [heads, hidden, head_dim] is rotated along its
    # hidden axis: Q round(Q^T W) with W its [hidden, heads * head_dim]
    # matrix, rounded per output channel.
    pytest.importorskip("keras_hub")
    from export.real_error_sources import linear_kinds
    from export.real_error_sources import orthogonal
    from export.real_error_sources import rotated
    from tests.export import lm_models

    model = lm_models.causal_lm("gemma3", "quick", num_layers=1, seed=0)
    every = [e for entries in linear_kinds(model).values() for e in entries]
    before = [np.asarray(layer.kernel) for layer, _, _ in every]
    with rotated(every, {}, inputs=False):
        after = [np.asarray(layer.kernel) for layer, _, _ in every]
    for i, ((layer, axes, _), k, got) in enumerate(
        zip(every, before, after, strict=True)
    ):
        moved = np.moveaxis(k, axes, range(len(axes)))
        n = int(np.prod(moved.shape[: len(axes)]))
        q = orthogonal(n, 7 * i).astype(np.float64)
        w = q.T @ moved.reshape(n, -1)
        want = q @ int8_channels(w, (0,))
        got = np.moveaxis(got, axes, range(len(axes))).reshape(n, -1)
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(np.asarray(layer.kernel), k)  # put back
