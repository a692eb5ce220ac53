"""`kerasnorm qat`: quantization-aware fine-tuning of a `.keras` model to a
verified int8 `.tflite`.

    kerasnorm qat MODEL.keras --data FILE.npz --epochs N --out DIR
        [--loss NAME] [--from-logits] [--learning-rate LR] [--batch-size B]
        [--verify-data FILE.npy|.npz] [--force]
        [--import MODULE|FILE.py ...] [--no-safe-mode] [--verbose]

Rebuilds the Keras 3 model as a tf_keras model (`kerasnorm.export.
quantize_aware`), fine-tunes it with TFMOT's quantization simulation on the
`x` and `y` arrays of FILE.npz (`x` may instead be one array per model input,
named after the inputs), writes `DIR/<name>.qat.int8.tflite` calibrated on
`x`, verifies it against the QAT model and prints the table of `kerasnorm
export`. The arguments and the exit statuses are `kerasnorm_cli`'s, shared
with `kerasnorm export`: 0 written and verified, 1 a parity check failed
(the QAT model's against the Keras model included), 2 refused (bad
arguments, unreadable files, existing output without --force, the `qat`
extra not installed), 3 the model cannot be quantized or converted.
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
from kerasnorm.cli._load import read_arrays
from kerasnorm.cli._load import sample_count


def run(args) -> int:
    """Fine-tune, export and verify; the outcome."""
    try:
        model = load_model(
            args.model,
            imports=args.imports,
            safe_mode=not args.no_safe_mode,
            command="qat",
        )
        x, y = _load_data(args.data, model)
        verify_inputs = load_inputs(args.verify_data, model, "--verify-data")
    except (ValueError, OSError) as err:
        print(f"kerasnorm qat: error: {err}", file=sys.stderr)
        return "usage"
    checked_on = "--verify-data"
    if verify_inputs is None:
        from kerasnorm.export import VERIFY_SAMPLES

        verify_inputs = head(x, VERIFY_SAMPLES)
        checked_on = "--data x"
    from kerasnorm import export

    try:
        qat_model = export.quantize_aware(model, verify_inputs=verify_inputs)
    except ImportError as err:
        print(f"kerasnorm qat: error: {err}", file=sys.stderr)
        return "usage"
    except export.ExportVerificationError as err:
        print(f"kerasnorm qat: {err}", file=sys.stderr)
        return "parity"
    except ValueError as err:
        print(f"kerasnorm qat: cannot quantize: {err}", file=sys.stderr)
        return "conversion"
    _fine_tune(qat_model, x, y, args)
    path = args.target

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

    job = Job(os.path.basename(path), export_int8)
    status, rows = export_all("qat", [job], qat_model, x, verify_inputs, checked_on)
    print_table(rows, checked_on)
    return status


def _load_data(path, model):
    """(x in the model's input structure, y) from the --data archive."""
    data = read_arrays(path, "--data")
    if "y" not in data:
        raise ValueError(f"--data {path} has no array `y` (the targets)")
    y = data.pop("y")
    from kerasnorm.export import model_inputs

    x = data["x"] if "x" in data else data
    x = model_inputs(model, x, argument=f"--data {path}")
    if len(y) != sample_count(x):
        raise ValueError(f"--data {path}: x has {sample_count(x)} samples, y {len(y)}")
    return x, y


def _fine_tune(qat_model, x, y, args):
    import tf_keras

    loss = tf_keras.losses.get(args.loss)
    if args.from_logits:
        config = {"from_logits": True}
        loss = tf_keras.losses.get(
            {"class_name": _class_name(args.loss), "config": config}
        )
    qat_model.compile(tf_keras.optimizers.Adam(args.learning_rate), loss)
    qat_model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=2)


def _class_name(loss):
    """The tf_keras class of a crossentropy loss's name."""
    return "".join(part.capitalize() for part in loss.split("_"))
