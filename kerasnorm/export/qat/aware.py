"""Quantization-aware training with tensorflow-model-optimization (TFMOT).

TFMOT 0.8.1 quantizes `tf_keras` (Keras 2) models only. `quantize_aware`
takes a `tf_keras` model (kerasnorm layers from `kerasnorm.legacy.layers`)
or a Keras 3 model, which it first rebuilds as a `tf_keras` model with the
same weights (`to_tf_keras`), and returns TFMOT's QAT model.

TFMOT and `tf_keras` are imported here only inside the functions: importing
TFMOT sets `TF_USE_LEGACY_KERAS=1` for the process, which must not happen to
a user who only imports `kerasnorm.export` (docs/guides/qat.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from kerasnorm.export.model.facts import is_tf_keras_model
from kerasnorm.export.model.facts import rolled_recurrent_layers
from kerasnorm.export.numerics.metrics import REBUILD_TOLERANCE
from kerasnorm.export.qat.bridge import QAT_EXTRA
from kerasnorm.export.qat.bridge import to_tf_keras


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
        raise ImportError(f"{QAT_EXTRA} ({err})") from err
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
    tolerance: float = REBUILD_TOLERANCE,
):
    """A TFMOT quantization-aware-training copy of `model`, as `tf_keras`.

    Every layer gets a TFMOT `QuantizeConfig`: TFMOT's own for core layers
    (Conv+BatchNorm+ReLU patterns are folded by TFMOT's transforms), and for
    kerasnorm's norm layers one that quantizes the output and keeps the
    statistics and `gamma`/`beta` float (`NormOutputQuantizeConfig`;
    [Quantization-aware training](../guides/qat.md) says why). Layers named in
    `keep_float` are not quantized in training at all (`FloatQuantizeConfig`).

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
            models only). Defaults to 32 random samples.
        tolerance: the parity tolerance of `to_tf_keras`. Defaults to `1e-5`.

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
    # kills the process (docs/guides/qat.md); refused here, before training, with
    # the same search `to_tflite` uses.
    loop = next(rolled_recurrent_layers(model), None)
    if loop is not None:
        raise ValueError(
            f"Layer {loop.name!r} ({type(loop).__name__}) runs its time "
            "loop as a while loop, which the TFLite converter cannot "
            "convert to int8 after QAT (it crashes). Build it with "
            "unroll=True and a fixed sequence length. Received: "
            "unroll=False"
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
            # Kept float in training: docs/guides/qat.md, "Recurrent layers and
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
