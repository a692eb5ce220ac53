"""`options/export_options.py` and `options/modes.py`: an export's arguments checked
and resolved once (`ExportOptions`), the one table of quantize modes it
reads, and the command line's standard-library copy of that table."""

from __future__ import annotations

import dataclasses
import os

import pytest

from kerasnorm.export import DEFAULT_TOLERANCE
from kerasnorm.export import QUANTIZE_MODES
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.model.facts import ModelFacts
from kerasnorm.export.options.export_options import ExportOptions
from kerasnorm.export.options.formats import LITERT
from kerasnorm.export.options.formats import TF_SAVED_MODEL
from kerasnorm.export.options.modes import CALIBRATION_SAMPLES
from kerasnorm.export.options.modes import CALIBRATION_STEPS
from kerasnorm.export.options.modes import MAX_UNROLL_STEPS
from kerasnorm.export.options.modes import MODES
from kerasnorm.export.prepare.stage import Prepared
from kerasnorm_cli import arguments

pytestmark = pytest.mark.tf_only

TFLITE = dict(
    quantize=None,
    export_dtype="float32",
    tolerance=None,
    representative_data=None,
    int8_io=False,
    calibration_samples=None,
    batch_size=1,
    streaming=False,
    max_unroll_steps=MAX_UNROLL_STEPS,
)
DATA = object()  # representative data: ExportOptions only checks presence


def tflite(**changes):
    return ExportOptions.build(LITERT, **{**TFLITE, **changes})


def test_the_command_lines_copy_of_the_mode_table_is_the_table():
    # kerasnorm_cli imports the standard library only, so it spells the
    # modes; this pins its copy, and its help's default, to the library's.
    assert arguments.QUANTIZE_MODES == tuple(q for q in QUANTIZE_MODES if q)
    assert arguments.CALIBRATED_MODES == tuple(
        q for q, mode in MODES.items() if mode.calibrates
    )
    help_text = (
        arguments.build_parser()
        ._subparsers._group_actions[0]
        .choices["export"]
        .format_help()
    )
    assert f"(default: {MAX_UNROLL_STEPS})" in " ".join(help_text.split())


def test_the_public_tolerances_are_the_tables():
    assert DEFAULT_TOLERANCE == {q: mode.tolerance for q, mode in MODES.items()}
    assert tuple(MODES) == QUANTIZE_MODES
    # The float modes bound the worst sample, every quantized one the rms.
    assert {q: m.criterion for q, m in MODES.items()} == {
        None: "max",
        "float16": "max",
        "dynamic": "rms",
        "int8": "rms",
        "int16x8": "rms",
    }


@pytest.mark.parametrize("quantize", QUANTIZE_MODES)
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("int8_io", [False, True])
def test_tflite_options_resolve_each_default_once(quantize, streaming, int8_io):
    mode = MODES[quantize]
    data = DATA if mode.calibrates else None
    if int8_io and quantize != "int8":
        with pytest.raises(ValueError, match=r'int8_io=True needs quantize="int8"'):
            tflite(quantize=quantize, int8_io=True, representative_data=data)
        return
    options = tflite(
        quantize=quantize,
        int8_io=int8_io,
        streaming=streaming,
        representative_data=data,
    )
    assert options.mode is mode and options.format is LITERT
    assert options.tolerance == DEFAULT_TOLERANCE[quantize]
    fast_step = streaming and quantize == "int8" and not int8_io
    want = CALIBRATION_STEPS if fast_step else CALIBRATION_SAMPLES
    assert options.calibration_samples == want
    assert options.fast_int8 == (quantize == "int8" and not int8_io)
    assert options.unrolls == (not streaming)
    # Given values win over the defaults.
    given = tflite(
        quantize=quantize,
        int8_io=int8_io,
        streaming=streaming,
        representative_data=data,
        tolerance=0.25,
        calibration_samples=7,
    )
    assert (given.tolerance, given.calibration_samples) == (0.25, 7)


@pytest.mark.parametrize(
    "changes, error, match",
    [
        (dict(quantize="int4"), ValueError, "quantize"),
        (dict(export_dtype="bfloat16"), ValueError, "export_dtype should be one of"),
        (
            dict(export_dtype="float16", quantize="int8", representative_data=DATA),
            ValueError,
            'export_dtype="float16" writes a TFLite file with float16 weights',
        ),
        (dict(batch_size=0), ValueError, "batch_size"),
        (
            dict(quantize="int8", representative_data=DATA, calibration_samples=0),
            ValueError,
            "calibration_samples",
        ),
        (dict(quantize="int16x8"), ValueError, "needs representative_data"),
        (dict(max_unroll_steps=0), ValueError, "max_unroll_steps"),
        (
            dict(streaming=True, max_unroll_steps=8),
            ValueError,
            "a streaming step runs one time step per call",
        ),
    ],
)
def test_tflite_options_refuse_bad_combinations(changes, error, match):
    with pytest.raises(error, match=match):
        tflite(**changes)


def test_float16_export_dtype_is_the_float16_mode_for_tflite():
    for quantize in (None, "float16"):
        options = tflite(export_dtype="float16", quantize=quantize)
        assert options.quantize == "float16"
        assert options.tolerance == DEFAULT_TOLERANCE["float16"]
        # TFLite computes in float32: only a SavedModel keeps float16 compute.
        assert options.rebuild_dtype == "float32"
    saved = ExportOptions.build(TF_SAVED_MODEL, export_dtype="float16", tolerance=1e-4)
    assert saved.rebuild_dtype == "float16" and saved.quantize is None
    with pytest.raises(ValueError, match="export_dtype should be one of"):
        ExportOptions.build(TF_SAVED_MODEL, export_dtype="int8", tolerance=1e-4)


def test_options_are_frozen():
    options = tflite()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.quantize = "int8"


@pytest.mark.parametrize(
    "quantize, int8_io, qat, streaming, unrolled, writer",
    [
        ("int8", False, False, False, (), "selective"),
        ("int8", False, False, True, (), "step"),
        ("int8", False, False, False, ("lstm",), "step"),
        ("int8", False, True, False, (), None),  # QAT keeps its trained ranges
        ("int8", False, True, True, (), None),
        ("int8", True, False, True, ("lstm",), None),  # integer-only file
        ("int16x8", False, False, True, ("lstm",), None),
        ("dynamic", False, False, False, (), None),
        (None, False, False, True, (), None),
    ],
)
def test_one_decision_for_which_int8_writer(
    quantize, int8_io, qat, streaming, unrolled, writer
):
    options = tflite(
        quantize=quantize,
        int8_io=int8_io,
        streaming=streaming,
        representative_data=DATA,
    )
    prepared = Prepared(
        options=options,
        reference=None,
        exported=None,
        rebuild=None,
        inputs=None,
        output_names=[],
        verify_inputs=[],
        unrolled=unrolled,
        facts=ModelFacts(layers=(), rolled=(), recurrent=bool(unrolled), qat=qat),
        step=object() if streaming else None,
    )
    assert prepared.int8_writer == writer


def test_a_refused_combination_touches_nothing(tmp_path):
    # The refusal comes before the model is even looked at: `None` is no model.
    target = tmp_path / "m.tflite"
    with pytest.raises(ValueError, match="needs representative_data"):
        to_tflite(None, target, quantize="int8")
    with pytest.raises(ValueError, match="export_dtype should be one of"):
        to_saved_model(None, tmp_path / "sm", export_dtype="float64")
    assert os.listdir(tmp_path) == []
