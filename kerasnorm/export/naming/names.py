"""Signature names: the one rule both artifacts (SavedModel and `.tflite`)
name their inputs and outputs by.

- Inputs: a dict-input model's keys; else each `keras.Input`'s name. A name
  Keras or tf_keras generated (`keras_tensor[_<n>]`, `input_layer[_<n>]`,
  tf_keras' `input_<n>`; a plain `input` is the user's) says nothing and
  changes when the model is rebuilt from its config, so such an input is
  `input_<i>`, `i` its position in `keras.tree.flatten` order of the
  model's inputs.
- Outputs: a dict-output model's keys; else the name of the layer that
  computes each output (a Sequential's last layer).
- Names are made safe (letters, digits, `_`); when two names of one side
  coincide, that side is numbered `input_<i>` / `output_<i>` throughout.
- A streaming step takes `x` (one frame) and `state_<layer>_<i>`, and gives
  `output_<i>` and the new states under the same names.
"""

from __future__ import annotations

import re

from kerasnorm._compat import functional_of

# The one signature every artifact carries (the SavedModel's, the `.tflite`
# file's), named as TF Serving's default.
SIGNATURE_KEY = "serving_default"
# A streaming step's frame input and the prefix of its state inputs/outputs.
FRAME = "x"
STATE_PREFIX = "state_"
_GENERATED = re.compile(r"(keras_tensor|input_layer)(_\d+)?|input_\d+")


def fallback_input_name(index: int) -> str:
    """The signature name of an input the model gives no usable name."""
    return f"input_{index}"


def safe_name(name):
    """`name` as a signature or tensor name: letters, digits and `_` only."""
    return re.sub(r"[^A-Za-z0-9_]", "_", str(name)).strip("_")


def input_names(model):
    """The signature names of `model`'s inputs, in `keras.tree.flatten`
    order of its input structure (the module docstring has the rule)."""
    graph = functional_of(model)
    structure = graph.input if graph is not None else model.inputs
    if isinstance(structure, dict):
        names = [safe_name(key) for key in sorted(structure)]
    else:
        names = [
            "" if _GENERATED.fullmatch(safe_name(x.name)) else safe_name(x.name)
            for x in model.inputs
        ]
        names = [name or fallback_input_name(i) for i, name in enumerate(names)]
    return names if _distinct(names) else _numbered("input", names)


def output_names(model):
    """The signature names of `model`'s outputs, in `keras.tree.flatten`
    order (the module docstring has the rule)."""
    graph = functional_of(model)  # a Sequential's own `output` may be unset
    structure = graph.output if graph is not None else None
    if isinstance(structure, dict):
        names = [safe_name(key) for key in sorted(structure)]
    else:
        # Functional models (Keras 3 and tf_keras) name their output layers;
        # a Keras 3 Sequential has one output, its last layer's.
        layers = getattr(model, "output_names", None) or [model.layers[-1].name]
        names = [safe_name(name) for name in layers]
    return names if _distinct(names) else _numbered("output", names)


def step_output_names(count):
    """The signature names of a streaming step's `count` outputs."""
    return [f"output_{i}" for i in range(count)]


def state_name(layer_name, index):
    """The signature name of a recurrent layer's `index`-th state."""
    return f"{STATE_PREFIX}{safe_name(layer_name)}_{index}"


def _distinct(names):
    return all(names) and len(set(names)) == len(names)


def _numbered(prefix, names):
    return [f"{prefix}_{i}" for i in range(len(names))]
