"""Quantization-aware training with tensorflow-model-optimization (TFMOT).

TFMOT 0.8.1 quantizes `tf_keras` (Keras 2) models only. `quantize_aware`
takes a `tf_keras` model (kerasnorm layers from `kerasnorm.legacy.layers`)
or a Keras 3 model, which it first rebuilds as a `tf_keras` model with the
same weights (`to_tf_keras`), and returns TFMOT's QAT model.

TFMOT and `tf_keras` are imported here only inside the functions: importing
TFMOT sets `TF_USE_LEGACY_KERAS=1` for the process, which must not happen to
a user who only imports `kerasnorm.export` (docs/qat.md).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence

import keras

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.export import _artifacts
from kerasnorm.export import _mixed_precision
from kerasnorm.export import _model
from kerasnorm.export import _parity
from kerasnorm.export._arguments import UNSET
from kerasnorm.export._arguments import renamed
from kerasnorm.export._artifacts import ExportVerificationError
from kerasnorm.export._model import is_tf_keras_model
from kerasnorm.export._tflite import recurrent_loops

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
_QAT_EXTRA = (
    "Quantization-aware training needs tensorflow-model-optimization and "
    "tf-keras: install kerasnorm's `qat` extra (pip install 'kerasnorm[qat]')."
)


def import_tfmot():
    """TFMOT, imported without leaving `TF_USE_LEGACY_KERAS` set.

    TFMOT sets the variable on import to pick `tf_keras` for itself. Left
    set, it would make `tf.keras` mean `tf_keras` in this process from then
    on, and in every subprocess; TFMOT needs it only while it loads.
    """
    saved = os.environ.get("TF_USE_LEGACY_KERAS")
    try:
        import tensorflow_model_optimization as tfmot
        import tf_keras  # noqa: F401
    except ImportError as err:
        raise ImportError(f"{_QAT_EXTRA} ({err})") from err
    finally:
        if saved is None:
            os.environ.pop("TF_USE_LEGACY_KERAS", None)
        else:
            os.environ["TF_USE_LEGACY_KERAS"] = saved
    return tfmot


def quantize_aware(
    model,
    *,
    keep_float: Sequence[str] = (),
    verify_inputs=None,
    tolerance: float = _parity.REBUILD_TOLERANCE,
    check_inputs=UNSET,
):
    """A TFMOT quantization-aware-training copy of `model`, as `tf_keras`.

    Every layer gets a TFMOT `QuantizeConfig`: TFMOT's own for core layers
    (Conv+BatchNorm+ReLU patterns are folded by TFMOT's transforms), and for
    kerasnorm's norm layers one that quantizes the output and keeps the
    statistics and `gamma`/`beta` float (`NormOutputQuantizeConfig`;
    docs/qat.md says why). Layers named in `keep_float` are not quantized in
    training at all (`FloatQuantizeConfig`).

    Compile and fine-tune the result with `tf_keras` optimizers and losses,
    then export it with `to_tflite(qat_model, path, quantize="int8",
    representative_data=...)`.

    Args:
        model: a built `tf_keras` Functional or Sequential model, or a Keras 3
            one made of the layers in `BRIDGED_LAYERS` and kerasnorm layers;
            a Keras 3 model is rebuilt with `to_tf_keras` first. Recurrent
            layers, `NormResidual` and the transformer blocks are kept float
            in training (`FloatQuantizeConfig`); recurrent layers must have
            `unroll=True`. A `mixed_float16` / `mixed_bfloat16` model is
            bridged from its float32 copy (`to_tf_keras`).
        keep_float: names of kerasnorm norm layers to leave unquantized in
            training. Defaults to `()`.
        verify_inputs: inputs for `to_tf_keras`'s parity check (Keras 3
            models only). Defaults to 8 random samples.
        tolerance: the parity tolerance of `to_tf_keras`. Defaults to `1e-5`.
        check_inputs: deprecated alias of `verify_inputs` (warns).

    Returns:
        The uncompiled `tf_keras` QAT model.

    Raises:
        ImportError: TFMOT or `tf_keras` is not installed (names the `qat`
            extra).
        ValueError: a layer has no `tf_keras` counterpart or no
            quantization support (named), a recurrent layer has
            `unroll=False`, or `keep_float` names no kerasnorm norm layer of
            the model.
        ExportVerificationError: the rebuilt `tf_keras` model does not
            reproduce the Keras 3 model.
    """
    verify_inputs = renamed(
        "quantize_aware", "verify_inputs", verify_inputs, "check_inputs", check_inputs
    )
    tfmot = import_tfmot()
    from kerasnorm.legacy import layers as legacy
    from kerasnorm.legacy import quantize_configs

    if not is_tf_keras_model(model):
        model = to_tf_keras(model, verify_inputs=verify_inputs, tolerance=tolerance)
    norm_classes = (
        legacy.LayerNorm,
        legacy.RMSNorm,
        legacy.GroupNorm,
        legacy.InstanceNorm,
        legacy.WeightNorm,
    )
    float_classes = _float_classes(legacy)
    norms = {layer.name for layer in model.layers if isinstance(layer, norm_classes)}
    unknown = sorted(set(keep_float) - norms)
    if unknown:
        raise ValueError(
            "keep_float names layers that are not kerasnorm norm layers of "
            f"the model ({sorted(norms)}). Received: keep_float={list(keep_float)}"
        )
    # Measured with TF 2.21: converting the time loop of a QAT model to int8
    # kills the process (docs/qat.md); refused here, before training, with
    # the same search `to_tflite` uses.
    loop = next(recurrent_loops(model), None)
    if loop is not None:
        raise ValueError(
            f"Layer {loop.name!r} ({type(loop).__name__}) runs its time "
            "loop as a while loop, which the TFLite converter cannot "
            "convert to int8 after QAT (it crashes). Build it with "
            "unroll=True and a fixed sequence length. Received: "
            f"unroll={loop.unroll}"
        )
    quantize = tfmot.quantization.keras

    def annotate(layer):
        if isinstance(layer, norm_classes):
            config = (
                quantize_configs.FloatQuantizeConfig()
                if layer.name in keep_float
                else quantize_configs.NormOutputQuantizeConfig()
            )
            return quantize.quantize_annotate_layer(layer, quantize_config=config)
        if _is_float_layer(layer, float_classes):
            # Kept float in training: docs/qat.md, "Recurrent layers and
            # blocks".
            return quantize.quantize_annotate_layer(
                layer, quantize_config=quantize_configs.FloatQuantizeConfig()
            )
        return quantize.quantize_annotate_layer(layer)

    import tf_keras

    annotated = tf_keras.models.clone_model(
        model, clone_function=_cloning(annotate, tf_keras)
    )
    annotated.set_weights(model.get_weights())
    scope = {
        cls.__name__: cls
        for cls in (
            *norm_classes,
            *float_classes,
            quantize_configs.NormOutputQuantizeConfig,
            quantize_configs.FloatQuantizeConfig,
        )
    }
    with quantize.quantize_scope(scope):
        try:
            return quantize.quantize_apply(annotated)
        except (RuntimeError, ValueError) as err:
            raise ValueError(f"TFMOT cannot quantize this model: {err}") from err


def _float_classes(legacy):
    """The legacy layers `quantize_aware` keeps float in training."""
    return (
        legacy.LayerNormSimpleRNN,
        legacy.LayerNormLSTM,
        legacy.LayerNormGRU,
        legacy.LayerNormSimpleRNNCell,
        legacy.LayerNormLSTMCell,
        legacy.LayerNormGRUCell,
        legacy.NormResidual,
        legacy.TransformerEncoderBlock,
        legacy.TransformerDecoderBlock,
    )


def _is_float_layer(layer, float_classes):
    import tf_keras

    if type(layer) is tf_keras.layers.RNN:
        return isinstance(layer.cell, float_classes)
    return isinstance(layer, float_classes)


def _cloning(annotate, tf_keras):
    """A `clone_model` function: a fresh copy of each layer, annotated."""

    def clone(layer):
        copy = type(layer).from_config(layer.get_config())
        if isinstance(layer, tf_keras.layers.InputLayer):
            return copy
        return annotate(copy)

    return clone


def to_tf_keras(
    model: keras.Model,
    *,
    verify_inputs=None,
    tolerance: float = _parity.REBUILD_TOLERANCE,
    check_inputs=UNSET,
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
        check_inputs: deprecated alias of `verify_inputs` (warns).

    Returns:
        The `tf_keras.Model`.

    Raises:
        ImportError: `tf_keras` is not installed.
        ValueError: the model is subclassed, or a layer has no `tf_keras`
            counterpart (the message names it).
        ExportVerificationError: the copy's outputs differ by more than
            `tolerance`.
    """
    verify_inputs = renamed(
        "to_tf_keras", "verify_inputs", verify_inputs, "check_inputs", check_inputs
    )
    try:
        import tf_keras
    except ImportError as err:
        raise ImportError(f"{_QAT_EXTRA} ({err})") from err
    graph = functional_of(model)
    if graph is None:
        raise ValueError(
            "Only Functional and Sequential Keras 3 models can be rebuilt as "
            f"tf_keras models. Received: model={model!r} of type "
            f"{type(model).__name__}"
        )
    # A mixed-precision model is bridged from its float32 copy: QAT and the
    # int8 file it leads to compute in float32 and int8.
    rebuilt = _mixed_precision.rebuild(model)
    if rebuilt is not None:
        model = rebuilt.copy
        graph = functional_of(model)
    _model.check_model(model)
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
    from kerasnorm import blocks
    from kerasnorm import norms
    from kerasnorm import recurrent

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
    inputs = _artifacts.check_inputs(model, verify_inputs, 8)
    feed = inputs if len(inputs) > 1 else inputs[0]
    expected = keras.tree.flatten(model(feed, training=False))
    got = keras.tree.flatten(rebuilt(feed, training=False))
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        error = _parity.relative_error(e, g)
        if error > tolerance:
            raise ExportVerificationError(
                f"The tf_keras rebuild of {model.name!r} differs from it in "
                f"output {i}: max |tf_keras - keras| / max |keras| = "
                f"{error:.3e} > tolerance={tolerance:g}."
            )
