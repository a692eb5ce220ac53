"""`kerasnorm export`: a `.keras` model to verified SavedModel / TFLite files.

    kerasnorm export MODEL.keras --out DIR [--saved-model] [--tflite]
        [--quantize float16|dynamic|int8|int16x8 ...]
        [--calibration FILE.npy|.npz] [--verify-data FILE.npy|.npz]
        [--int8-io] [--smooth] [--no-fold] [--force] [--version N] [--streaming]
        [--export-dtype float32|float16] [--max-unroll-steps N]
        [--batch-size N] [--import MODULE|FILE.py ...] [--no-safe-mode]
        [--verbose]

The arguments, the artifacts' paths and the exit statuses are
`kerasnorm_cli`'s (see `kerasnorm export --help`); `run` loads the model and
the inputs files, then writes and verifies each artifact.
"""

from __future__ import annotations

import os
import sys

from kerasnorm.cli._jobs import Job
from kerasnorm.cli._jobs import export_all
from kerasnorm.cli._jobs import print_table
from kerasnorm.cli._load import head
from kerasnorm.cli._load import load_inputs
from kerasnorm.cli._load import load_model
from kerasnorm_cli.checks import export_targets
from kerasnorm_cli.exits import EXIT_CONVERSION as EXIT_CONVERSION
from kerasnorm_cli.exits import EXIT_OK as EXIT_OK
from kerasnorm_cli.exits import EXIT_PARITY as EXIT_PARITY
from kerasnorm_cli.exits import EXIT_USAGE as EXIT_USAGE


def run(args) -> int:
    """Export and verify every requested artifact; the exit status."""
    try:
        model = load_model(
            args.model,
            imports=args.imports,
            safe_mode=not args.no_safe_mode,
            command="export",
        )
        calibration = load_inputs(args.calibration, model, "--calibration")
        verify_inputs = load_inputs(args.verify_data, model, "--verify-data")
    except (ValueError, OSError) as err:
        print(f"kerasnorm export: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    checked_on = "--verify-data" if verify_inputs is not None else None
    if verify_inputs is None and calibration is not None:
        from kerasnorm.export import VERIFY_SAMPLES

        verify_inputs = head(calibration, VERIFY_SAMPLES)
        checked_on = "--calibration"
    jobs = [_job(args, *target) for target in export_targets(args)]
    status, rows = export_all(
        "export", jobs, model, calibration, verify_inputs, checked_on
    )
    print_table(rows, checked_on)
    return status


def _job(args, kind, label, path):
    """The Job writing one of `export_targets`: a SavedModel, or a .tflite
    file in mode `kind` (None: float)."""

    def saved_model(model, _, verify_inputs):
        from kerasnorm.export import to_saved_model

        return to_saved_model(
            model,
            os.path.dirname(path),
            fold=not args.no_fold,
            version=args.version,
            overwrite=args.force,
            verify_inputs=verify_inputs,
            streaming=args.streaming,
            export_dtype=args.export_dtype,
            batch_size=args.batch_size,
        )

    def tflite(model, calibration, verify_inputs):
        from kerasnorm.export import to_tflite

        unroll = {}
        if args.max_unroll_steps is not None:
            unroll["max_unroll_steps"] = args.max_unroll_steps
        return to_tflite(
            model,
            path,
            fold=not args.no_fold,
            quantize=kind,
            representative_data=calibration,
            int8_io=args.int8_io and kind == "int8",
            smooth=True if args.smooth and kind in ("int8", "dynamic") else None,
            overwrite=args.force,
            verify_inputs=verify_inputs,
            progress=kind in ("int8", "int16x8"),
            verbose=args.verbose,
            streaming=args.streaming,
            batch_size=args.batch_size,
            # --export-dtype float16 makes the float file's weights float16;
            # the quantized files keep their own modes.
            export_dtype=args.export_dtype if kind is None else "float32",
            **unroll,
        )

    return Job(label, saved_model if kind == "saved_model" else tflite)
