"""The checks of each subcommand's arguments that need no model: run
before Keras is imported, and before anything is written."""

import collections
import importlib.util
import json
import os
import sys
import zipfile

from kerasnorm_cli.arguments import CALIBRATED_MODES
from kerasnorm_cli.arguments import GENERATIVE_QUANTIZE_MODES
from kerasnorm_cli.arguments import QUANTIZE_MODES
from kerasnorm_cli.arguments import build_parser
from kerasnorm_cli.exits import EXIT_USAGE
from kerasnorm_cli.sources import BUNDLE_FLAGS
from kerasnorm_cli.sources import bundle_flags
from kerasnorm_cli.sources import check_drafter
from kerasnorm_cli.sources import check_preset
from kerasnorm_cli.sources import given_flags
from kerasnorm_cli.sources import model_name
from kerasnorm_cli.sources import writes_bundle


def parse(argv):
    """(arguments, None) for a command to run, else (None, exit status).

    Help, `--version`, and a refusal print here and give the status.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return None, stop.code
    problem = CHECKS[args.command](args)
    if problem:
        print(f"kerasnorm {args.command}: error: {problem}", file=sys.stderr)
        return None, EXIT_USAGE
    # What the work writes, decided here once (the work imports nothing
    # from this package).
    if args.command == "export":
        args.targets = export_targets(args)
    elif args.command == "qat":
        args.target = qat_target(args)
    elif args.command == "export-adapter":
        args.target = adapter_target(args)
    return args, None


def _check_demo(args):
    problem = _check_out(args.out)
    if problem:
        return problem
    entries = os.listdir(args.out) if os.path.isdir(args.out) else []
    if entries and not args.force:
        return (
            f"--out {args.out!r} is not empty ({len(entries)} entries). The "
            "demo writes into an empty or new directory; pass --force to write "
            "into this one anyway (replacing the demo's own files there), or "
            "choose another --out. Nothing was written."
        )
    return None


def _check_export(args):
    problem = _export_combination(args) or (
        check_model_source(args.model)
        or check_imports(args.imports)
        or _check_out(args.out)
        or _check_data_file(args.calibration, "--calibration")
        or _check_data_file(args.verify_data, "--verify-data")
        or bundle_flags(args)
        or check_drafter(args)
        or _check_lora_weights(args.lora_weights)
    )
    targets = export_targets(args)
    return problem or _missing_litert(targets) or _check_existing(args, targets)


def _generative_combination(args):
    """What is wrong with `kerasnorm export`'s flags for a generative file
    (`--format litert_lm`), or with its flags used without one."""
    flags = given_flags(
        args,
        (
            "--max-sequence-length",
            "--prefill-lengths",
            "--tokenizer",
            "--min-agreement",
            "--lora",
            "--lora-rank",
            "--lora-weights",
            "--drafter",
            *BUNDLE_FLAGS,
        ),
    )
    if "litert_lm" not in args.formats:
        if flags:
            return f"{flags[0]} applies to --format litert_lm only."
        generative = [m for m in args.quantize if m not in QUANTIZE_MODES]
        if generative:
            return f"--quantize {generative[0]} applies to --format litert_lm only."
        return None
    others = [f for f in args.formats if f != "litert_lm"]
    if others or args.saved_model or args.tflite:
        return (
            "--format litert_lm writes a decoder LM's generative file alone: "
            "export the other formats in another command."
        )
    if args.max_sequence_length is None:
        return (
            "--format litert_lm needs --max-sequence-length N (the cache "
            "length: prompt plus generated tokens)."
        )
    wrong = [m for m in args.quantize if m not in GENERATIVE_QUANTIZE_MODES]
    if wrong:
        return (
            f"--format litert_lm takes --quantize "
            f"{' or '.join(GENERATIVE_QUANTIZE_MODES)}. Received: "
            f"--quantize {wrong[0]}"
        )
    unused = [
        flag
        for flag, value in (
            ("--calibration", args.calibration),
            ("--int8-io", args.int8_io),
            ("--streaming", args.streaming),
            ("--max-unroll-steps", args.max_unroll_steps),
            ("--batch-size", args.batch_size),
            ("--no-fold", args.no_fold),
        )
        if value
    ]
    if args.export_dtype != "float32":
        unused.append("--export-dtype")
    if unused:
        return f"{unused[0]} does not apply to --format litert_lm."
    return None


def check_model_source(path):
    """What is wrong with the model `kerasnorm export` reads (a `.keras`
    file, or a keras-hub preset folder), or None."""
    if os.path.isdir(path):
        return check_preset(path)
    return check_keras_archive(path)


def _export_combination(args):
    """What is wrong with the combination of `kerasnorm export`'s flags."""
    problem = _generative_combination(args)
    if problem or "litert_lm" in args.formats:
        return problem
    modes = set(args.quantize)
    calibrated = [m for m in CALIBRATED_MODES if m in modes]
    if calibrated and not args.calibration:
        return (
            f"--quantize {calibrated[0]} calibrates activation ranges and needs "
            "--calibration FILE.npy|.npz (a few hundred typical inputs)."
        )
    if args.int8_io and "int8" not in modes:
        return "--int8-io needs --quantize int8."
    if args.smooth and not modes & {"int8", "dynamic"}:
        return "--smooth needs --quantize int8 or dynamic."
    if args.smooth and not args.calibration:
        return "--smooth calibrates each norm's channels and needs --calibration."
    if args.max_unroll_steps is not None and args.streaming:
        return (
            "--max-unroll-steps applies to whole-sequence files; --streaming "
            "exports one time step per call and unrolls nothing."
        )
    if args.max_unroll_steps is not None and not calibrated:
        return "--max-unroll-steps applies to --quantize int8 / int16x8 only."
    if (
        args.export_dtype == "float16"
        and modes
        and not (
            _asked(args, "tf_saved_model", args.saved_model)
            or _asked(args, "litert", args.tflite)
        )
    ):
        return (
            "--export-dtype float16 applies to the SavedModel and the float "
            ".tflite, and only --quantize files are asked for: add "
            "--saved-model or --tflite."
        )
    return None


class Target(collections.namedtuple("Target", "format quantize label path base")):
    """One artifact a command writes: its format (Keras' name) and quantize
    mode (None: float), its label in the table, the path that must not
    exist without --force, and the path the export is given (a SavedModel's
    base directory, a file's own path)."""


def _asked(args, format, flag):
    return flag or format in args.formats


def export_targets(args):
    """What `kerasnorm export` writes, in order (`Target`s)."""
    name = model_name(args.model)
    modes = list(dict.fromkeys(args.quantize))
    if "litert_lm" in args.formats:
        # One generative file per mode: with a tokenizer (--tokenizer, or
        # the model's preprocessor's) the LiteRT-LM bundle, else the model
        # file.
        suffix = ".litertlm" if writes_bundle(args) else ".tflite"
        targets = []
        for mode in modes or [None]:
            filename = name + ("" if mode is None else f".{mode}") + suffix
            path = os.path.join(args.out, filename)
            targets.append(Target("litert_lm", mode, filename, path, path))
        return targets
    saved = _asked(args, "tf_saved_model", args.saved_model)
    tflite = _asked(args, "litert", args.tflite)
    targets = []
    if saved or not (tflite or modes):
        version = os.path.join(name, str(args.version))
        base = os.path.join(args.out, name)
        path = os.path.join(args.out, version)
        targets.append(Target("tf_saved_model", None, version, path, base))
    if tflite or not (saved or modes):
        modes.insert(0, None)
    for mode in modes:
        filename = f"{name}.tflite" if mode is None else f"{name}.{mode}.tflite"
        path = os.path.join(args.out, filename)
        targets.append(Target("litert", mode, filename, path, path))
    return targets


def _check_qat(args):
    if args.from_logits and "crossentropy" not in args.loss:
        return (
            f"--from-logits needs a crossentropy --loss. Received: --loss {args.loss}"
        )
    problem = (
        check_keras_archive(args.model)
        or check_imports(args.imports)
        or _check_out(args.out)
        or _check_data_file(args.data, "--data", (".npz",))
        or _check_data_file(args.verify_data, "--verify-data")
    )
    path = qat_target(args)
    targets = [Target("litert", "int8", None, path, path)]
    return problem or _missing_litert(targets) or _check_existing(args, targets)


def check_imports(imports):
    """What is wrong with the `--import` values, or None: each must be a
    `.py` file that exists or a dotted module name (whether the module can
    be imported is found when it is, after these checks)."""
    for value in imports:
        if value.endswith(".py") or os.sep in value:
            if not os.path.isfile(value):
                return (
                    f"--import {value!r}: no such .py file. Give a module name "
                    "(my_layers) or the path of a .py file."
                )
        elif not all(part.isidentifier() for part in value.split(".")):
            return (
                f"--import {value!r} is neither a module name (my_layers, "
                "pkg.layers) nor a .py file path."
            )
    return None


def _missing_litert(targets):
    """A refusal when a `.tflite` file is among `targets` and LiteRT, which
    runs it to check it, is not installed (kerasnorm's `export` extra)."""
    if all(target.format == "tf_saved_model" for target in targets):
        return None
    if importlib.util.find_spec("ai_edge_litert") is not None:
        return None
    return (
        "writing a .tflite file needs LiteRT (the ai-edge-litert package), "
        "which runs the file to check it and is not installed. Install it with "
        '`pip install "kerasnorm[export]"`. Nothing was written.'
    )


def qat_target(args):
    """The file `kerasnorm qat` writes."""
    name = os.path.splitext(os.path.basename(args.model))[0]
    return os.path.join(args.out, f"{name}.qat.int8.tflite")


def adapter_target(args):
    """The file `kerasnorm export-adapter` writes."""
    name = os.path.basename(os.path.normpath(args.model))
    return os.path.join(args.out, f"{os.path.splitext(name)[0]}.lora.tflite")


def _check_lora_weights(path):
    if path is None:
        return None
    if not path.endswith(".lora.h5"):
        return f"--lora-weights is save_lora_weights' .lora.h5 file. Received: {path!r}"
    if not os.path.isfile(path):
        return f"--lora-weights file not found: {path!r}"
    return None


def _check_export_adapter(args):
    problem = (
        check_model_source(args.model)
        or check_imports(args.imports)
        or _check_out(args.out)
        or _check_lora_weights(args.lora_weights)
    )
    path = adapter_target(args)
    if not problem and os.path.lexists(path) and not args.force:
        problem = f"{path!r} exists; pass --force to replace it."
    return problem


CHECKS = {
    "demo": _check_demo,
    "export": _check_export,
    "export-adapter": _check_export_adapter,
    "qat": _check_qat,
}


def check_keras_archive(path):
    """What is wrong with the `.keras` file at `path`, or None.

    Keras reports a file that is not a zip archive as "File not found", and a
    damaged member with whatever its reader raised: both are told apart here,
    before Keras is imported.
    """
    if not os.path.isfile(path):
        return f"model file not found: {path!r}"
    if not path.endswith(".keras"):
        return f"expected a .keras model file. Received: {path!r}"
    if not zipfile.is_zipfile(path):
        return (
            f"{path!r} is not a valid .keras archive (not a zip file: "
            "truncated or not written by model.save?)"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            damaged = archive.testzip()
            config = None
            if damaged is None and "config.json" in names:
                config = archive.read("config.json")
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"{path!r} is not a valid .keras archive: {err}"
    if damaged is not None:
        return (
            f"{path!r} is a damaged .keras archive: its member {damaged!r} "
            "fails its checksum."
        )
    missing = [n for n in ("config.json", "model.weights.h5") if n not in names]
    if missing:
        return (
            f"{path!r} is not a valid .keras archive: it has no {' or '.join(missing)}."
        )
    try:
        json.loads(config)
    except ValueError as err:
        return (
            f"{path!r} is not a valid .keras archive: its config.json is not "
            f"valid JSON ({err})."
        )
    return None


def _check_out(out):
    if os.path.lexists(out) and not os.path.isdir(out):
        return f"--out {out!r} exists and is not a directory."
    # The directory, or the one it would be made in, must take new files.
    existing = os.path.abspath(out)
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out!r}: cannot write in {existing!r}."
    return None


def _check_data_file(path, flag, suffixes=(".npy", ".npz")):
    if path is None:
        return None
    if not path.endswith(suffixes):
        return f"{flag} should be a {' or '.join(suffixes)} file. Received: {path!r}"
    if not os.path.isfile(path):
        return f"{flag} file not found: {path!r}"
    return None


def _check_existing(args, targets):
    existing = [t.path for t in targets if os.path.lexists(t.path)]
    if existing and not args.force:
        return f"{', '.join(existing)} already exist(s); pass --force to replace."
    return None
