"""Identities between layers and the LN paper's Table 1 invariances."""

import keras
import numpy as np
import pytest

import kerasnorm
from tests.support.helpers import random_inputs


def _assign(layer, shape, gamma, beta):
    layer.build(shape)
    layer.gamma.assign(gamma)
    layer.beta.assign(beta)
    return layer


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (3, 7, 4)])
def test_group_norm_one_group_is_layer_norm_over_spatial_and_channels(shape):
    x = random_inputs(shape, offset=1.0)
    rng = np.random.default_rng(1)
    gamma = rng.standard_normal(shape[-1]).astype("float32")
    beta = rng.standard_normal(shape[-1]).astype("float32")
    gn = _assign(kerasnorm.GroupNorm(groups=1), shape, gamma, beta)
    axes = list(range(1, len(shape)))
    # LayerNorm carries a parameter per element: give it the per-channel ones.
    tiled = (*shape[1:-1], 1)
    ln = _assign(
        kerasnorm.LayerNorm(axis=axes),
        shape,
        np.tile(gamma, tiled),
        np.tile(beta, tiled),
    )
    np.testing.assert_allclose(np.asarray(gn(x)), np.asarray(ln(x)), atol=1e-5)


@pytest.mark.parametrize("shape, axis", [((2, 4, 5, 6), -1), ((2, 6, 4, 5), 1)])
def test_group_norm_one_channel_per_group_is_instance_norm(shape, axis):
    x = random_inputs(shape, offset=-2.0)
    channels = shape[axis]
    rng = np.random.default_rng(2)
    gamma = rng.standard_normal(channels).astype("float32")
    beta = rng.standard_normal(channels).astype("float32")
    gn = _assign(kerasnorm.GroupNorm(groups=channels, axis=axis), shape, gamma, beta)
    inorm = _assign(kerasnorm.InstanceNorm(axis=axis), shape, gamma, beta)
    np.testing.assert_allclose(np.asarray(gn(x)), np.asarray(inorm(x)), atol=1e-5)


def test_partial_that_covers_every_unit_is_rms_norm():
    x = random_inputs((4, 8))
    full = kerasnorm.RMSNorm(partial=1.0)(x)
    almost = kerasnorm.RMSNorm(partial=0.99)(x)  # ceil(7.92) = 8 units
    np.testing.assert_allclose(np.asarray(full), np.asarray(almost), atol=0)


def test_rms_norm_is_layer_norm_of_zero_mean_inputs():
    x = random_inputs((5, 16))
    x = x - x.mean(axis=-1, keepdims=True)
    rms = kerasnorm.RMSNorm(epsilon=1e-5)(x)
    ln = kerasnorm.LayerNorm(epsilon=1e-5, center=False)(x)
    np.testing.assert_allclose(np.asarray(rms), np.asarray(ln), atol=1e-5)


class TestLayerNormInvariances:
    """LN paper Table 1, LayerNorm column, for h = LN(x @ W) with kernel W
    (Keras layout: inputs x units). The 'no' rows are asserted too, so the
    test would notice a normalizer over the wrong axes."""

    def setup_method(self):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((6, 10)).astype("float32")
        self.w = rng.standard_normal((10, 8)).astype("float32")
        self.norm = kerasnorm.LayerNorm(epsilon=1e-9)
        self.base = self.h(self.x, self.w)

    def h(self, x, w):
        return np.asarray(self.norm(keras.ops.matmul(x, w)))

    def assert_invariant(self, x, w):
        np.testing.assert_allclose(self.h(x, w), self.base, atol=1e-4)

    def assert_changes(self, x, w):
        assert np.abs(self.h(x, w) - self.base).max() > 1e-2

    def test_weight_matrix_rescaling_is_invariant(self):
        self.assert_invariant(self.x, 3.5 * self.w)

    def test_weight_matrix_recentering_is_invariant(self):
        gamma = np.random.default_rng(1).standard_normal((10, 1)).astype("float32")
        self.assert_invariant(self.x, self.w + gamma)  # same shift for all units

    def test_single_weight_vector_rescaling_is_not_invariant(self):
        w = self.w.copy()
        w[:, 2] *= 4.0
        self.assert_changes(self.x, w)

    def test_dataset_rescaling_is_invariant(self):
        self.assert_invariant(2.5 * self.x, self.w)

    def test_dataset_recentering_is_not_invariant(self):
        self.assert_changes(self.x + 1.5, self.w)

    def test_single_training_case_rescaling_is_invariant(self):
        x = self.x.copy()
        x[3] *= 7.0
        self.assert_invariant(x, self.w)
