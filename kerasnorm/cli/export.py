"""`kerasnorm export`: a `.keras` model to verified SavedModel / TFLite files.

    kerasnorm export MODEL.keras --out DIR [--saved-model] [--tflite]
        [--quantize float16|dynamic|int8|int16x8 ...]
        [--calibration FILE.npy|.npz] [--verify-data FILE.npy|.npz]
        [--int8-io] [--no-fold] [--force] [--version N] [--streaming]
        [--export-dtype float32|float16] [--max-unroll-steps N] [--verbose]

Writes `DIR/<name>/<version>/` (a TF Serving model base path) and
`DIR/<name>.tflite` plus `DIR/<name>.<mode>.tflite` per `--quantize`; with
neither `--saved-model` nor `--tflite`, both. Every artifact is checked
against the Keras model; the command prints the fold report and a table.
Exit status: 0 all artifacts written and verified, 1 an artifact failed its
parity check (or the folded model differed from the original), 2 bad
arguments or an existing artifact without --force (checked before any work),
3 the converter failed (a layer TFLite cannot express, say, or with
--streaming a layer that mixes time steps). A model saved under a
mixed_float16 / mixed_bfloat16 policy is exported from a float32 copy with the
same weights (the command says so, with its error against the original).
"""

from __future__ import annotations

import os
import sys

from kerasnorm.cli._jobs import EXIT_CONVERSION as EXIT_CONVERSION
from kerasnorm.cli._jobs import EXIT_OK as EXIT_OK
from kerasnorm.cli._jobs import EXIT_PARITY as EXIT_PARITY
from kerasnorm.cli._jobs import EXIT_USAGE as EXIT_USAGE
from kerasnorm.cli._jobs import Job
from kerasnorm.cli._jobs import export_all
from kerasnorm.cli._jobs import load_inputs
from kerasnorm.cli._jobs import print_table


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "export",
        help="fold BatchNorm, export SavedModel/TFLite, verify against Keras",
        description=__doc__.split("\n\n")[-1],
    )
    parser.add_argument("model", help="a .keras file (loaded with safe_mode=True)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--saved-model", action="store_true", help="write a SavedModel")
    parser.add_argument("--tflite", action="store_true", help="write a float .tflite")
    parser.add_argument(
        "--quantize",
        action="append",
        default=[],
        choices=["float16", "dynamic", "int8", "int16x8"],
        help="also write a quantized .tflite (repeatable)",
    )
    parser.add_argument(
        "--calibration",
        help="inputs for int8 calibration and, without --verify-data, for "
        "verification: .npy (one input) or .npz (one array per input, by input "
        "name or in order)",
    )
    parser.add_argument(
        "--verify-data",
        help="held-out inputs for the parity checks, all of them run (same "
        "formats as --calibration; default: up to 256 calibration samples)",
    )
    parser.add_argument(
        "--int8-io", action="store_true", help="int8 input/output tensors for int8"
    )
    parser.add_argument(
        "--no-fold", action="store_true", help="keep BatchNorm layers as they are"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace existing artifacts"
    )
    parser.add_argument(
        "--version", type=int, default=1, help="SavedModel version (default: 1)"
    )
    parser.add_argument(
        "--streaming",
        action="store_true",
        help="export one time step per call of a sequence model, the recurrent "
        "states as named inputs and outputs (x, state_<layer>_<i>)",
    )
    parser.add_argument(
        "--export-dtype",
        choices=["float32", "float16"],
        default="float32",
        help="for a mixed-precision model: float16 keeps float16 compute in "
        "the SavedModel and stores float16 weights in the .tflite (default: "
        "float32, a float32 copy of the model)",
    )
    parser.add_argument(
        "--max-unroll-steps",
        type=int,
        default=None,
        help="int8/int16x8 unroll rolled recurrent layers up to this sequence "
        "length (default: kerasnorm.export.MAX_UNROLL_STEPS, 64)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's and the TFLite converter's own logs",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    """Export and verify every requested artifact; the exit status."""
    try:
        jobs = _plan(args)
        model, calibration, check_inputs = _load(args)
    except (ValueError, FileExistsError, OSError) as err:
        print(f"kerasnorm export: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    status, rows = export_all(jobs, model, calibration, check_inputs)
    print_table(rows)
    return status


def _plan(args):
    """The artifacts to write; refuses existing ones before any work."""
    if not os.path.isfile(args.model):
        raise ValueError(f"model file not found: {args.model!r}")
    if not args.model.endswith(".keras"):
        raise ValueError(f"expected a .keras file. Received: {args.model!r}")
    for mode in ("int8", "int16x8"):
        if mode in args.quantize and not args.calibration:
            raise ValueError(f"--quantize {mode} needs --calibration FILE.npy|.npz")
    name = os.path.splitext(os.path.basename(args.model))[0]
    jobs = []
    if args.saved_model or not (args.tflite or args.quantize):
        jobs.append(_saved_model_job(args, name))
    if args.tflite or not (args.saved_model or args.quantize):
        jobs.append(_tflite_job(args, name, None))
    jobs.extend(_tflite_job(args, name, m) for m in dict.fromkeys(args.quantize))
    existing = [job.target for job in jobs if os.path.lexists(job.target)]
    if existing and not args.force:
        raise FileExistsError(
            f"{', '.join(existing)} already exist(s); pass --force to replace."
        )
    return jobs


def _saved_model_job(args, name):
    base = os.path.join(args.out, name)

    def export(model, _, check_inputs):
        from kerasnorm.export import to_saved_model

        return to_saved_model(
            model,
            base,
            fold=not args.no_fold,
            version=args.version,
            overwrite=args.force,
            verify_inputs=check_inputs,
            streaming=args.streaming,
            export_dtype=args.export_dtype,
        )

    label = os.path.join(name, str(args.version))
    return Job(label, os.path.join(base, str(args.version)), export)


def _tflite_job(args, name, mode):
    filename = f"{name}.tflite" if mode is None else f"{name}.{mode}.tflite"
    path = os.path.join(args.out, filename)

    def export(model, calibration, check_inputs):
        from kerasnorm.export import to_tflite

        unroll = {}
        if args.max_unroll_steps is not None and not args.streaming:
            unroll["max_unroll_steps"] = args.max_unroll_steps
        return to_tflite(
            model,
            path,
            fold=not args.no_fold,
            quantize=mode,
            representative_data=calibration,
            int8_io=args.int8_io and mode == "int8",
            overwrite=args.force,
            verify_inputs=check_inputs,
            progress=mode in ("int8", "int16x8"),
            verbose=args.verbose,
            streaming=args.streaming,
            **_tflite_dtype(args, mode),
            **unroll,
        )

    return Job(filename, path, export)


def _tflite_dtype(args, mode):
    # --export-dtype float16 makes the float file's weights float16; the
    # quantized files keep their own modes.
    return {"export_dtype": args.export_dtype if mode is None else "float32"}


def _load(args):
    import keras

    model = _load_model(keras, args.model)
    calibration = load_inputs(args.calibration, model, "--calibration")
    check_inputs = load_inputs(args.verify_data, model, "--verify-data")
    if check_inputs is None and calibration is not None:
        from kerasnorm.export import VERIFY_SAMPLES

        check_inputs = [x[:VERIFY_SAMPLES] for x in calibration]
    return model, calibration, check_inputs


def _load_model(keras, path):
    """The model in a `.keras` file; ValueError saying what is wrong with it.

    Keras reports a file that is not a zip archive as "File not found", and a
    damaged member with whatever its reader raised: both are told apart here
    before any artifact is written.
    """
    import zipfile

    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path!r} is not a valid .keras archive (not a zip file: "
            "truncated or not written by model.save?)"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise ValueError(f"{path!r} is not a valid .keras archive: {err}") from err
    if damaged is not None:
        raise ValueError(
            f"{path!r} is a damaged .keras archive: its member {damaged!r} "
            "fails its checksum."
        )
    missing = [n for n in ("config.json", "model.weights.h5") if n not in names]
    if missing:
        raise ValueError(
            f"{path!r} is not a valid .keras archive: it has no {' or '.join(missing)}."
        )
    import json

    with zipfile.ZipFile(path) as archive:
        try:
            json.loads(archive.read("config.json"))
        except ValueError as err:
            raise ValueError(
                f"{path!r} is not a valid .keras archive: its config.json is "
                f"not valid JSON ({err})."
            ) from err
    try:
        return keras.saving.load_model(path, safe_mode=True)
    except Exception as err:
        raise ValueError(
            f"{path!r} could not be loaded ({type(err).__name__}: {err})"
        ) from err
