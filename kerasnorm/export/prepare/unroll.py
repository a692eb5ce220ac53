"""The unrolled copy a full-integer TFLite export converts.

TFLite's full-integer calibration crashes the process on a recurrent layer
that runs as a loop (a `WHILE` op). The same layer with `unroll=True` and the
same weights computes the same function with one copy of the cell per time
step, which converts. `unroll_rolled_loops` makes that copy of the model;
and refuses what it cannot unroll (a tf_keras QAT model).
"""

from __future__ import annotations

import keras

from kerasnorm._compat import input_tensors_of_calls
from kerasnorm.export.inputs.data import InputSpec
from kerasnorm.export.model.facts import rolled_recurrent_layers
from kerasnorm.export.numerics.precision import rebuilt_with_weights
from kerasnorm.export.options.modes import MAX_UNROLL_STEPS


def unroll_rolled_loops(model, mode, loops, max_steps=MAX_UNROLL_STEPS, shapes=None):
    """`(model, names)`: for a full-integer `mode` (`modes.Mode`), a copy of
    `model` with every rolled recurrent layer built with `unroll=True` (same
    weights, the user's model untouched) and the names of the layers it
    unrolled; else `model` itself and `()`. `shapes` are the file's input
    shapes (`shapes.file_shapes`): a sequence length the model leaves
    undefined and `input_signature` fixes is the copy's Inputs' length.

    Raises ValueError naming the layer when its sequence length is undefined
    or above `max_steps`, when the model cannot be rebuilt from its config,
    or when it is a tf_keras (QAT) model with a rolled loop: TFLite's
    full-integer calibration kills the Python process (a segmentation fault,
    tensorflow 2.21) on a recurrent layer that runs as a loop, Keras' own
    LSTM included, and a QAT model is not rebuilt here (`quantize_aware`
    refuses rolled loops already). `loops` is
    `model.rolled_recurrent_layers(model)`, which the caller has derived.
    """
    if not mode.calibrates:
        return model, ()
    quantize = mode.name
    loops = list(dict.fromkeys(loops))
    if not loops:
        return model, ()
    if not isinstance(model, keras.Model):
        names = ", ".join(repr(layer.name) for layer in loops)
        raise ValueError(
            f"quantize={quantize!r} cannot convert a recurrent layer that runs as a "
            "loop: TFLite's int8 calibration crashes the process on it. "
            f"Received: layer(s) {names}. Export it "
            'with quantize="dynamic" or "float16", or build the layer with '
            "unroll=True for a fixed sequence length."
        )
    names = tuple(layer.name for layer in loops)
    fixed = _fixed_inputs(model, shapes)
    if fixed and any(sequence_length(layer) is None for layer in loops):
        model = rebuilt_with_weights(model, lambda c: _with_input_shapes(c, fixed))
        loops = list(dict.fromkeys(rolled_recurrent_layers(model)))
    for layer in loops:
        steps = sequence_length(layer)
        if steps is None:
            raise ValueError(
                f"quantize={quantize!r} unrolls recurrent layer {layer.name!r} "
                "(TFLite's full-integer calibration crashes on a rolled loop) "
                "into one copy of its cell per time step, which needs a fixed "
                "sequence length; its input has an undefined time dimension "
                f"({_shape_text(layer)}). Fix it for the file with "
                f"{_signature_hint(model)} (T the longest sequence, at most "
                f"max_unroll_steps={max_steps}; pad shorter ones), or export "
                'with quantize="dynamic" or "float16", which keep the length '
                "dynamic."
            )
        if steps > max_steps:
            raise ValueError(
                f"quantize={quantize!r} would unroll recurrent layer "
                f"{layer.name!r} over {steps} time steps, more than "
                f"max_unroll_steps={max_steps}: the converter's time and the "
                "file's size grow with every unrolled step. Pass "
                f"max_unroll_steps={steps} (or more) to unroll it anyway, or "
                'export it with quantize="dynamic" or "float16".'
            )
    try:
        copy = rebuilt_with_weights(model, _unrolled_config)
    except Exception as err:
        raise ValueError(
            f"quantize={quantize!r} needs recurrent layer(s) "
            f"{', '.join(map(repr, names))} unrolled, and the model could not "
            f"be rebuilt from its config to do that ({type(err).__name__}: "
            f"{str(err)[:300]}). Build the layer(s) with unroll=True, or export "
            'with quantize="dynamic" or "float16".'
        ) from err
    return copy, names


def _fixed_inputs(model, shapes):
    """{Input layer name: batch shape} for the inputs whose file shape fixes
    a dimension the model leaves undefined (batch aside); a Sequential's one
    Input is `None` (its config names it, its `layers` do not hold it)."""
    if not shapes:
        return {}
    layers = {
        id(layer.output): layer.name
        for layer in model.layers
        if isinstance(layer, keras.layers.InputLayer)
    }
    fixed = {}
    for x, shape in zip(InputSpec.of(model).tensors, shapes, strict=True):
        pairs = zip(tuple(x.shape)[1:], shape[1:], strict=True)
        if any(a is None and b is not None for a, b in pairs):
            name = layers.get(id(x))
            if name is None and not isinstance(model, keras.Sequential):
                continue  # not found: the refusal below names the layer
            fixed[name] = [None, *shape[1:]]
    return fixed


def _with_input_shapes(config, fixed):
    """A serialized model whose `InputLayer`s named in `fixed` take those
    batch shapes."""
    if isinstance(config, list):
        return [_with_input_shapes(v, fixed) for v in config]
    if not isinstance(config, dict):
        return config
    inner = config.get("config")
    if config.get("class_name") == "InputLayer" and isinstance(inner, dict):
        name = inner.get("name") if inner.get("name") in fixed else None
        if name in fixed:
            return {**config, "config": {**inner, "batch_shape": fixed[name]}}
    return {k: _with_input_shapes(v, fixed) for k, v in config.items()}


def _signature_hint(model):
    """`input_signature={...}` with each input's undefined time axis `T`."""
    spec = InputSpec.of(model)
    parts = []
    for x, name in zip(spec.tensors, spec.names, strict=True):
        dims = ["None", *("T" if d is None else str(d) for d in x.shape[1:])]
        parts.append(f"{name!r}: ({', '.join(dims)})")
    return f"input_signature={{{', '.join(parts)}}}"


def _unrolled_config(config):
    if isinstance(config, dict):
        return {
            k: True if k == "unroll" and v is False else _unrolled_config(v)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [_unrolled_config(v) for v in config]
    return config


def sequence_length(layer):
    """The time dimension of `layer`'s (first) input; None when undefined or
    unknown."""
    shape = _input_shape(layer)
    if shape is None or len(shape) < 3:
        return None
    return shape[1]


def _input_shape(layer):
    for tensors in input_tensors_of_calls(layer):
        if tensors:
            return tuple(tensors[0].shape)
    build = layer.get_build_config() or {}
    shape = build.get("input_shape")
    if shape and not isinstance(shape[0], (list, tuple)):
        return tuple(shape)
    return None


def _shape_text(layer):
    shape = _input_shape(layer)
    return "shape unknown" if shape is None else f"shape {shape}"
