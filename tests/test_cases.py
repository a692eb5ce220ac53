"""tests/support/cases.py: one case for every public class, and each case runs."""

import keras
import numpy as np
import pytest

import kerasnorm.layers
from tests.support.cases import CASES
from tests.support.cases import PUBLIC_CLASSES


def test_every_public_class_has_exactly_one_case():
    # A stale case (a class renamed or no longer public) fails too.
    assert sorted(CASES) == PUBLIC_CLASSES
    assert len(PUBLIC_CLASSES) >= 14


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_builds_the_class_and_runs(name):
    case = CASES[name]
    cls = getattr(kerasnorm.layers, name)
    layer = case.make(cls, keras)
    # A cell comes inside a plain `keras.layers.RNN`.
    held = layer if isinstance(layer, cls) else layer.cell
    assert type(held) is cls
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(2, *s)).astype("float32") for s in case.shapes]
    outputs = keras.tree.flatten(layer(*inputs))
    assert outputs
    for y in outputs:
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(y)))
