"""Stage 2 for SavedModel: the prepared model (or its streaming step) as a
SavedModel with one `serving_default` signature at `prepared.shapes`
(dynamic where they say None)."""

from __future__ import annotations

import keras
import tensorflow as tf

from kerasnorm.export.litert.convert import SIGNATURE_KEY
from kerasnorm.export.streaming.step import specs as step_specs
from kerasnorm.export.streaming.step import step_function


def write_saved_model(prepared, directory):
    """Write `prepared.exported` into `directory`, signature named by
    `prepared` (a streaming export: `x` and the states)."""
    exported = prepared.exported
    if prepared.streaming:
        serve = step_function(prepared.step)
        specs = step_specs(prepared.step, prepared.batch_size)
    else:
        specs = [
            tf.TensorSpec(shape, x.dtype, name=name)
            for x, name, shape in zip(
                prepared.inputs.tensors,
                prepared.inputs.names,
                prepared.shapes,
                strict=True,
            )
        ]
        serve = _serve(prepared)
    archive = keras.export.ExportArchive()
    archive.track(exported)
    archive.add_endpoint(SIGNATURE_KEY, serve, input_signature=specs)
    # The norm layers' hand-written gradients (and TensorFlow's own, such as
    # silu's) are saved with the graph: without them every load logs
    # "Importing a function ... with ops with unsaved custom gradients", and
    # a gradient through the loaded model (fine-tuning a served encoder)
    # fails. They cost a few KiB of graph per norm layer, no weights.
    archive.write_out(
        directory,
        verbose=False,
        options=tf.saved_model.SaveOptions(experimental_custom_gradients=True),
    )


def _serve(prepared):
    exported = prepared.exported
    inputs = prepared.inputs
    names = prepared.output_names

    def serve(*args):
        outputs = keras.tree.flatten(exported(inputs.pack(args), training=False))
        return dict(zip(names, outputs, strict=True))

    return serve
