"""Stage 2 for SavedModel: the prepared model (or its streaming step) as a
SavedModel with one `serving_default` signature at `prepared.shapes`
(dynamic where they say None)."""

from __future__ import annotations

import keras
import tensorflow as tf

from kerasnorm.export.model.op_layers import PROCESS_BOUND_OPS
from kerasnorm.export.model.op_layers import layer_list
from kerasnorm.export.model.op_layers import recording
from kerasnorm.export.naming.names import SIGNATURE_KEY
from kerasnorm.export.numerics.errors import ExportConversionError
from kerasnorm.export.streaming.step import specs as step_specs
from kerasnorm.export.streaming.step import step_function


def write_artifact(prepared, directory):
    """The format row's writer (`formats.TF_SAVED_MODEL`): the SavedModel,
    which computes no op in float by choice (no float ops to report)."""
    write_saved_model(prepared, directory)
    return ()


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
    # The traces are recorded with the layers creating each op, so that a
    # layer no other process can run is refused by name.
    with recording(exported) as ops:
        archive.add_endpoint(SIGNATURE_KEY, serve, input_signature=specs)
        # The norm layers' hand-written gradients (and TensorFlow's own,
        # such as silu's) are saved with the graph: without them every load
        # logs "Importing a function ... with ops with unsaved custom
        # gradients", and a gradient through the loaded model (fine-tuning
        # a served encoder) fails. They cost a few KiB of graph per norm
        # layer, no weights.
        archive.write_out(
            directory,
            verbose=False,
            options=tf.saved_model.SaveOptions(experimental_custom_gradients=True),
        )
    refuse_process_bound(ops, "a SavedModel")


def refuse_process_bound(ops, what):
    """Raise ExportConversionError naming the layers of a recorded trace
    (`model.op_layers`) that call back into this Python process
    (`tf.py_function`, `tf.numpy_function`): in any other process, a
    server's, the callback does not exist."""
    found = ops.layers_using(PROCESS_BOUND_OPS)
    if not found:
        return
    layers = list(dict.fromkeys(x for xs in found.values() for x in xs))
    one = len(layers) == 1
    raise ExportConversionError(
        f"Cannot export {'layer' if one else 'layers'} {layer_list(layers)} "
        f"as {what}: {'it calls' if one else 'they call'} "
        f"tf.py_function / tf.numpy_function ({', '.join(sorted(found))}), a "
        "callback into this Python process that no other process (TF Serving, "
        "a phone) has; write the layer with TensorFlow or keras.ops "
        "operations."
    )


def _serve(prepared):
    exported = prepared.exported
    inputs = prepared.inputs
    names = prepared.output_names

    def serve(*args):
        outputs = keras.tree.flatten(exported(inputs.pack(args), training=False))
        return dict(zip(names, outputs, strict=True))

    return serve
