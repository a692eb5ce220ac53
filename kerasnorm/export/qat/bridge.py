"""`to_tf_keras`: a Keras 3 model rebuilt as a `tf_keras` model with the
same weights, the bridge to TFMOT's quantization-aware training.

TFMOT 0.8.1 quantizes `tf_keras` (Keras 2) models only. `quantize_aware`
takes a `tf_keras` model (kerasnorm layers from `kerasnorm.legacy.layers`)
or a Keras 3 model, which it first rebuilds as a `tf_keras` model with the
same weights (`to_tf_keras`), and returns TFMOT's QAT model.

TFMOT and `tf_keras` are imported here only inside the functions: importing
TFMOT sets `TF_USE_LEGACY_KERAS=1` for the process, which must not happen to
a user who only imports `kerasnorm.export` (docs/guides/qat.md).
"""

from __future__ import annotations

import inspect

import keras

from kerasnorm import blocks
from kerasnorm import norms
from kerasnorm import recurrent
from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.export.inputs.data import InputSpec
from kerasnorm.export.inputs.data import inputs_to_check
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.facts import check_model
from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.numerics.metrics import REBUILD_TOLERANCE
from kerasnorm.export.numerics.metrics import relative_error
from kerasnorm.export.numerics.precision import rebuild

# Keras 3 layers the bridge rebuilds as the `tf_keras` layer of the same name
# from the same config; kerasnorm layers map to `kerasnorm.legacy.layers`.
BRIDGED_LAYERS = (
    "Activation",
    "Add",
    "AveragePooling1D",
    "AveragePooling2D",
    "BatchNormalization",
    "Concatenate",
    "Conv1D",
    "Conv2D",
    "Dense",
    "DepthwiseConv2D",
    "Dropout",
    "Flatten",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "MaxPooling1D",
    "MaxPooling2D",
    "ReLU",
    "Reshape",
)
_MERGE_LAYERS = ("Add", "Concatenate")
# Keras 3 config entries `tf_keras` does not know; refused unless at these
# values (a LoRA-enabled or quantized Dense computes something else).
_KERAS3_ONLY = {"lora_rank": None, "lora_alpha": None, "quantization_config": None}
_OBJECT_MODULES = ("keras.initializers", "keras.regularizers", "keras.constraints")
QAT_EXTRA = (
    "Quantization-aware training needs tensorflow-model-optimization and "
    "tf-keras: install kerasnorm's `qat` extra (pip install 'kerasnorm[qat]')."
)


def to_tf_keras(
    model: keras.Model,
    *,
    verify_inputs=None,
    tolerance: float = REBUILD_TOLERANCE,
):
    """Rebuild a Keras 3 model as a `tf_keras` model with the same weights.

    Each layer becomes the `tf_keras` layer of the same class and config
    (`BRIDGED_LAYERS`), or its `kerasnorm.legacy.layers` twin; the graph
    (shared layers, several inputs and outputs) is kept. The copy is run
    against the original before it is returned.

    Args:
        model: a built Keras 3 Functional or Sequential model; under a
            `mixed_float16` / `mixed_bfloat16` policy it is first rebuilt in
            float32 with the same weights, and the copy is checked against
            that rebuild (the model itself is left as it is).
        verify_inputs: inputs for the parity check (an array, a list in
            `model.inputs` order, or a dict by input name). Defaults to 8
            random samples (`fold_batchnorm` says how they are made).
        tolerance: the largest allowed max |tf_keras - keras| / max |keras|.
            Defaults to `1e-5`.

    Returns:
        The `tf_keras.Model`.

    Raises:
        ImportError: `tf_keras` is not installed.
        ValueError: the model is subclassed, or a layer has no `tf_keras`
            counterpart (the message names it).
        ExportVerificationError: the copy's outputs differ by more than
            `tolerance`.
    """
    try:
        import tf_keras
    except ImportError as err:
        raise ImportError(f"{QAT_EXTRA} ({err})") from err
    graph = functional_of(model)
    if graph is None:
        raise ValueError(
            "Only Functional and Sequential Keras 3 models can be rebuilt as "
            f"tf_keras models. Received: model={model!r} of type "
            f"{type(model).__name__}"
        )
    # A mixed-precision model is bridged from its float32 copy: QAT and the
    # int8 file it leads to compute in float32 and int8.
    rebuilt = rebuild(model, layers=all_layers(model))
    if rebuilt is not None:
        model = rebuilt.copy
        graph = functional_of(model)
    check_model(model)
    nodes = graph_nodes(graph)
    twins = {}
    for node in nodes:
        if id(node.operation) not in twins:
            twins[id(node.operation)] = (node.operation, _twin(node.operation))
    tensors = {}
    inputs = []
    for x in graph.inputs:
        inputs.append(
            tf_keras.Input(shape=tuple(x.shape[1:]), dtype=x.dtype, name=x.name)
        )
        tensors[id(x)] = inputs[-1]
    for node in nodes:
        outputs = _call(twins[id(node.operation)][1], node, tensors)
        for x, y in zip(node.outputs, keras.tree.flatten(outputs), strict=True):
            tensors[id(x)] = y
    outputs = [tensors[id(x)] for x in keras.tree.flatten(graph.outputs)]
    rebuilt = tf_keras.Model(
        inputs, outputs if len(outputs) > 1 else outputs[0], name=model.name
    )
    for source, twin in twins.values():
        twin.set_weights(source.get_weights())
    _check_parity(model, rebuilt, verify_inputs, tolerance)
    return rebuilt


def _call(twin, node, tensors):
    """Call `twin` on the `tf_keras` tensors of `node`'s inputs, as the Keras
    3 layer was called: tensors given by keyword (an RNN's `initial_state`)
    by keyword, the others positionally (a decoder block's encoder sequence
    is its second positional argument)."""
    kwargs = _map_tensors(node.kwargs, tensors)
    keyword = len(_keras_tensors(node.kwargs))
    args = [tensors[id(x)] for x in node.inputs[: len(node.inputs) - keyword]]
    if type(node.operation).__name__ in _MERGE_LAYERS:
        return twin(args, **kwargs)
    return twin(*args, **kwargs)


def _keras_tensors(value):
    if isinstance(value, keras.KerasTensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _keras_tensors(item)]
    return []


def _map_tensors(value, tensors):
    if isinstance(value, keras.KerasTensor):
        return tensors[id(value)]
    if isinstance(value, dict):
        return {k: _map_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, tensors) for v in value)
    return value


def _kerasnorm_class_name(layer):
    """The name of `layer`'s class if it is a public kerasnorm layer (not a
    subclass, whose `call` the twin would not run), else None."""
    name = type(layer).__name__
    for module in (norms, recurrent, blocks):
        if getattr(module, name, None) is type(layer):
            return name
    return None


def _twin(layer):
    """The unbuilt `tf_keras` layer computing what the Keras 3 `layer` does."""
    import tf_keras

    from kerasnorm.legacy import layers as legacy

    name = type(layer).__name__
    kerasnorm_name = _kerasnorm_class_name(layer)
    if kerasnorm_name is not None:
        twin_class = getattr(legacy, kerasnorm_name)
        config = _tf_keras_config(layer, tf_keras)
        # Wrappers: the inner layer is rebuilt first, through the same
        # bridge, and passed to the constructor, as a user would.
        if kerasnorm_name == "WeightNorm":
            del config["layer"]
            return twin_class(_twin(layer.layer), **config)
        if kerasnorm_name == "NormResidual":
            del config["sublayer"]
            return twin_class(_twin(layer.sublayer), **config)
        return twin_class.from_config(config)
    if type(layer) is keras.layers.RNN:
        if _kerasnorm_class_name(layer.cell) is None:
            raise ValueError(
                f"Layer {layer.name!r} (keras.layers.RNN) runs a "
                f"{type(layer.cell).__name__} cell; the bridge rebuilds "
                "keras.layers.RNN around kerasnorm's LayerNormSimpleRNNCell, "
                "LayerNormLSTMCell and LayerNormGRUCell only."
            )
        config = _tf_keras_config(layer, tf_keras)
        del config["cell"]
        return tf_keras.layers.RNN(_twin(layer.cell), **config)
    if not (type(layer).__module__.startswith("keras.") and name in BRIDGED_LAYERS):
        raise ValueError(
            f"Layer {layer.name!r} ({type(layer).__module__}.{name}) has no "
            "tf_keras counterpart kerasnorm can rebuild it as; quantize_aware "
            "supports " + ", ".join(BRIDGED_LAYERS) + ", keras.layers.RNN "
            "around a kerasnorm cell, and every layer of kerasnorm.layers. "
            "Build the model with tf_keras and kerasnorm.legacy.layers instead."
        )
    return getattr(tf_keras.layers, name).from_config(_tf_keras_config(layer, tf_keras))


def _tf_keras_config(layer, tf_keras):
    """`layer`'s config as `tf_keras` reads it: Keras-3-only entries refused
    unless unset, initializers, regularizers and constraints converted."""
    config = _config(layer)
    for key, default in _KERAS3_ONLY.items():
        value = config.pop(key, default)
        if value != default:
            raise ValueError(
                f"Layer {layer.name!r} ({type(layer).__name__}) uses "
                f"{key}={value!r}, which tf_keras layers do not support."
            )
    return {k: _tf_keras_object(v, layer, tf_keras) for k, v in config.items()}


def _config(layer):
    """The layer's config with the dtype policy as its name, which both
    Keras generations read."""
    return {**layer.get_config(), "dtype": layer.dtype_policy.name}


def _tf_keras_object(value, layer, tf_keras):
    """A serialized Keras 3 initializer, regularizer or constraint as
    `tf_keras` reads it: Keras 3 added arguments (an initializer's
    `input_axes`), which are dropped when unset and refused otherwise."""
    module = value.get("module") if isinstance(value, dict) else None
    if module not in _OBJECT_MODULES:
        return value
    kind = getattr(tf_keras, module.split(".")[1])
    known = inspect.signature(type(kind.get(value["class_name"]))).parameters
    config = {}
    for key, item in value["config"].items():
        if key in known:
            config[key] = item
        elif item is not None:
            raise ValueError(
                f"Layer {layer.name!r} uses {value['class_name']} with "
                f"{key}={item!r}, which tf_keras does not support."
            )
    return {**value, "config": config}


def _check_parity(model, rebuilt, verify_inputs, tolerance):
    spec = InputSpec.of(model)
    inputs, _ = inputs_to_check(model, verify_inputs, layers=list(all_layers(model)))
    expected = keras.tree.flatten(model(spec.pack(inputs), training=False))
    # The tf_keras copy takes a list (or one tensor) in `model.inputs` order.
    feed = inputs if len(inputs) > 1 else inputs[0]
    got = keras.tree.flatten(rebuilt(feed, training=False))
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        error = relative_error(e, g)
        if error > tolerance:
            raise ExportVerificationError(
                f"The tf_keras rebuild of {model.name!r} differs from it in "
                f"output {i}: max |tf_keras - keras| / max |keras| = "
                f"{error:.3e} > tolerance={tolerance:g}."
            )
