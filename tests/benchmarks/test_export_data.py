"""export/data.py: the export benchmarks' data, against their definitions."""

import numpy as np
import pytest

from export import data


def test_digits_split_is_a_seeded_permutation_of_the_dataset():
    sklearn = pytest.importorskip("sklearn.datasets")
    full = sklearn.load_digits()
    x_train, y_train, x_test, y_test = data.digits(seed=0)
    assert x_train.shape == (1437, 8, 8, 1) and x_test.shape == (360, 8, 8, 1)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int32
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    # Every image exactly once, with its own label.
    x = np.concatenate([x_train, x_test])[..., 0]
    y = np.concatenate([y_train, y_test])
    order = np.random.default_rng(0).permutation(len(full.images))
    np.testing.assert_array_equal(x * 16.0, full.images[order])
    np.testing.assert_array_equal(y, full.target[order])
    other = data.digits(seed=1)
    assert not np.array_equal(other[0], x_train)


def test_digits_rows_are_the_images_as_sequences():
    pytest.importorskip("sklearn")
    rows, images = data.digits_rows(), data.digits()
    assert rows[0].shape == (1437, 8, 8)
    for sequences, digits in zip(rows, images, strict=True):
        np.testing.assert_array_equal(
            sequences, digits[..., 0] if digits.ndim == 4 else digits
        )


def test_running_sum_labels_are_the_sign_of_the_first_feature_sum():
    x_train, y_train, x_test, y_test = data.running_sum(30, 10, 5, seed=3)
    assert x_train.shape == (30, 5, 2) and x_test.shape == (10, 5, 2)
    for x, y in ((x_train, y_train), (x_test, y_test)):
        np.testing.assert_array_equal(y, [int(s[:, 0].sum() > 0) for s in x])
    assert 0 < y_train.sum() < 30  # both classes occur


def test_cumulative_sum_targets():
    x, y = data.cumulative_sum(4, 9, seed=0)
    assert x.shape == (4, 9, 4) and y.shape == (4, 9, 2)
    for t in range(9):
        np.testing.assert_allclose(y[:, t], x[:, : t + 1, :2].sum(1) / 3.0, rtol=1e-5)


def test_upsample_interpolates_linearly_in_time():
    x = np.arange(2 * 3 * 2, dtype="float64").reshape(2, 3, 2)
    out = data.upsample(x, 5)
    assert out.shape == (2, 5, 2)
    # 3 points at t = 0, 0.5, 1 resampled at t = 0, 0.25, ..., 1.
    np.testing.assert_allclose(out[:, ::2], x)
    np.testing.assert_allclose(out[:, 1], (x[:, 0] + x[:, 1]) / 2)
    np.testing.assert_allclose(data.upsample(x, 3), x)
