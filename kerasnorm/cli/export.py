"""`kerasnorm export`: a `.keras` model to verified SavedModel / TFLite files,
or a decoder LM to a verified generative file.

    kerasnorm export MODEL.keras --out DIR [--format litert|tf_saved_model ...]
        [--saved-model] [--tflite]
        [--quantize float16|dynamic|int8|int16x8 ...]
        [--calibration FILE.npy|.npz] [--verify-data FILE.npy|.npz]
        [--int8-io] [--smooth] [--no-fold] [--force] [--version N] [--streaming]
        [--export-dtype float32|float16] [--max-unroll-steps N]
        [--batch-size N] [--import MODULE|FILE.py ...] [--no-safe-mode]
        [--verbose]
    kerasnorm export MODEL.keras|PRESET_DIR --out DIR --format litert_lm
        --max-sequence-length N [--prefill-lengths T ...]
        [--quantize float16|dynamic ...] [--tokenizer FILE]
        [--chat-template FILE] [--start-token T] [--stop-tokens T ...]
        [--top-k K] [--top-p P] [--temperature T] [--drafter DIR] [--force]

The arguments, the artifacts' paths and the exit statuses are
`kerasnorm_cli`'s (see `kerasnorm export --help`); `run` loads the model and
the inputs files, then writes and verifies each artifact.
"""

from __future__ import annotations

import sys

from kerasnorm.cli._jobs import Job
from kerasnorm.cli._jobs import export_all
from kerasnorm.cli._jobs import print_table
from kerasnorm.cli._load import head
from kerasnorm.cli._load import load_drafter
from kerasnorm.cli._load import load_for
from kerasnorm.cli._load import load_inputs


def run(args) -> int:
    """Export and verify every requested artifact; the outcome."""
    try:
        model = load_for(args, "export")
        drafter = load_drafter(args)
        calibration = load_inputs(args.calibration, model, "--calibration")
        verify_inputs = load_inputs(args.verify_data, model, "--verify-data")
    except (ValueError, OSError) as err:
        print(f"kerasnorm export: error: {err}", file=sys.stderr)
        return "usage"
    checked_on = "--verify-data" if verify_inputs is not None else None
    if verify_inputs is None and calibration is not None:
        from kerasnorm.export import VERIFY_SAMPLES

        verify_inputs = head(calibration, VERIFY_SAMPLES)
        checked_on = "--calibration"
    jobs = [_job(args, target, drafter) for target in args.targets]
    status, rows = export_all(
        "export", jobs, model, calibration, verify_inputs, checked_on
    )
    print_table(rows, checked_on)
    return status


def _job(args, target, drafter=None):
    """The Job writing one of the front's `args.targets`: its format and
    quantize mode, with the command's flags as that file's options (those
    the file has no use for left at their defaults, `options_for_file`);
    `drafter`: `--drafter`'s model, bundled beside the base."""

    def write(model, calibration, verify_inputs):
        from kerasnorm.export import export
        from kerasnorm.export import options_for_file

        options = options_for_file(
            target.format,
            target.quantize,
            fold=not args.no_fold,
            version=args.version,
            representative_data=calibration,
            int8_io=args.int8_io,
            smooth=args.smooth or None,
            overwrite=args.force,
            verify_inputs=verify_inputs,
            progress=True,
            verbose=args.verbose,
            streaming=args.streaming,
            batch_size=args.batch_size,
            export_dtype=args.export_dtype,
            max_unroll_steps=args.max_unroll_steps,
            max_sequence_length=args.max_sequence_length,
            prefill_lengths=args.prefill_lengths,
            tokenizer=args.tokenizer,
            min_agreement=args.min_agreement,
            chat_template=args.chat_template,
            start_token=args.start_token,
            stop_tokens=args.stop_tokens,
            top_k=args.top_k,
            top_p=args.top_p,
            temperature=args.temperature,
            drafter=drafter,
        )
        if "max_sequence_length" in options:
            # A generative file's stages, one line each (a language model's
            # export takes minutes); `options_for_file` keeps `progress`
            # for calibrating modes only.
            options["progress"] = True
        try:
            return export(model, target.base, format=target.format, **options)
        except TypeError as err:
            if drafter is None:
                raise
            # `to_litert_lm`'s refusal of the pair, by name, before any
            # tracing: an argument, as a refusal.
            raise ValueError(str(err)) from err

    return Job(target.label, write)
