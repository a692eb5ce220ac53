"""What every export step asks of a model: is it one, is it built, what are
its layers and graph (`ModelFacts`, derived once per export), and a graph
model around a subclassed one."""

from __future__ import annotations

import collections.abc
import dataclasses
import sys

import keras
import numpy as np

from kerasnorm._compat import functional_of


def is_tf_keras_model(model) -> bool:
    """Whether `model` is a `tf_keras` (Keras 2) model, such as the QAT model
    `quantize_aware` returns; `tf_keras` is not imported for the answer."""
    tf_keras = sys.modules.get("tf_keras")
    return tf_keras is not None and isinstance(model, tf_keras.Model)


def check_model(model, *, needs_graph: bool = False) -> None:
    """Refuse a non-model, an unbuilt model and, with `needs_graph`, a model
    whose graph is unknown (subclassed): what no exporter or fold can take."""
    if not isinstance(model, keras.Model) and not is_tf_keras_model(model):
        raise ValueError(f"Expected a keras.Model. Received: model={model!r}")
    if needs_graph and model.built and functional_of(model) is None:
        raise ValueError(
            "fold_batchnorm needs a Functional or Sequential model (a "
            f"subclassed model's graph is not known). Received: {model.name!r} "
            f"of type {type(model).__name__}; export it with fold=False."
        )
    if not model.built or not getattr(model, "inputs", None):
        raise ValueError(
            f"Model {model.name!r} is not built: give it an Input (or call "
            "`model.build(input_shape)`) before exporting."
        )


def all_layers(model):
    """Every layer of `model`, nested models' layers included."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from all_layers(layer)


def is_graph_model(op):
    """Whether `op` is a model whose graph is known (Functional, Sequential)."""
    return isinstance(op, keras.Model) and functional_of(op) is not None


def rolled_recurrent_layers(layer):
    """The outermost layers inside `layer` that run a rolled recurrent loop:
    recurrent layers with `unroll=False`, and the wrappers (Bidirectional,
    TimeDistributed, TFMOT's) around one; models are searched, Keras 3 and
    tf_keras alike."""
    if _is_rolled(layer):
        yield layer
        return
    for child in getattr(layer, "layers", None) or []:
        yield from rolled_recurrent_layers(child)


def _is_rolled(layer):
    if getattr(layer, "unroll", True) is False and hasattr(layer, "cell"):
        return True
    inner = [
        getattr(layer, n, None) for n in ("layer", "forward_layer", "backward_layer")
    ]
    # A Keras 3 or tf_keras layer has a config; other attributes are not layers.
    return any(hasattr(child, "get_config") and _is_rolled(child) for child in inner)


def has_recurrent_layer(model):
    """Whether `model` holds a recurrent layer (rolled or unrolled, or a
    wrapper around one), Keras 3 or tf_keras."""
    return any(_is_recurrent(layer) for layer in all_layers(model))


def _is_recurrent(layer):
    if hasattr(layer, "cell") and hasattr(layer, "return_sequences"):
        return True
    inner = [
        getattr(layer, n, None) for n in ("layer", "forward_layer", "backward_layer")
    ]
    return any(hasattr(c, "get_config") and _is_recurrent(c) for c in inner)


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What an export asks of one model's layers, derived once
    (`model_facts`): every layer (`all_layers`), the rolled recurrent ones
    (`rolled_recurrent_layers`), whether any layer is recurrent
    (`has_recurrent_layer`), and whether it is a tf_keras (QAT) model."""

    layers: tuple
    rolled: tuple
    recurrent: bool
    qat: bool


def model_facts(model) -> ModelFacts:
    """The `ModelFacts` of a checked model (`check_model`)."""
    layers = tuple(all_layers(model))
    return ModelFacts(
        layers=layers,
        rolled=tuple(rolled_recurrent_layers(model)),
        recurrent=any(_is_recurrent(layer) for layer in layers),
        qat=is_tf_keras_model(model),
    )


def input_structure(model):
    """The model's input structure (a Sequential's own `input` is undefined
    until the Sequential is called)."""
    return functional_of(model).input


def as_graph_model(model, data=None, *, fold=False, argument="verify_inputs"):
    """`model`, or for a built subclassed model a Functional model around it.

    A subclassed model has no `inputs`, so the wrapper's Inputs (named
    `input_0`, `input_1`, ... in call order) take their non-batch shapes and
    dtypes by one rule: from `data` (the Python argument `argument`) when it
    is an array or a list/tuple of arrays in call order; else from the
    shapes the model was built with (float, its input dtype), and a
    `tf.data.Dataset` given as `data` is then read against those. A mapping
    (a dict, an `.npz` archive) is refused: a subclassed model's inputs have
    no names to look it up by. The wrapper computes what `model` computes:
    `model` is its one layer. With `fold`, a subclassed model is refused the
    way `fold_batchnorm` refuses it (its graph, and so its BatchNorms, are
    not known).
    """
    if (
        not isinstance(model, keras.Model)
        or is_tf_keras_model(model)
        or functional_of(model) is not None
        or not model.built
    ):
        return model
    if fold:
        check_model(model, needs_graph=True)
    if isinstance(data, collections.abc.Mapping):
        raise ValueError(
            f"Model {model.name!r} is subclassed: its inputs have no names, so "
            f"{argument} cannot be a mapping (received keys {sorted(data)}). "
            "Pass an array, or a list of arrays in the order its call takes them."
        )
    if data is not None and not hasattr(data, "as_numpy_iterator"):
        arrays = [
            np.asarray(a) for a in (data if isinstance(data, (list, tuple)) else [data])
        ]
        specs = [(a.shape, keras.backend.standardize_dtype(a.dtype)) for a in arrays]
    else:
        build = model.get_build_config() or {}
        shapes = (
            [build["input_shape"]]
            if "input_shape" in build
            else list(build.get("shapes_dict", {}).values())
        )
        if not shapes or any(s is None for s in shapes):
            given = (
                ""
                if data is None
                else f", and a dataset given as {argument} gives none"
            )
            raise ValueError(
                f"Model {model.name!r} is subclassed and records no input "
                f"shape{given}: pass verify_inputs= (an array, or a list of "
                "arrays in call order, that it runs on) to export it."
            )
        specs = [(tuple(s), model.input_dtype) for s in shapes]
    inputs = [
        keras.Input(batch_shape=(None, *shape[1:]), dtype=dtype, name=f"input_{i}")
        for i, (shape, dtype) in enumerate(specs)
    ]
    outputs = model(inputs[0] if len(inputs) == 1 else inputs, training=False)
    return keras.Model(inputs, outputs, name=model.name)
