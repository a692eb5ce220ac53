"""`export`, the one door: the format's row (`options.formats`), its
options checked once (`ExportOptions.build`), the artifact's place
(`Format.target`), then the one export run with the format's writer.
`to_tflite` and `to_saved_model` are its documented shortcuts."""

from __future__ import annotations

import os

import keras

from kerasnorm.export.options.export_options import ExportOptions
from kerasnorm.export.options.formats import format_named
from kerasnorm.export.pipeline.run import run_export


def export(
    model: keras.Model,
    path: str | os.PathLike,
    format: str = "tf_saved_model",
    **options,
):
    """Write `model` in `format`, verify it, and only then move it into place.

    Named as Keras' `Model.export(filepath, format=...)`: `format` is
    `"litert"` (a `.tflite` file with builtin ops, run with the LiteRT
    interpreter; `to_tflite` documents it) or `"tf_saved_model"` (a
    SavedModel at `<path>/<version>/`, also loaded in a fresh process;
    `to_saved_model` documents it) or `"litert_lm"` (a decoder LM's
    generative `.tflite` file or `.litertlm` bundle, checked by generating;
    `to_litert_lm` documents it). `kerasnorm.export.EXPORT_FORMATS` lists
    the formats; each takes the options its shortcut documents.

    Args:
        model: a built Keras model.
        path: where to write: a file ending in the format's suffix, or the
            base directory of a versioned one.
        format: `"litert"`, `"tf_saved_model"` or `"litert_lm"`.
            Defaults to `"tf_saved_model"`, as Keras'.
        **options: the format's options, as `to_tflite`, `to_saved_model`
            and `to_litert_lm` document them (each declared once, with its
            default); one the format does not take is refused
            (`TypeError`).

    Returns:
        What the format's shortcut returns: an `ExportResult`, or for
        `"litert_lm"` a `GenerativeExport`.
    """
    row = format_named(format)
    checked, target = opened(row, path, options)
    if row.run is not None:
        # The format writes, verifies and stages its artifact itself.
        return row.load("run")(model, checked, target)
    return run_export(model, checked, target, row.load("writer"))


def opened(row, path, options):
    """`(options checked, target)` of one export in `row`'s format: every
    option checked once (`ExportOptions.build`), the artifact's place
    (`Format.target`), the row's `ready` called before any work. `export`
    opens every format so; a format's shortcut that runs its own export
    (`to_litert_lm`) opens its row so, then calls its run."""
    checked = ExportOptions.build(row, **options)
    target = row.target(path, options.get("version"))
    if row.ready is not None:
        # Before the work: a runtime the check needs, or a process it uses.
        row.load("ready")()
    return checked, target
