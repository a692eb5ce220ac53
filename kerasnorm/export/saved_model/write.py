"""Stage 2 for SavedModel: the prepared model (or its streaming step) as a
SavedModel with one `serving_default` signature, dynamic batch."""

from __future__ import annotations

import keras
import tensorflow as tf

from kerasnorm.export import litert
from kerasnorm.export.streaming.step import specs as step_specs
from kerasnorm.export.streaming.step import step_function


def write_saved_model(prepared, directory):
    """Write `prepared.exported` into `directory`, signature named by
    `prepared` (a streaming export: `x` and the states)."""
    exported = prepared.exported
    if prepared.streaming:
        serve = step_function(prepared.step)
        specs = step_specs(prepared.step, None)
    else:
        specs = [
            tf.TensorSpec((None, *x.shape[1:]), x.dtype, name=name)
            for x, name in zip(
                prepared.inputs.tensors, prepared.input_names, strict=True
            )
        ]
        serve = _serve(prepared)
    archive = keras.export.ExportArchive()
    archive.track(exported)
    archive.add_endpoint(litert.SIGNATURE_KEY, serve, input_signature=specs)
    # Serving never differentiates: the norm layers' hand-written gradients
    # (tf.custom_gradient) stay out of the SavedModel.
    archive.write_out(
        directory,
        verbose=False,
        options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
    )


def _serve(prepared):
    exported = prepared.exported
    inputs = prepared.inputs
    names = prepared.output_names

    def serve(*args):
        outputs = keras.tree.flatten(exported(inputs.pack(args), training=False))
        return dict(zip(names, outputs, strict=True))

    return serve
