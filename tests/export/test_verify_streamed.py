"""The verifier compares outputs chunk by chunk as the model computes them,
never holding every sample's reference at once (a 512-token model's logits
over 32 samples are 2 GB): the figures are those of the all-at-once
comparison, the model is called on chunks of at most `COMPARE_BYTES`."""

import keras
import numpy as np
import pytest

from kerasnorm.export.inputs.data import InputSpec
from kerasnorm.export.numerics.metrics import StreamedErrors
from kerasnorm.export.numerics.metrics import flat_outputs
from kerasnorm.export.numerics.metrics import max_rel_over
from kerasnorm.export.numerics.metrics import output_errors
from kerasnorm.export.verify import verifier
from kerasnorm.export.verify.run import Run


def _pair(rng, shape, special=False):
    expected = rng.normal(size=shape).astype("float32")
    got = expected + 1e-3 * rng.normal(size=shape).astype("float32")
    if special:
        expected.flat[3] = got.flat[3] = np.nan  # the same NaN: no error
        expected.flat[5] = got.flat[5] = np.inf  # the same inf: no error
        expected.flat[7] = np.inf  # left out of the scales
    return got, expected


@pytest.mark.parametrize("special", [False, True])
def test_streamed_errors_equal_the_all_at_once_figures(special):
    rng = np.random.default_rng(0)
    shapes = [(12, 5, 7), (12, 3)]
    pairs = [_pair(rng, s, special) for s in shapes]
    got = [p[0] for p in pairs]
    expected = [p[1] for p in pairs]
    second = [_pair(rng, (4, *s[1:])) for s in shapes]
    streamed, other = StreamedErrors(), StreamedErrors()
    for start, stop in [(0, 1), (1, 6), (6, 12)]:
        streamed.add([g[start:stop] for g in got], [e[start:stop] for e in expected])
    np.testing.assert_allclose(
        streamed.errors(), output_errors(got, expected), rtol=1e-12
    )
    other.add([p[0] for p in second], [p[1] for p in second])
    pooled = max_rel_over(
        [(got, expected), ([p[0] for p in second], [p[1] for p in second])]
    )
    assert streamed.merge(other).max_rel() == pytest.approx(pooled, rel=1e-12)


def test_a_nan_the_reference_lacks_is_an_infinite_error():
    streamed = StreamedErrors()
    streamed.add([np.array([1.0, np.nan])], [np.array([1.0, 2.0])])
    assert streamed.errors() == (np.inf, np.inf, np.inf)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(50)(keras.layers.Dense(8, activation="relu")(inputs))
    return keras.Model(inputs, outputs)


def _run(model, samples, error, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 6)).astype("float32")
    got = np.asarray(model(x)) + error * rng.normal(size=(samples, 50)).astype(
        "float32"
    )
    second = rng.normal(size=(3, 6)).astype("float32")
    more = [([second], [np.asarray(model(second)) * (1 + error)])]
    return Run("tflite", [got], [x], {}, 0.0, 0, more=more)


def _compare(model, run, monkeypatch, chunk_bytes, criterion="max", tolerance=1e-3):
    batches = []

    def counted(m, inputs):
        batches.append(len(inputs))
        return flat_outputs(m, inputs)

    monkeypatch.setattr(verifier, "flat_outputs", counted)
    monkeypatch.setattr(verifier, "COMPARE_BYTES", chunk_bytes)
    result = verifier.compare(
        model,
        InputSpec.of(model),
        run,
        tolerance=tolerance,
        criterion=criterion,
        label="x",
        checked_on="random",
        raise_on_failure=False,
    )
    return result, batches


@pytest.mark.parametrize(
    ("error", "criterion", "tolerance"),
    [(1e-4, "max", 1e-3), (1e-2, "rms", 1e-3), (1e-2, "max", 1e-6)],
)
def test_chunked_comparison_gives_the_whole_comparisons_verdict(
    model, monkeypatch, error, criterion, tolerance
):
    run = _run(model, 40, error)
    whole, whole_batches = _compare(
        model, run, monkeypatch, 2**30, criterion, tolerance
    )
    # 50 float32 outputs per sample: 7 samples per chunk of 1400 bytes.
    chunked, batches = _compare(model, run, monkeypatch, 1400, criterion, tolerance)
    assert whole_batches == [40, 3]
    assert batches == [7] * 5 + [5, 3]
    assert chunked.passed == whole.passed
    assert chunked.passed == (criterion == "max" and tolerance == 1e-3)
    # The model's reference outputs come from batches of 7 here and 40
    # there: float32 kernels chosen per batch size (and per CPU: oneDNN,
    # AVX-512 or not) round them differently in the last bits, so the
    # errors agree to float32 rounding of the outputs, not exactly.
    for field in ("max_abs_error", "max_rel_error", "rms_rel_error"):
        assert getattr(chunked, field) == pytest.approx(
            getattr(whole, field), rel=1e-3, abs=1e-7
        )
    if tolerance == 1e-6:  # failed the max tolerance: the float64 re-check ran
        assert whole.float64_error is not None
        assert chunked.float64_error == pytest.approx(
            whole.float64_error, rel=1e-3, abs=1e-7
        )
        # Rounding noise itself: its size, not its bits.
        assert chunked.float32_rounding == pytest.approx(
            whole.float32_rounding, rel=0.5, abs=1e-9
        )


def test_one_sample_per_chunk_when_one_sample_passes_the_budget(model, monkeypatch):
    run = _run(model, 4, 1e-4)
    _, batches = _compare(model, run, monkeypatch, 10)
    assert batches == [1, 1, 1, 1, 1, 1, 1]
