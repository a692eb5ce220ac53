"""The views keras-hub's cached call reads the file's caches through
(`litert_lm.hub_views`), against numpy on keras-hub's own layout: a decode
step's row kept beside its cache (`HeadsFirst.row`) gives the attention's
two products of the cache with the row written, with its heads repeated
or not, and the step's cache output is that written cache."""

import numpy as np
import pytest
from keras import ops

from kerasnorm.export.litert_lm import hub_views

pytestmark = pytest.mark.tf_only

B, G, L, D = 1, 2, 7, 4


def _written(position, repeats, seed=0):
    """A cache `[B, G, L, D]` (the file's), a row `[B, G, 1, D]`, the view
    with the row kept apart, and the written cache in keras-hub's layout
    `[B, L, G * repeats, D]`."""
    rng = np.random.default_rng(seed)
    cache = rng.standard_normal((B, G, L, D)).astype("float32")
    row = rng.standard_normal((B, G, 1, D)).astype("float32")
    view = hub_views.HeadsFirst(
        ops.convert_to_tensor(cache), repeats, ops.convert_to_tensor(row), position
    )
    written = cache.copy()
    written[:, :, position] = row[:, :, 0]
    hub = np.repeat(np.transpose(written, (0, 2, 1, 3)), repeats, axis=2)
    return view, hub, written


@pytest.mark.parametrize("repeats", [1, 3])
@pytest.mark.parametrize("position", [0, 4, L - 1])
def test_the_products_read_the_cache_with_its_row_written(position, repeats):
    view, hub, _ = _written(position, repeats)
    rng = np.random.default_rng(1)
    query = rng.standard_normal((B, 1, G * repeats, D)).astype("float32")
    # Llama's scores (the length an output axis) and weighted values (the
    # length summed), in keras-hub's letters.
    scores = hub_views.einsum(ops.einsum, "bquh,bkuh->buqk", query, view)
    np.testing.assert_allclose(
        np.asarray(scores), np.einsum("bquh,bkuh->buqk", query, hub), rtol=1e-6
    )
    weights = rng.random((B, G * repeats, 1, L)).astype("float32")
    out = hub_views.einsum(ops.einsum, "buqk,bkuh->bquh", weights, view)
    np.testing.assert_allclose(
        np.asarray(out), np.einsum("buqk,bkuh->bquh", weights, hub), rtol=1e-5
    )


@pytest.mark.parametrize("position", [0, 3])
def test_the_step_output_and_any_other_use_are_the_written_cache(position):
    view, hub, written = _written(position, 1)
    np.testing.assert_array_equal(np.asarray(hub_views.to_file(view)), written)
    # Any other read (GPT-NeoX slices the whole cache) gets keras-hub's
    # layout with the row written, in arithmetic.
    np.testing.assert_array_equal(np.asarray(view[:, :, :1]), hub[:, :, :1])


def test_a_decode_write_keeps_the_row_and_a_prefill_writes_its_rows():
    cache = np.zeros((B, G, L, D), "float32")
    view = hub_views.HeadsFirst(ops.convert_to_tensor(cache))
    one = np.ones((B, 1, G, D), "float32")
    kept = hub_views.cache_write(None, view, (0, 2, 0, 0), one)
    assert kept.row is not None and kept.start == 2
    np.testing.assert_array_equal(np.asarray(kept.tensor), cache)
    want = cache.copy()
    want[:, :, 2:4] = 1.0

    def slice_update(inputs, start, updates):
        return ops.slice_update(inputs, start, updates)

    rows = hub_views.cache_write(
        slice_update, view, (0, 2, 0, 0), np.ones((B, 2, G, D))
    )
    assert rows.row is None
    np.testing.assert_array_equal(np.asarray(rows.tensor), want)
