"""The export formats, one table: every fact of a format is read from `FORMATS`.

A `Format` row says, for one format named as Keras' `Model.export` names it
(`"litert"`, `"tf_saved_model"`), the artifact's layout (a file and its
suffix, or a versioned directory in TF Serving's layout), its writer, how
the verifier runs it, the options it takes, and the facts the stages ask of
it. No other module compares a format's name or an artifact's suffix: they
ask the row (`options.format.quantizes`, `format_of_artifact(path)`).

The row sits in the bottom layer so that every stage reads it; the code it
names sits above (the writer in the format's own folder), so it names that
code as `"module:function"` and imports it when the row is used (`load`).
A new format is one row here and its own folder (docs/design.md, "Formats").
"""

from __future__ import annotations

import dataclasses
import importlib
import os

from kerasnorm._core import check_positive_int
from kerasnorm.export.options.declared import SHARED_OPTIONS
from kerasnorm.export.options.declared import TFLITE_OPTIONS


@dataclasses.dataclass(frozen=True)
class Format:
    """One export format.

    `kind` is what results call the artifact (`Verification.kind`);
    `suffix` the file's suffix, or None for a directory `<path>/<version>/`;
    `writer` `"module:function"`, `write(prepared, staged_path)` returning the
    op types the file computes in float; `runtime` how the shared verifier
    runs the artifact (`"litert"`: the LiteRT interpreter; `"tensorflow"`:
    `tf.saved_model.load`, then again in a fresh process, as a server
    would); `ready` a `"module:function"` called before any work, or None;
    `verifier` a `"module:function"` that replaces the shared verifier
    (`verify.verifier.verify_export(prepared, artifact, label=...)`,
    returning `(verification, original_verification)`), or None;
    `options` the option names the format takes (`declared.OPTIONS`);
    `other_suffixes` the suffixes of the other files the format writes
    (`target` takes them too; `format_of_artifact` reads only `suffix`).

    A format whose export is not the shared pipeline's (prepare, write,
    verify) names its own: `checks` (`"module:function"`, the options
    dict resolved and checked, instead of the shared checks) and `run`
    (`run(model, options, target)`, which refuses, prepares, writes,
    verifies and moves the artifact into place itself, from the stages'
    shared functions, returning the format's result); it names no `writer`
    or `verifier`, which only the shared pipeline loads.

    Facts: `quantizes` (takes the quantize modes: calibrates, unrolls),
    `folds_norm_affines` (a float32 file gets the norms' affines folded
    into the next linear layer), `computes_in_half` (`export_dtype="float16"`
    keeps float16 compute; else float16 weights only), `streams` (a
    streaming step can be written), `hints_half_constants` (a failed
    float16 check names the large constants), `failure_hint`
    (`"module:function"`, `hinted(err, prepared, artifact)`: the error of
    a failed check, with what the format can say of its cause; the
    `.tflite` row's names the layer where a quantized file's error enters,
    `tflite.entry`), `signatures` (the
    signature keys the artifact carries), `for_model` (`"module:function"`,
    `(model, options) -> options`: the options resolved against the model
    before it is prepared; the `.tflite` row's writes a model Keras
    quantized in the mode that holds its integers, `tflite.keras_weights`).
    """

    name: str
    kind: str
    suffix: str | None
    runtime: str
    options: tuple[str, ...]
    writer: str | None = None
    ready: str | None = None
    verifier: str | None = None
    quantizes: bool = False
    folds_norm_affines: bool = False
    computes_in_half: bool = False
    streams: bool = True
    hints_half_constants: bool = False
    failure_hint: str | None = None
    signatures: tuple[str, ...] = ("serving_default",)
    other_suffixes: tuple[str, ...] = ()
    checks: str | None = None
    run: str | None = None
    for_model: str | None = None

    @property
    def is_directory(self):
        """The artifact is a directory (no suffix)."""
        return self.suffix is None

    @property
    def staged_suffix(self):
        """The suffix of the temporary the artifact is staged at."""
        return self.suffix or ""

    def load(self, field):
        """The function a `"module:function"` field names, imported now."""
        module, _, name = getattr(self, field).partition(":")
        return getattr(importlib.import_module(module), name)

    def suffix_of(self, path):
        """Which of the format's suffixes `path` ends in (None: none)."""
        path = os.fspath(path)
        for suffix in (self.suffix, *self.other_suffixes):
            if suffix is not None and path.endswith(suffix):
                return suffix
        return None

    def holds(self, artifact):
        """Whether `artifact` (a path) is laid out as this format's."""
        artifact = os.fspath(artifact)
        if self.suffix is not None:
            return artifact.endswith(self.suffix)
        return os.path.isdir(artifact)

    def target(self, path, version=None):
        """Where the artifact of `path` is written: `path` itself for a
        file (checked to end in the suffix), `<path>/<version>/` for a
        versioned directory (`version` None: one more than the highest
        version there, 1 in an empty directory)."""
        path = os.fspath(path)
        if self.suffix is not None:
            suffixes = " or ".join(repr(s) for s in (self.suffix, *self.other_suffixes))
            if self.suffix_of(path) is None:
                raise ValueError(
                    f"path should end in {suffixes} for format="
                    f"{self.name!r}. Received: path={path!r}"
                )
            if os.path.isdir(path):
                raise ValueError(
                    f"path is a directory: {path!r}. Give a {suffixes} file path."
                )
            return path
        other = tuple(
            s for f in FORMATS.values() for s in (f.suffix, *f.other_suffixes) if s
        )
        if os.path.isfile(path) or path.endswith((".keras", ".h5", *other)):
            raise ValueError(
                "path should be a directory (TF Serving's model base path). "
                f"Received: path={path!r}"
            )
        return os.path.join(path, str(_version(path, version)))


def _version(base, version):
    """`version` checked; None: one more than the highest in `base`."""
    if version is None:
        existing = [
            int(d)
            for d in (os.listdir(base) if os.path.isdir(base) else [])
            if d.isdigit()
        ]
        return max(existing, default=0) + 1
    return check_positive_int(version, "version")


LITERT = Format(
    name="litert",
    kind="tflite",
    suffix=".tflite",
    writer="kerasnorm.export.tflite.write:write_tflite",
    runtime="litert",
    options=SHARED_OPTIONS + TFLITE_OPTIONS,
    ready="kerasnorm.export.tflite.write:ready",
    quantizes=True,
    folds_norm_affines=True,
    hints_half_constants=True,
    failure_hint="kerasnorm.export.tflite.entry:with_entry_hint",
    for_model="kerasnorm.export.tflite.keras_weights:keras_quantized_options",
)
TF_SAVED_MODEL = Format(
    name="tf_saved_model",
    kind="saved_model",
    suffix=None,
    writer="kerasnorm.export.saved_model.write:write_artifact",
    runtime="tensorflow",
    options=(*SHARED_OPTIONS, "version"),
    ready="kerasnorm.export.verify.fresh:loader",
    computes_in_half=True,
)
# A generative file's (`to_litert_lm`).
LITERT_LM_OPTIONS = (
    "max_sequence_length",
    "prefill_lengths",
    "prefill_logits",
    "quantize",
    "int4_block_size",
    "tokenizer",
    "verify_inputs",
    "min_agreement",
    "smooth",
    "lora",
    "lora_rank",
    "overwrite",
    "verbose",
    # The bundle's (`litert_lm.bundle`).
    "start_token",
    "stop_tokens",
    "chat_template",
    "top_k",
    "top_p",
    "temperature",
    "progress",
    "drafter",
)
# A decoder LM's generative file (prefill and decode over key/value caches)
# or LiteRT-LM bundle, written and checked by generating (`to_litert_lm`).
# Its own run: the shared `prepare` derives what a generative export has
# none of (input specs, the fold, calibration, a streaming step) and the
# shared verifier compares one forward pass; the run refuses, takes the
# float copy, merges LoRA adapters while it writes, and stages with the
# stages' own functions (docs/design.md, "Formats").
LITERT_LM = Format(
    name="litert_lm",
    kind="litert_lm",
    suffix=".litertlm",
    other_suffixes=(".tflite",),
    runtime="generator",
    options=LITERT_LM_OPTIONS,
    ready="kerasnorm.export.litert_lm.export:ready",
    checks="kerasnorm.export.litert_lm.export:checked_options",
    run="kerasnorm.export.litert_lm.export:run_litert_lm",
    quantizes=True,
    streams=False,
    signatures=("prefill_<T>", "decode"),
)
# `.tflite` is the litert row's: it is first where a suffix is looked up.
FORMATS = {row.name: row for row in (LITERT, TF_SAVED_MODEL, LITERT_LM)}
EXPORT_FORMATS = tuple(FORMATS)


def format_named(name):
    """The row of `name`, Keras' name of the format."""
    row = FORMATS.get(name)
    if row is None:
        raise ValueError(
            f"format should be one of {EXPORT_FORMATS}. Received: format={name!r}"
        )
    return row


def format_of_artifact(artifact):
    """The row whose layout `artifact` (a path on disk) has: a suffix's
    file first, then a directory. A format that runs its own export
    (`Format.run`) is checked by it, not found here."""
    rows = [f for f in FORMATS.values() if f.run is None]
    for row in sorted(rows, key=lambda f: f.suffix is None):
        if row.holds(artifact):
            return row
    suffixes = " or ".join(f"a {f.suffix} file" for f in rows if f.suffix)
    raise ValueError(
        f"artifact should be {suffixes} or a SavedModel directory. "
        f"Received: artifact={os.fspath(artifact)!r}"
    )
