"""The `kerasnorm` command's parsers: `demo`, `export`, `qat`, and
`--version`; nothing here imports more than the standard library."""

import argparse
import re
import textwrap

from kerasnorm_cli.exits import EXIT_STATUS_HELP
from kerasnorm_cli.generative_arguments import add_generative_flags

# Standard-library copies of the library's tables (tests pin them): the
# export formats, named as Keras names them, and the quantize modes (a
# generative file's: `to_litert_lm`'s, None left out).
EXPORT_FORMATS = ("litert", "tf_saved_model", "litert_lm")
QUANTIZE_MODES = ("float16", "dynamic", "int8", "int16x8")
GENERATIVE_QUANTIZE_MODES = ("float16", "dynamic", "int4", "weight_only_int8")
CALIBRATED_MODES = ("int8", "int16x8")
QAT_LOSSES = (
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "mean_squared_error",
)
DEMO_OUT = "kerasnorm-demo"


def version():
    """kerasnorm's version, read from the package's literal (no import)."""
    from importlib.util import find_spec

    with open(find_spec("kerasnorm").origin, encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


class _Version(argparse.Action):
    # Reads the version only when asked for.
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"kerasnorm {version()}")
        parser.exit()


def _positive(kind):
    """An argparse type: a number of `kind` above 0, else a refusal that
    argparse prefixes with the flag's name."""

    def convert(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            what = "integer" if kind is int else "number"
            raise argparse.ArgumentTypeError(
                f"expected a positive {what}. Received: {text}"
            )
        return value

    return convert


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kerasnorm",
        description="Normalization layers for Keras: demo and export tools. "
        "`kerasnorm export` writes verified SavedModel and TFLite files, and "
        "for language models (keras-hub CausalLMs, .keras files or "
        "save_to_preset folders) the generative .tflite and the chat-ready "
        "LiteRT-LM bundle (.litertlm) that LiteRT-LM's engine runs on "
        "Android, iOS and desktop.",
    )
    parser.add_argument(
        "--version", action=_Version, help="print kerasnorm's version and exit"
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in (_add_demo, _add_export, _add_export_adapter, _add_qat):
        add(subparsers).add_argument(
            "--verbose",
            action="store_true",
            help="show TensorFlow's and the TFLite converter's own logs",
        )
    return parser


def _command(subparsers, name, summary, description):
    return subparsers.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, 79),
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_demo(subparsers):
    parser = _command(
        subparsers,
        "demo",
        "train a conv net with every kerasnorm norm layer and an LN-LSTM "
        "under XLA, export and verify them, and report",
        "Trains two models on scikit-learn's digits, exports each to a "
        "SavedModel and float32, float16 and int8 .tflite files (QAT int8 too "
        "with the qat extra), checks every file on the held-out digits, and "
        "writes report.json and report.md to --out.",
    )
    parser.add_argument(
        "--out",
        default=DEMO_OUT,
        metavar="DIR",
        help=f"output directory; must be empty or absent (default: {DEMO_OUT})",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out, replacing the demo's own files",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer epochs, a smaller LSTM and less calibration (a smoke run)",
    )
    parser.add_argument(
        "--epochs",
        type=_positive(int),
        metavar="N",
        help="epochs for both models (default: 10, quick: 3)",
    )
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    return parser


def _add_model(parser):
    """The model argument and what loading it needs: the user's own
    layers (`--import`), Lambda layers (`--no-safe-mode`)."""
    parser.add_argument(
        "model",
        metavar="MODEL.keras",
        help="loaded with safe_mode=True unless --no-safe-mode"
        + (
            "; or a keras-hub preset folder (save_to_preset's, loaded offline)"
            if parser.prog.endswith("export")
            else ""
        ),
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a module name, my_layers, or a .py file path, "
        "./layers.py) before loading the model, so that the layers and "
        "functions it registers with keras.saving.register_keras_serializable "
        "load (repeatable)",
    )
    parser.add_argument(
        "--no-safe-mode",
        action="store_true",
        help="load with safe_mode=False, which a model with Lambda layers "
        "needs: it runs the Python code stored in the file (only for files "
        "you trust)",
    )


def _add_export(subparsers):
    parser = _command(
        subparsers,
        "export",
        "fold BatchNorm, export SavedModel/TFLite (language models: "
        "LiteRT-LM bundles), verify against Keras",
        "Writes the artifacts named: DIR/<name>/<version>/ (--saved-model, a "
        "TF Serving model base path), DIR/<name>.tflite (--tflite, float) and "
        "DIR/<name>.<mode>.tflite (each --quantize MODE); with none named, the "
        "SavedModel and the float .tflite. Each is checked against the Keras "
        "model; the command prints the fold report and a table. A model saved "
        "under a mixed_float16 / mixed_bfloat16 policy is exported from a "
        "float32 copy with the same weights. --format litert_lm writes a "
        "language model (a keras-hub CausalLM: a .keras file or a "
        "save_to_preset folder) as the LiteRT-LM bundle that the engine's "
        "chat API and its Android and iOS APIs load.",
    )
    _add_model(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        default=[],
        choices=EXPORT_FORMATS,
        metavar="FORMAT",
        help="write the format's artifact, named as Keras' model.export names "
        "it: tf_saved_model (as --saved-model) or litert (as --tflite; "
        "--quantize adds quantized ones) (repeatable); litert_lm, alone: a "
        "language model's LiteRT-LM bundle DIR/<name>.litertlm when it has a "
        "tokenizer (its preprocessor's, or --tokenizer), else its generative "
        "file DIR/<name>.tflite; each --quantize float16/dynamic/int4/"
        "weight_only_int8 instead "
        "DIR/<name>.<MODE>.litertlm (.tflite); needs --max-sequence-length",
    )
    parser.add_argument("--saved-model", action="store_true", help="write a SavedModel")
    parser.add_argument("--tflite", action="store_true", help="write a float .tflite")
    parser.add_argument(
        "--quantize",
        action="append",
        default=[],
        choices=QUANTIZE_MODES + GENERATIVE_QUANTIZE_MODES[2:],
        metavar="MODE",
        help=f"write DIR/<name>.<MODE>.tflite, MODE one of {', '.join(QUANTIZE_MODES)}"
        " (--format litert_lm: "
        f"{', '.join(GENERATIVE_QUANTIZE_MODES)}) (repeatable); alone, only the "
        "quantized file(s) are written: add "
        "--saved-model / --tflite for those",
    )
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="inputs for int8/int16x8 calibration and, without --verify-data, "
        "for the parity checks: .npy (one input) or .npz (one array per "
        "input, by input name or in order)",
    )
    parser.add_argument(
        "--verify-data",
        metavar="FILE",
        help="held-out inputs for the parity checks (.npy or .npz as for "
        "--calibration). Default: up to 256 samples of --calibration; without "
        "either, random inputs, as the table then says",
    )
    parser.add_argument(
        "--int8-io",
        action="store_true",
        help="with --quantize int8, the full-integer file: every op and the "
        "input/output tensors int8 (integer-only targets); without it the "
        "fast int8 file keeps the norms' statistics in float",
    )
    parser.add_argument(
        "--smooth",
        action="store_true",
        help="with --quantize int8 or dynamic, move each norm's outlier "
        "channels into the linear layers reading it (strength searched on "
        "--calibration); the float function is unchanged. --format "
        "litert_lm smooths dynamic and int4 files by default; --smooth "
        "turns it on for weight_only_int8 too, on the check's prompts",
    )
    parser.add_argument(
        "--no-fold", action="store_true", help="keep BatchNorm layers as they are"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace existing artifacts"
    )
    parser.add_argument(
        "--version",
        type=_positive(int),
        default=1,
        metavar="N",
        help="SavedModel version (default: 1)",
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
        "the SavedModel and stores float16 weights in the float .tflite "
        "(default: float32, a float32 copy of the model)",
    )
    parser.add_argument(
        "--max-unroll-steps",
        type=_positive(int),
        metavar="N",
        help="--quantize int8/int16x8 unroll rolled recurrent layers up to "
        "this sequence length (default: 64); not with --streaming",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive(int),
        metavar="N",
        help="fix the artifacts' batch (default: dynamic, as the model "
        "leaves it; a recurrent model's .tflite files: 1). A fixed shape "
        "keeps a file's shape arithmetic out of it: faster on XNNPACK",
    )
    add_generative_flags(parser, _positive)
    return parser


def _add_export_adapter(subparsers):
    parser = _command(
        subparsers,
        "export-adapter",
        "a LoRA fine-tune's adapters as a LiteRT-LM adapter file",
        "Writes DIR/<name>.lora.tflite: the LoRA adapters (--lora-weights) of a "
        "keras-hub CausalLM (MODEL, the base), the file LiteRT-LM's engine "
        "feeds per conversation to the base bundle `kerasnorm export --format "
        "litert_lm --lora runtime` wrote of the same base weights.",
    )
    _add_model(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--lora-weights",
        required=True,
        metavar="FILE.lora.h5",
        help="the fine-tune's adapters (backbone.save_lora_weights), loaded "
        "into MODEL, the base model",
    )
    parser.add_argument(
        "--lora-rank",
        type=_positive(int),
        metavar="R",
        help="the base file's adapter rank, when it reserved a larger one "
        "(default: 16, or 32 for a model of a larger rank)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing adapter file"
    )
    return parser


def _add_qat(subparsers):
    parser = _command(
        subparsers,
        "qat",
        "quantization-aware fine-tuning to a verified int8 .tflite",
        "Rebuilds the model for TFMOT's quantization simulation, fine-tunes "
        "it on the x and y arrays of --data (x may instead be one array per "
        "model input, by input name), writes DIR/<name>.qat.int8.tflite "
        "calibrated on x, checks it against the QAT model and prints the "
        "table of `kerasnorm export`.",
    )
    _add_model(parser)
    parser.add_argument(
        "--data",
        required=True,
        metavar="FILE.npz",
        help="arrays `y` (targets) and `x` (inputs; or one array per model "
        "input, by input name)",
    )
    parser.add_argument(
        "--epochs",
        type=_positive(int),
        required=True,
        metavar="N",
        help="fine-tune epochs",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--loss",
        choices=QAT_LOSSES,
        default=QAT_LOSSES[0],
        metavar="LOSS",
        help=f"training loss, one of {', '.join(QAT_LOSSES)} (default: "
        f"{QAT_LOSSES[0]})",
    )
    parser.add_argument(
        "--from-logits",
        action="store_true",
        help="the model outputs logits (crossentropy losses)",
    )
    parser.add_argument(
        "--learning-rate",
        type=_positive(float),
        default=1e-4,
        metavar="LR",
        help="Adam learning rate (default: 1e-4, a tenth of Adam's default: "
        "the model is already trained)",
    )
    parser.add_argument(
        "--batch-size", type=_positive(int), default=32, metavar="N", help="default: 32"
    )
    parser.add_argument(
        "--verify-data",
        metavar="FILE",
        help="held-out inputs for the parity check (.npy or .npz; default: up "
        "to 256 samples of x)",
    )
    parser.add_argument("--force", action="store_true", help="replace the output")
    return parser
