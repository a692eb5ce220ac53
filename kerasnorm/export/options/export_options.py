"""`ExportOptions`: an export's public arguments, checked and resolved once.

The door (`export`, and its shortcuts `to_tflite`, `to_saved_model`) builds
one (`ExportOptions.build(format, **options)`) before any work; it owns
every refusal of a bad value or combination, and the defaults that depend
on other arguments (the quantize mode under `export_dtype="float16"`, the
tolerance, the calibration sample count). Every later stage reads it
(through `Prepared.options`) and re-checks nothing; a mode's policy is read
from its `Mode` (`modes.MODES`), a format's facts from its row
(`formats.FORMATS`), each option's default from its declaration
(`declared.OPTIONS`).
"""

from __future__ import annotations

import dataclasses

from kerasnorm._core import check_choice
from kerasnorm._core import check_positive_int
from kerasnorm.export.options.declared import DEFAULTS
from kerasnorm.export.options.formats import Format
from kerasnorm.export.options.formats import format_named
from kerasnorm.export.options.modes import CALIBRATION_SAMPLES
from kerasnorm.export.options.modes import CALIBRATION_STEPS
from kerasnorm.export.options.modes import DEFAULT_TOLERANCE
from kerasnorm.export.options.modes import EXPORT_DTYPES
from kerasnorm.export.options.modes import MAX_UNROLL_STEPS
from kerasnorm.export.options.modes import MODES
from kerasnorm.export.options.modes import QUANTIZE_MODES


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """One export's options. `format` is the format's row
    (`formats.Format`); `quantize` the resolved mode (None for a format
    that does not quantize); `tolerance` the parity tolerance against the
    exported model; user data (`verify_inputs`, `representative_data`) as
    given, parsed by `prepare`."""

    format: Format
    fold: bool = True
    quantize: str | None = None
    streaming: bool = False
    export_dtype: str = "float32"
    tolerance: float = DEFAULT_TOLERANCE[None]
    # Whether `tolerance` is the user's (else the mode's default).
    tolerance_given: bool = False
    overwrite: bool = False
    verify_inputs: object = dataclasses.field(default=None, compare=False, repr=False)
    representative_data: object = dataclasses.field(
        default=None, compare=False, repr=False
    )
    int8_io: bool = False
    calibration_samples: int = CALIBRATION_SAMPLES
    # None: dynamic (`shapes.file_shapes` has the rule).
    batch_size: int | None = None
    # The user's `input_signature` as given, resolved against the model's
    # inputs by `prepare` (`shapes.file_shapes`).
    input_signature: object = dataclasses.field(default=None, compare=False, repr=False)
    max_unroll_steps: int = MAX_UNROLL_STEPS
    # None: off (a generative file: its mode's default); False: off; True:
    # strength searched per norm; a float in [0, 1].
    smooth: object = None
    # "int8" / "int4": the model was quantized by Keras and the file holds
    # those integers (`Format.for_model`, the `.tflite` row's
    # `tflite.keras_weights`); None otherwise.
    keras_weights: str | None = None
    progress: bool = False
    verbose: bool = False
    # A generative file's (`to_litert_lm`): the cache length, the prefill
    # signatures' lengths (resolved), the bundle's tokenizer.
    max_sequence_length: int | None = None
    prefill_lengths: tuple | None = None
    # What a prefill signature returns ("last" row's logits, "all", "none";
    # None: "none" in a bundle, "last" in a `.tflite`), and the block of
    # `quantize="int4"` (None: 32).
    prefill_logits: str | None = None
    int4_block_size: int | None = None
    # The agreement a quantized generative file must reach (None: its
    # mode's).
    min_agreement: float | None = None
    # LoRA adapters merged ("merge") or LiteRT-LM's adapter inputs
    # ("runtime", of rank `lora_rank`; None: the model's).
    lora: str = "merge"
    lora_rank: int | None = None
    tokenizer: object = dataclasses.field(default=None, compare=False, repr=False)
    # A `.litertlm` bundle's (`litert_lm.bundle`): tokens, chat template,
    # sampler defaults.
    start_token: object = None
    stop_tokens: object = None
    chat_template: object = dataclasses.field(default=None, repr=False)
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    # A Gemma 4 base's MTP drafter (`litert_lm.speculative`).
    drafter: object = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def build(cls, format, **options):
        """The options of an export to `format` (a `formats.Format`):
        an option the format does not take is refused as a function
        refuses an unknown keyword; the others default to their
        declaration (`declared.OPTIONS`), then every check."""
        unknown = sorted(set(options) - set(format.options))
        if unknown:
            raise TypeError(
                f"format={format.name!r} takes no option {unknown[0]!r}. Its "
                f"options: {', '.join(format.options)}."
            )
        given = {name: options.get(name, DEFAULTS[name]) for name in format.options}
        given.pop("version", None)  # the layout's (`Format.target`)
        if format.checks is not None:
            return cls(format, **format.load("checks")(given))
        check_export_dtype(given["export_dtype"])
        if format.quantizes:
            given["quantize"] = _tflite_quantize(
                given["export_dtype"], given["quantize"]
            )
        given["batch_size"] = _check_shapes(
            given["batch_size"], given["input_signature"], given["streaming"]
        )
        if format.quantizes:
            given = _quantized(given)
        elif given["tolerance"] is None:
            given["tolerance"] = DEFAULT_TOLERANCE[None]
        return cls(format, **given)

    @property
    def mode(self):
        """The quantize mode's policy (`modes.Mode`)."""
        return MODES[self.quantize]

    @property
    def file_quantize(self):
        """What the file's weights are quantized to, as a result reports
        it: `quantize`, or `"int4"` for Keras' int4 weights (activations
        quantized per call, as `"dynamic"`'s)."""
        return "int4" if self.keras_weights == "int4" else self.quantize

    @property
    def fast_int8(self):
        """The fast int8 file is asked for (`quantize="int8"`, no
        `int8_io`); `Prepared.int8_writer` says which writer makes it."""
        return self.mode.fast_int8 and not self.int8_io

    @property
    def rebuild_dtype(self):
        """The dtype a half-precision model's copy computes in: float16 for
        a float16 SavedModel; float32 else (TFLite's builtin kernels compute
        in float32, a float16 `.tflite` stores float16 weights only)."""
        if self.export_dtype == "float16" and self.format.computes_in_half:
            return "float16"
        return "float32"

    @property
    def folds_affines(self):
        """Whether the fold also merges the norms' affines into the next
        linear layer (`fold.affine`): a float32 `.tflite` file, whose graph
        is the one written for speed (`_core.lowering`); the quantized and
        float16 files keep the norms whole, as their quantizers expect."""
        return self.fold and self.format.folds_norm_affines and self.mode.name is None

    @property
    def calibrated_file(self):
        """A `.tflite` file of a calibrated mode (`Mode.calibrates`):
        its batch is fixed at `shapes.CALIBRATED_BATCH` unless `batch_size`
        says otherwise."""
        return self.format.quantizes and self.mode.calibrates

    @property
    def unrolls(self):
        """Whether rolled recurrent layers are unrolled (a whole-sequence
        TFLite file of a full-integer mode; `prepare.unroll` decides per
        layer)."""
        return self.format.quantizes and not self.streaming


def options_for_file(format, quantize=None, **given):
    """The options of one file of several written with the same values
    (`kerasnorm export`'s flags): those `format` takes, `quantize` for a
    format that quantizes; a value of None, or one the file's mode has no
    use for (`Mode.uses`), left out (the declared default)."""
    row = format_named(format)
    # A generative file's modes ("int4", "weight_only_int8") are no
    # `.tflite` mode: every option its format takes is its own.
    mode = MODES.get(quantize)
    chosen = {
        name: value
        for name, value in given.items()
        if name in row.options
        and value is not None
        and (mode is None or mode.uses(name))
    }
    if row.quantizes:
        chosen["quantize"] = quantize
    return chosen


def _quantized(given):
    """`given` (a quantizing format's options) with the quantize mode and
    the defaults that depend on it resolved: every refusal of a bad
    combination."""
    quantize = given["quantize"]
    mode = MODES[quantize]
    streaming, int8_io = given["streaming"], given["int8_io"]
    fast_step = streaming and mode.fast_int8 and not int8_io
    samples = given["calibration_samples"]
    if samples is None:
        samples = CALIBRATION_STEPS if fast_step else CALIBRATION_SAMPLES
    samples = check_positive_int(samples, "calibration_samples")
    if mode.calibrates and given["representative_data"] is None:
        raise ValueError(
            f"quantize={quantize!r} calibrates activation ranges and needs "
            "representative_data (a few hundred typical inputs). Received: "
            "representative_data=None"
        )
    if int8_io and not mode.fast_int8:
        raise ValueError(
            f'int8_io=True needs quantize="int8". Received: quantize={quantize!r}'
        )
    max_unroll_steps = check_positive_int(given["max_unroll_steps"], "max_unroll_steps")
    if streaming and max_unroll_steps != MAX_UNROLL_STEPS:
        raise ValueError(
            "max_unroll_steps bounds the recurrent layers a whole-sequence "
            "full-integer export unrolls; a streaming step runs one time "
            "step per call and unrolls nothing. Received: max_unroll_steps="
            f"{max_unroll_steps} with streaming=True; leave "
            "max_unroll_steps at its default."
        )
    tolerance = given["tolerance"]
    return {
        **given,
        "smooth": _check_smooth(
            given["smooth"], mode, given["representative_data"], streaming
        ),
        "quantize": quantize,
        "tolerance": mode.tolerance if tolerance is None else tolerance,
        "tolerance_given": tolerance is not None,
        "calibration_samples": samples,
        "max_unroll_steps": max_unroll_steps,
    }


def _check_shapes(batch_size, input_signature, streaming):
    """`batch_size` checked (None: dynamic); `input_signature` is checked
    against the model's inputs by `prepare`."""
    if streaming and input_signature is not None:
        raise ValueError(
            "input_signature fixes the dimensions of a whole-sequence "
            "artifact's inputs; a streaming step takes one frame, its "
            "features the model's. Leave input_signature out with "
            "streaming=True (batch_size fixes how many streams a call runs)."
        )
    if batch_size is None:
        return None
    return check_positive_int(batch_size, "batch_size")


def check_export_dtype(export_dtype):
    if export_dtype not in EXPORT_DTYPES:
        raise ValueError(
            f"export_dtype should be one of {EXPORT_DTYPES}. Received: "
            f"export_dtype={export_dtype!r}"
        )


def _tflite_quantize(export_dtype, quantize):
    """The quantize mode `to_tflite` converts with for `export_dtype`."""
    check_export_dtype(export_dtype)
    check_choice(quantize, QUANTIZE_MODES, "quantize")
    if export_dtype == "float32":
        return quantize
    if MODES[quantize].weights not in (None, "float16"):
        raise ValueError(
            'export_dtype="float16" writes a TFLite file with float16 weights '
            "(TFLite's builtin kernels have no float16 compute; GPU delegates "
            f"run such a file in float16), which quantize={quantize!r} "
            'replaces. Pass quantize=None or "float16" with it, or '
            'export_dtype="float32".'
        )
    return "float16"


def _check_smooth(smooth, mode, representative_data, streaming):
    """`smooth` as the export takes it: None (off), True (searched) or a
    strength in [0, 1]; refused where it cannot apply."""
    if smooth is None or smooth is False:
        return None
    if smooth is not True and not (
        isinstance(smooth, (int, float)) and 0.0 <= smooth <= 1.0
    ):
        raise ValueError(
            "smooth should be True (the strength searched per norm on "
            "representative_data), a migration strength in [0, 1], or None. "
            f"Received: smooth={smooth!r}"
        )
    if not mode.smooths:
        raise ValueError(
            "smooth moves outlier channels of each norm's output into the "
            "next linear layer's weights for int8 activations: pass "
            'quantize="int8" or "dynamic" with it. Received: '
            f"quantize={mode.name!r}"
        )
    if representative_data is None:
        raise ValueError(
            "smooth calibrates each norm's channel ranges on "
            "representative_data: pass representative_data (a few hundred "
            "typical inputs) with smooth."
        )
    if streaming:
        raise ValueError(
            "smooth rescales a whole-sequence model's norms; a streaming "
            "step is not smoothed. Pass smooth=None with streaming=True."
        )
    return smooth if smooth is True else float(smooth)
