"""float16 inputs whose squares overflow float16 (|x| ~ 300) stay finite."""

import keras
import numpy as np
import pytest

import kerasnorm
from tests.support.helpers import random_inputs

LAYERS = [
    (kerasnorm.LayerNorm, {}, (4, 6, 16)),
    (kerasnorm.RMSNorm, {"partial": 0.5}, (4, 6, 16)),
    (kerasnorm.GroupNorm, {"groups": 4}, (2, 4, 4, 16)),
    (kerasnorm.InstanceNorm, {}, (2, 4, 4, 16)),
]


@pytest.mark.parametrize("cls, kwargs, shape", LAYERS)
def test_mixed_float16_large_inputs(cls, kwargs, shape):
    # Squares of |x| ~ 300 exceed float16's max (65504): float16 statistics
    # would overflow to inf.
    x = (random_inputs(shape) * 100.0 + 300.0).astype("float16")
    with np.errstate(over="ignore"):
        assert np.isinf(np.square(x).sum(dtype=np.float16))
    reference = cls(**kwargs)
    expected = np.asarray(reference(x.astype("float32")))
    keras.config.set_dtype_policy("mixed_float16")
    layer = cls(**kwargs)
    out = layer(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    assert all(w.dtype == "float32" for w in layer.weights)
    out = np.asarray(out, dtype="float32")
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, atol=1e-2 * np.abs(expected).max())
