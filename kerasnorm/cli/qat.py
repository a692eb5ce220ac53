"""`kerasnorm qat`: quantization-aware fine-tuning of a `.keras` model to a
verified int8 `.tflite`.

    kerasnorm qat MODEL.keras --data FILE.npz --epochs N --out DIR
        [--loss NAME] [--from-logits] [--learning-rate LR] [--batch-size B]
        [--verify-data FILE.npy|.npz] [--force] [--verbose]

Rebuilds the Keras 3 model as a tf_keras model (`kerasnorm.export.
quantize_aware`), fine-tunes it with TFMOT's quantization simulation on the
`x` and `y` arrays of FILE.npz (`x` may instead be one array per model input,
named after the inputs), writes `DIR/<name>.qat.int8.tflite` calibrated on
`x`, verifies it against the QAT model and prints the table of `kerasnorm
export`. Exit status as for `kerasnorm export`: 0 written and verified, 1
parity check failed, 2 bad arguments or existing output without --force, 3
conversion failed.
"""

from __future__ import annotations

import os
import sys

from kerasnorm.cli._jobs import EXIT_USAGE
from kerasnorm.cli._jobs import Job
from kerasnorm.cli._jobs import export_all
from kerasnorm.cli._jobs import load_inputs
from kerasnorm.cli._jobs import print_table

# The crossentropies (which take --from-logits) by their tf_keras class.
_CROSSENTROPY = {
    "sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
    "categorical_crossentropy": "CategoricalCrossentropy",
    "binary_crossentropy": "BinaryCrossentropy",
}
LOSSES = (*_CROSSENTROPY, "mean_squared_error")


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "qat",
        help="quantization-aware fine-tuning to a verified int8 .tflite",
        description=__doc__.split("\n\n")[-1],
    )
    parser.add_argument("model", help="a .keras file (loaded with safe_mode=True)")
    parser.add_argument(
        "--data",
        required=True,
        help=".npz with arrays `y` (targets) and `x` (inputs; or one array "
        "per model input, by input name)",
    )
    parser.add_argument("--epochs", type=int, required=True, help="fine-tune epochs")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--loss",
        choices=LOSSES,
        default="sparse_categorical_crossentropy",
        help="training loss (default: sparse_categorical_crossentropy)",
    )
    parser.add_argument(
        "--from-logits",
        action="store_true",
        help="the model outputs logits (crossentropy losses)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=1e-4,
        help="Adam learning rate (default: 1e-4, a tenth of Adam's default: "
        "the model is already trained)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--verify-data",
        help="held-out inputs for the parity check (.npy or .npz; default: up "
        "to 256 samples of x)",
    )
    parser.add_argument("--force", action="store_true", help="replace the output")
    parser.add_argument(
        "--verbose", action="store_true", help="show TensorFlow's own logs"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    """Fine-tune, export and verify; the exit status."""
    try:
        path = _check(args)
        model, x, y, check_inputs = _load(args)
    except (ValueError, FileExistsError, OSError, KeyError) as err:
        print(f"kerasnorm qat: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    from kerasnorm import export

    try:
        qat_model = export.quantize_aware(model, verify_inputs=check_inputs)
    except (ValueError, export.ExportVerificationError) as err:
        print(f"kerasnorm qat: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    _fine_tune(qat_model, x, y, args)

    def export_int8(model, calibration, verify_inputs):
        return export.to_tflite(
            model,
            path,
            quantize="int8",
            representative_data=calibration,
            overwrite=args.force,
            verify_inputs=verify_inputs,
            verbose=args.verbose,
        )

    job = Job(os.path.basename(path), path, export_int8)
    status, rows = export_all([job], qat_model, x, check_inputs)
    print_table(rows)
    return status


def _check(args):
    if not os.path.isfile(args.model) or not args.model.endswith(".keras"):
        raise ValueError(f"expected an existing .keras file. Received: {args.model!r}")
    if not args.data.endswith(".npz") or not os.path.isfile(args.data):
        raise ValueError(f"--data should be an existing .npz file: {args.data!r}")
    if args.from_logits and args.loss not in _CROSSENTROPY:
        raise ValueError(f"--from-logits needs a crossentropy loss, not {args.loss}")
    if args.epochs < 1:
        raise ValueError(f"--epochs must be at least 1. Received: {args.epochs}")
    name = os.path.splitext(os.path.basename(args.model))[0]
    path = os.path.join(args.out, f"{name}.qat.int8.tflite")
    if os.path.lexists(path) and not args.force:
        raise FileExistsError(f"{path} already exists; pass --force to replace.")
    return path


def _load(args):
    import keras
    import numpy as np

    from kerasnorm.export import VERIFY_SAMPLES
    from kerasnorm.export import model_inputs

    model = keras.saving.load_model(args.model, safe_mode=True)
    names = [t.name for t in model.inputs]
    with np.load(args.data, allow_pickle=False) as archive:
        if "y" not in archive.files:
            raise ValueError(f"--data {args.data} has no array `y` (the targets)")
        y = archive["y"]
        data = archive["x"] if "x" in archive.files else {n: archive[n] for n in names}
    x = keras.tree.flatten(model_inputs(model, data, argument=f"--data {args.data}"))
    if len(y) != len(x[0]):
        raise ValueError(
            f"--data {args.data}: x has {len(x[0])} samples, y has {len(y)}"
        )
    check_inputs = load_inputs(args.verify_data, model, "--verify-data")
    if check_inputs is None:
        check_inputs = [a[:VERIFY_SAMPLES] for a in x]
    return model, x, y, check_inputs


def _fine_tune(qat_model, x, y, args):
    import tf_keras

    loss = tf_keras.losses.get(args.loss)
    if args.from_logits:
        loss = tf_keras.losses.get(
            {"class_name": _CROSSENTROPY[args.loss], "config": {"from_logits": True}}
        )
    qat_model.compile(tf_keras.optimizers.Adam(args.learning_rate), loss)
    qat_model.fit(
        x if len(x) > 1 else x[0],
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=2,
    )
