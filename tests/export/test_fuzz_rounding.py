"""The fuzzer's judge of a float file (`export/fuzz_export.py`, `judge`):
a file whose model's float32 output is rounding noise passes within Keras'
own rounding, as `to_tflite`'s check passes it; a file that computes
something else still counts as wrong.

Seed 1022 of the fuzzer (one channel of frames, Keras' LayerNormalization,
InstanceNorms over time, max pooling) was counted wrong in a 94-graph run:
its raw LiteRT run differed from `model.predict` by 3e-2 of the output
scale. The model computes a constant: a norm over one channel outputs its
offset whatever the input, and every later layer sees that constant, so
its float32 outputs are rounding amplified by the InstanceNorms (each
divides a difference of equal values by the square root of its epsilon).
Seed 1089 (off by 2.3e-4 against a limit of 1.5e-4) is a milder case of
the same: an InstanceNorm over time averaged over time is its offset.
"""

import types

import numpy as np
import pytest

from export import fuzz_export
from kerasnorm.export import to_tflite
from kerasnorm.export.numerics.precision import float64_outputs

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def seed_1022(tmp_path_factory):
    model, x, _ = fuzz_export.sequence_graph(1022)
    path = tmp_path_factory.mktemp("fuzz") / "g1022.tflite"
    result = to_tflite(model, path, verify_inputs=x, overwrite=True)
    want = model.predict(x, verbose=0).astype("float64")
    return model, x, want, fuzz_export.raw_run(path, x), result.verification


def test_one_channel_norm_graph_computes_a_constant(seed_1022):
    model, x, *_ = seed_1022
    (exact,) = float64_outputs(model, x)
    # Input-independent in exact arithmetic: float64 leaves ~1e-16 of it.
    spread = np.ptp(exact, axis=0).max() / np.abs(exact).max()
    assert spread < 1e-9
    # While Keras' own eager float32 run varies from sample to sample by
    # far more than the float tolerance (1e-4): the function is rounding
    # noise there, not a file's fault.
    called = np.asarray(model(x, training=False), "float64")
    assert np.ptp(called, axis=0).max() / np.abs(exact).max() > 1e-3


def test_file_of_ill_conditioned_graph_is_ok_within_keras_rounding(seed_1022):
    model, x, want, got, verification = seed_1022
    reference = fuzz_export.Float64Reference(model, x, want)
    outcome = fuzz_export.judge(None, got, want, reference)
    assert outcome["status"] == "ok", outcome
    figures = outcome["rounding"]
    assert figures["float64_error"] <= figures["bound"]
    # The same file by to_tflite's own float64 re-check: the two runs
    # (one sample a call here, the batch there) agree on its error.
    assert verification.passed and verification.float64_error is not None
    assert figures["float64_error"] == pytest.approx(
        verification.float64_error, rel=0.5
    )


def test_file_that_computes_something_else_is_still_wrong(seed_1022):
    model, x, want, got, _ = seed_1022
    reference = fuzz_export.Float64Reference(model, x, want)
    scale = np.abs(reference.exact).max()
    # Beyond ROUNDING_FACTOR times this model's own rounding (~1e-2).
    shifted = got + 0.2 * scale
    assert fuzz_export.judge(None, shifted, want, reference)["status"] == "wrong"
    # A well-conditioned model's rounding leaves no room: 1e-3 is wrong.
    exact = reference.exact
    sharp = types.SimpleNamespace(exact=exact, rounding=1e-7)
    outcome = fuzz_export.judge(None, exact + 1e-3 * scale, exact, sharp)
    assert outcome["status"] == "wrong", outcome
    # And within SLACK times the tolerance needs no second look.
    outcome = fuzz_export.judge(None, exact + 1e-5 * scale, exact, sharp)
    assert outcome == {"status": "ok", "error": outcome["error"], "criterion": "max"}


def test_instance_norm_averaged_over_time_is_ok_within_keras_rounding(tmp_path):
    model, x, _ = fuzz_export.sequence_graph(1089)
    path = tmp_path / "g1089.tflite"
    to_tflite(model, path, verify_inputs=x, overwrite=True)
    want = model.predict(x, verbose=0).astype("float64")
    reference = fuzz_export.Float64Reference(model, x, want)
    exact = reference.exact
    assert np.ptp(exact, axis=0).max() / np.abs(exact).max() < 1e-9
    outcome = fuzz_export.judge(None, fuzz_export.raw_run(path, x), want, reference)
    assert outcome["status"] == "ok", outcome
