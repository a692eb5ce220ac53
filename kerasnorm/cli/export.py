"""`kerasnorm export`: a `.keras` model to verified SavedModel / TFLite files.

    kerasnorm export MODEL.keras --out DIR [--saved-model] [--tflite]
        [--quantize float16|dynamic|int8 ...] [--calibration FILE.npy|.npz]
        [--no-fold] [--force] [--version N]

Writes `DIR/<name>/<version>/` (a TF Serving model base path) and
`DIR/<name>.tflite` plus `DIR/<name>.<mode>.tflite` per `--quantize`; with
neither `--saved-model` nor `--tflite`, both. Every artifact is checked
against the Keras model; the command prints the fold report and a table, and
exits 1 when an artifact fails its parity check, 2 on bad arguments.
"""

from __future__ import annotations

import os
import sys


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
        choices=["float16", "dynamic", "int8"],
        help="also write a quantized .tflite (repeatable)",
    )
    parser.add_argument(
        "--calibration",
        help="inputs for int8 calibration and for verification: .npy (one "
        "input) or .npz (one array per input, by input name or in order)",
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
    parser.set_defaults(func=run)


def run(args) -> int:
    import keras

    from kerasnorm import export

    want_saved = args.saved_model or not (args.tflite or args.quantize)
    want_tflite = args.tflite or not (args.saved_model or args.quantize)
    try:
        if not os.path.isfile(args.model):
            raise ValueError(f"model file not found: {args.model!r}")
        if not args.model.endswith(".keras"):
            raise ValueError(f"expected a .keras file. Received: {args.model!r}")
        if "int8" in args.quantize and not args.calibration:
            raise ValueError("--quantize int8 needs --calibration FILE.npy|.npz")
        model = keras.saving.load_model(args.model, safe_mode=True)
        calibration = _load_calibration(args.calibration, model)
    except (ValueError, OSError) as err:
        print(f"kerasnorm export: error: {err}", file=sys.stderr)
        return 2

    name = os.path.splitext(os.path.basename(args.model))[0]
    check_inputs = None
    if calibration is not None:
        check_inputs = [x[:32] for x in calibration]
    jobs = []
    if want_saved:
        jobs.append(
            (
                "saved_model",
                lambda: export.to_saved_model(
                    model,
                    os.path.join(args.out, name),
                    fold=not args.no_fold,
                    version=args.version,
                    overwrite=args.force,
                    verify_inputs=check_inputs,
                ),
            )
        )
    modes = ([None] if want_tflite else []) + list(dict.fromkeys(args.quantize))
    for mode in modes:
        filename = f"{name}.tflite" if mode is None else f"{name}.{mode}.tflite"
        jobs.append(
            (
                filename,
                lambda mode=mode, filename=filename: export.to_tflite(
                    model,
                    os.path.join(args.out, filename),
                    fold=not args.no_fold,
                    quantize=mode,
                    representative_data=calibration,
                    int8_io=args.int8_io and mode == "int8",
                    overwrite=args.force,
                    verify_inputs=check_inputs,
                    progress=mode == "int8",
                ),
            )
        )

    rows = []
    status = 0
    report_shown = False
    for label, job in jobs:
        if label.endswith("int8.tflite"):
            print(f"Calibrating int8 on {min(len(calibration[0]), 200)} samples:")
        try:
            result = job()
        except export.ExportVerificationError as err:
            print(f"kerasnorm export: {label}: {err}", file=sys.stderr)
            rows.append((label, "-", "-", "-", "-", "FAILED parity"))
            status = 1
            continue
        except (ValueError, OSError) as err:
            print(f"kerasnorm export: {label}: {err}", file=sys.stderr)
            rows.append((label, "-", "-", "-", "-", "error"))
            status = status or 2
            continue
        if result.fold_report is not None and not report_shown:
            print(result.fold_report)
            report_shown = True
        check = result.verification
        rows.append(
            (
                os.path.relpath(result.path, args.out),
                f"{result.size_bytes / 1024:.1f} KiB",
                str(sum(check.ops.values())),
                f"{check.max_abs_error:.2e} ({check.max_rel_error:.1e} rel)",
                f"{check.latency_ms:.3f} ms",
                "ok",
            )
        )
    _print_table(rows)
    return status


def _load_calibration(path, model):
    if path is None:
        return None
    import numpy as np

    from kerasnorm.export import _artifacts

    if path.endswith(".npy"):
        data = np.load(path, allow_pickle=False)
    elif path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as archive:
            names = [x.name for x in model.inputs]
            if set(names) <= set(archive.files):
                data = {n: archive[n] for n in names}
            else:
                data = [archive[k] for k in archive.files]
    else:
        raise ValueError(
            f"--calibration should be a .npy or .npz file. Received: {path!r}"
        )
    return _artifacts.as_input_list(model, data, f"--calibration {path}")


def _print_table(rows):
    header = ("artifact", "size", "ops", "max abs error", "latency/call", "status")
    rows = [header, *rows]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
