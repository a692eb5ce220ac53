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
