"""The models the export benchmarks export: small nets built here, the
`keras.applications` architectures, what makes their weights realistic
(the language models' shapes are `tests/export/lm_models.py`'s).

Freshly built norms and BatchNorms hold ones and zeros, which would hide
what folding or quantizing their affine costs: `randomize_norms` and
`randomize_statistics` give them random values, as trained weights would.
"""

import keras
import numpy as np

import kerasnorm

L = keras.layers
APPS = keras.applications
# The side of the `keras.applications` inputs (bench_architectures.py).
SIZE = 96


def train(model, x, y, epochs, learning_rate=3e-3):
    """Fit a classifier with integer labels (logits out), batch 32, Adam."""
    model.compile(
        keras.optimizers.Adam(learning_rate),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0)
    return model


# Small nets ---------------------------------------------------------------


def conv_net(norm, side, widths=(16, 32)):
    """Conv2D -> norm -> ReLU per width (stride 1, then 2), global average
    pooling, Dense(10). `norm` is a zero-argument layer factory."""
    inputs = keras.Input((side, side, 3), name="image")
    x = inputs
    for index, width in enumerate(widths):
        x = L.Conv2D(width, 3, strides=1 if index == 0 else 2, padding="same")(x)
        x = L.ReLU()(norm()(x))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10)(x))


def wide_conv_net(norm, side=32, channels=16, width=64, layers=3):
    """`layers` x (Conv2D(width, 3), stride 1 -> norm -> ReLU) on `side` x
    `side` x `channels` inputs, global average pooling, Dense(10): the
    conv net at the width where the convolutions outweigh the norms."""
    inputs = keras.Input((side, side, channels), name="features")
    x = inputs
    for _ in range(layers):
        x = L.Conv2D(width, 3, padding="same")(x)
        x = L.ReLU()(norm()(x))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10)(x))


def token_mlp(norm, steps, width, blocks=2):
    """Dense -> `blocks` x (norm -> Dense(2 * width, relu) -> Dense(width),
    residual) -> norm over the channels of (batch, tokens, channels),
    pooled to 10 logits. `norm` is a zero-argument layer factory."""
    inputs = keras.Input((steps, width), name="tokens")
    x = L.Dense(width)(inputs)
    for _ in range(blocks):
        h = L.Dense(2 * width, activation="relu")(norm()(x))
        x = x + L.Dense(width)(h)
    x = L.GlobalAveragePooling1D()(norm()(x))
    return keras.Model(inputs, L.Dense(10)(x))


def encoder(position, steps, width, layers):
    """`layers` kerasnorm TransformerEncoderBlocks (`norm_position`
    `position`: "pre", "post" or "deepnorm"), 4 heads, pooled to 10 logits."""
    inputs = keras.Input((steps, width), name="tokens")
    x = inputs
    for _ in range(layers):
        x = kerasnorm.TransformerEncoderBlock(
            num_heads=4,
            key_dim=width // 4,
            intermediate_dim=2 * width,
            norm_position=position,
            num_layers=layers,
        )(x)
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, L.Dense(10)(x))


def recurrent(cls, units, steps, features, classes, unroll=False):
    """A recurrent classifier: `cls(units)` (last output) -> Dense(classes)."""
    inputs = keras.Input((steps, features), name="sequence")
    x = cls(units, unroll=unroll)(inputs)
    return keras.Model(inputs, L.Dense(classes)(x))


def unrolled_copy(model):
    """A `recurrent` model rebuilt with `unroll=True`, same weights: what a
    user does by hand where `to_tflite` does not unroll."""
    layer = next(x for x in model.layers if hasattr(x, "cell"))
    steps, features = model.inputs[0].shape[1:]
    classes = model.outputs[0].shape[-1]
    copy = recurrent(type(layer), layer.units, steps, features, classes, True)
    copy.set_weights(model.get_weights())
    return copy


def sequence_regressor(cls, units, steps, unroll=False):
    """`cls(units, return_sequences=True)` over 4 features -> Dense(2) per
    step (data.cumulative_sum)."""
    return keras.Sequential(
        [
            keras.Input((steps, 4)),
            cls(units, return_sequences=True, unroll=unroll),
            L.Dense(2),
        ]
    )


def digits_resnet(width=32, blocks=3):
    """A stem and `blocks` residual blocks, Conv2D + BatchNorm, on 8x8x1."""
    inputs = keras.Input((8, 8, 1), name="image")
    x = L.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = L.ReLU()(L.BatchNormalization()(x))
    for _ in range(blocks):
        h = L.Conv2D(width, 3, padding="same", use_bias=False)(x)
        h = L.ReLU()(L.BatchNormalization()(h))
        h = L.Conv2D(width, 3, padding="same", use_bias=False)(h)
        h = L.BatchNormalization()(h)
        x = L.ReLU()(L.Add()([x, h]))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10, name="logits")(x), name="digits_resnet")


def digits_cnn():
    """Two Conv+BatchNorm+ReLU blocks, GroupNorm, a LayerNorm-normalized
    Dense, on 8x8x1 (bench_qat.py)."""
    inputs = keras.Input((8, 8, 1), name="image")
    x = inputs
    for width in (16, 32):
        x = L.Conv2D(width, 3, padding="same", use_bias=False)(x)
        x = L.ReLU()(L.BatchNormalization()(x))
    x = kerasnorm.GroupNorm(groups=8)(x)
    x = L.Flatten()(L.MaxPooling2D()(x))
    x = L.ReLU()(kerasnorm.LayerNorm()(L.Dense(64)(x)))
    return keras.Model(inputs, L.Dense(10, name="logits")(x), name="digits_cnn")


# keras.applications -------------------------------------------------------


def _app(cls, **kwargs):
    def build():
        return cls(
            weights=None,
            input_shape=(SIZE, SIZE, 3),
            classifier_activation=None,
            **kwargs,
        )

    return build


def _wrapped_backbone():
    """A Functional model with a backbone as a nested sub-model and a BN head."""
    backbone = APPS.MobileNetV2(
        weights=None, input_shape=(SIZE, SIZE, 3), include_top=False, alpha=0.35
    )
    image = keras.Input((SIZE, SIZE, 3), name="image")
    x = L.GlobalAveragePooling2D()(backbone(image))
    x = L.Dense(64, use_bias=False)(x)
    x = L.BatchNormalization()(x)
    x = L.ReLU()(x)
    return keras.Model(image, L.Dense(10)(x), name="wrapped_mobilenetv2")


# name -> builder, at SIZE x SIZE, `weights=None`, logits out.
ARCHITECTURES = {
    "ResNet50": _app(APPS.ResNet50),
    "ResNet50V2": _app(APPS.ResNet50V2),
    "MobileNetV2": _app(APPS.MobileNetV2),
    "MobileNetV3Small": _app(APPS.MobileNetV3Small),
    "EfficientNetB0": _app(APPS.EfficientNetB0),
    "EfficientNetV2B0": _app(APPS.EfficientNetV2B0),
    "DenseNet121": _app(APPS.DenseNet121),
    "Xception": _app(APPS.Xception),
    "InceptionV3": _app(APPS.InceptionV3),
    # NASNet's own minimum is 32x32; 96x96 builds and runs like the others.
    "NASNetMobile": _app(APPS.NASNetMobile),
    "ConvNeXtTiny": _app(APPS.ConvNeXtTiny),
    "Wrapped(MobileNetV2)": _wrapped_backbone,
}


def mobilenet_v3_small():
    """MobileNetV3Small at SIZE x SIZE with random BatchNorm statistics."""
    model = ARCHITECTURES["MobileNetV3Small"]()
    randomize_statistics(model)
    return model


# Realistic weights --------------------------------------------------------


def _layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def randomize_statistics(model, seed=0):
    """Random BN statistics and affine; ImageNet statistics in Normalization.
    Returns how many BatchNormalization layers the model has."""
    rng = np.random.default_rng(seed)
    bns = 0
    for layer in _layers(model):
        if isinstance(layer, L.BatchNormalization):
            bns += 1
            n = layer.moving_mean.shape
            layer.moving_mean.assign(rng.normal(0.0, 0.5, n))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, n))
            if layer.scale:
                layer.gamma.assign(rng.uniform(0.5, 1.5, n))
            if layer.center:
                layer.beta.assign(rng.normal(0.0, 0.3, n))
        elif isinstance(layer, L.Normalization) and hasattr(layer, "adapt_mean"):
            # What loading an adapted layer's weights does: assign the
            # statistics, then derive the tensors `call` uses.
            layer.adapt_mean.assign([0.485, 0.456, 0.406])
            layer.adapt_variance.assign(np.square([0.229, 0.224, 0.225]))
            layer.finalize_state()
    return bns


def randomize_norms(model, seed=0):
    """Norm scales in [0.5, 1.5] and offsets ~ N(0, 0.2)."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        name = weight.path.rsplit("/", 1)[-1]
        if name in ("gamma", "scale"):
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype("float32"))
        elif name in ("beta", "offset"):
            weight.assign(rng.normal(0, 0.2, weight.shape).astype("float32"))
