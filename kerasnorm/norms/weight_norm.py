import math

import keras
import numpy as np
from keras import ops

from kerasnorm import _compat

# The layers `WeightNorm` wraps, by class name (the same in both Keras
# generations), and how each computes: "dense", "conv", "conv_transpose" or
# "depthwise".
_KINDS = {
    "Dense": "dense",
    "Conv1D": "conv",
    "Conv2D": "conv",
    "Conv3D": "conv",
    "Conv1DTranspose": "conv_transpose",
    "Conv2DTranspose": "conv_transpose",
    "Conv3DTranspose": "conv_transpose",
    "DepthwiseConv1D": "depthwise",
    "DepthwiseConv2D": "depthwise",
}


def supported_layers(framework=keras):
    """The layer classes `WeightNorm` wraps, in `framework` (`keras` or
    `tf_keras`)."""
    return tuple(getattr(framework.layers, name) for name in _KINDS)


def _kind(layer):
    return _KINDS.get(type(layer).__name__, "dense")


# Floor under ||v||^2 (as tf.nn.l2_normalize has) so an all-zero direction
# gives a zero kernel rather than NaN.
_NORM_FLOOR = 1e-12
# Added to the init batch's variance: a channel that is constant on the init
# batch (dead input, zero padding) gets a large but finite g.
_INIT_EPSILON = 1e-6


def output_channel_axes(kernel_rank, layer):
    """The kernel axes that index output channels (g's axes) for `layer`.

    Dense (in, out) and Conv (..., in/groups, out): the last axis.
    Conv*Transpose (..., out, in): axis -2. DepthwiseConv (..., in,
    multiplier): the last two, one output channel per (in, multiplier) pair.
    """
    if _kind(layer) == "conv_transpose":
        return (kernel_rank - 2,)
    if _kind(layer) == "depthwise":
        return (kernel_rank - 2, kernel_rank - 1)
    return (kernel_rank - 1,)


def kernel_norm_axes(kernel_rank, layer):
    """The kernel axes ||v|| is taken over: all but the output-channel axes."""
    kept = output_channel_axes(kernel_rank, layer)
    return tuple(a for a in range(kernel_rank) if a not in kept)


def effective_kernel(v, g, norm_axes):
    """`g * v / ||v||`, the norm over `norm_axes`; `g` broadcast against `v`."""
    sumsq = ops.sum(ops.square(v), axis=norm_axes, keepdims=True)
    return v * ops.rsqrt(ops.maximum(sumsq, _NORM_FLOOR)) * g


def _sum_over_replicas(x):
    """`x` summed over the replicas of a `tf.distribute` strategy, if any."""
    if keras.backend.backend() != "tensorflow":
        return x
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return x
    return context.all_reduce(tf.distribute.ReduceOp.SUM, x)


class WeightNormMixin:
    """`WeightNorm`'s arguments, weights and computation, over no
    Wrapper class (`kerasnorm.norms._base` says why)."""

    _framework = keras
    # TensorFlow Addons' WeightNormalization also wrapped RNN layers and told
    # them apart with this attribute; code written against it reads it here.
    is_rnn = False

    def __init__(self, layer, data_init=True, **kwargs):
        if type(layer) not in supported_layers(self._framework):
            names = ", ".join(_KINDS)
            raise ValueError(
                f"`WeightNorm` wraps one of {names}: a layer that contains a "
                "`kernel` it applies linearly. "
                f"Received: layer={layer!r} (class {type(layer).__name__})"
            )
        if not isinstance(data_init, bool):
            raise ValueError(
                f"`data_init` must be a bool. Received: data_init={data_init!r}"
            )
        super().__init__(layer, **kwargs)
        self.data_init = data_init
        # Inputs arrive uncast, so the data init takes its statistics from them
        # in float32; `call` casts them for the forward pass.
        self.autocast = False
        self.g = None
        self.initialized = None

    def build(self, input_shape):
        super().build(input_shape)
        v = self._direction()
        rank = len(v.shape)
        self._norm_axes = kernel_norm_axes(rank, self.layer)
        out_axes = output_channel_axes(rank, self.layer)
        self._g_shape = tuple(
            1 if a in self._norm_axes else v.shape[a] for a in range(rank)
        )
        self.g = self.add_weight(
            name="g",
            shape=tuple(v.shape[a] for a in out_axes),
            initializer="ones",
            trainable=True,
            autocast=False,
            aggregation="mean",
        )
        self.g.assign(ops.reshape(self._norm(v), self.g.shape))
        if self.data_init:
            # float32 rather than bool: it is saved, mirrored and assigned like
            # the other weights; it reads as initialized when > 0.5.
            self.initialized = self.add_weight(
                name="initialized",
                shape=(),
                initializer="zeros",
                trainable=False,
                autocast=False,
                aggregation="only_first_replica",
            )

    def _direction(self):
        """The wrapped layer's kernel, `v` (`depthwise_kernel` in `tf_keras`'s
        depthwise convolutions)."""
        kernel = getattr(self.layer, "depthwise_kernel", None)
        return self.layer.kernel if kernel is None else kernel

    def _norm(self, v):
        sumsq = ops.sum(ops.square(v), axis=self._norm_axes, keepdims=True)
        return ops.sqrt(ops.maximum(sumsq, _NORM_FLOOR))

    def _linear(self, inputs, kernel):
        """The wrapped layer's linear map, without bias and activation."""
        layer = self.layer
        kind = _kind(layer)
        if kind == "dense":
            return ops.matmul(inputs, kernel)
        if kind == "conv_transpose":
            return ops.conv_transpose(
                inputs,
                kernel,
                strides=list(layer.strides),
                padding=layer.padding,
                output_padding=layer.output_padding,
                dilation_rate=layer.dilation_rate,
                data_format=layer.data_format,
            )
        if kind == "depthwise":
            return ops.depthwise_conv(
                inputs,
                kernel,
                strides=layer.strides,
                padding=layer.padding,
                dilation_rate=layer.dilation_rate,
                data_format=layer.data_format,
            )
        padding = layer.padding
        if padding == "causal":
            # Conv1D's causal padding: dilation * (kernel - 1) steps on the left.
            time_axis = 1 if layer.data_format == "channels_last" else 2
            pads = [[0, 0], [0, 0], [0, 0]]
            pads[time_axis][0] = layer.dilation_rate[0] * (layer.kernel_size[0] - 1)
            inputs = ops.pad(inputs, pads)
            padding = "valid"
        return ops.conv(
            inputs,
            kernel,
            strides=list(layer.strides),
            padding=padding,
            dilation_rate=layer.dilation_rate,
            data_format=layer.data_format,
        )

    def _channel_axis(self, rank):
        if _kind(self.layer) == "dense" or self.layer.data_format == "channels_last":
            return rank - 1
        return 1

    def _data_dependent_init(self, inputs):
        """Set g and the bias from `inputs` unless `initialized` says done.

        Both branches of the `cond` return per-channel sums (zeros once
        initialized), which are then summed over replicas: a collective
        cannot run inside a `cond` under `tf.distribute`, and sums (unlike
        variances) add across replicas to the statistics of the global batch.
        """
        initialized = self.initialized > 0.5
        bias = self.layer.bias
        v = ops.cast(self._direction(), self.variable_dtype)
        channels = math.prod(self.g.shape)

        def batch_sums():
            t = self._linear(ops.cast(inputs, v.dtype), v / self._norm(v))
            channel = self._channel_axis(len(t.shape))
            axes = [a for a in range(len(t.shape)) if a != channel]
            return ops.stack(
                [
                    ops.sum(t, axes),
                    ops.sum(ops.square(t), axes),
                    ops.sum(ops.ones_like(t), axes),
                ]
            )

        def no_sums():
            return ops.zeros((3, channels), dtype=v.dtype)

        sums = _sum_over_replicas(ops.cond(initialized, no_sums, batch_sums))
        count = ops.maximum(sums[2], 1.0)
        mean = sums[0] / count
        var = ops.maximum(sums[1] / count - ops.square(mean), 0.0)
        scale = ops.rsqrt(var + _INIT_EPSILON)
        updates = [(self.g, ops.reshape(scale, self.g.shape))]
        if bias is not None:
            updates.append((bias, -mean * scale))
        for weight, value in updates:
            # Converted explicitly: JAX no longer turns a Keras variable into
            # an array inside a traced function (jax >= 0.10), and a tf_keras
            # variable (the legacy twin) has `value` as a method.
            current = ops.convert_to_tensor(weight)
            weight.assign(ops.where(initialized, current, ops.stop_gradient(value)))
        self.initialized.assign(1.0)

    def call(self, inputs, training=None):
        if self.data_init and training:
            self._data_dependent_init(inputs)
        v = ops.cast(self._direction(), self.variable_dtype)
        g = ops.reshape(self.g, self._g_shape)
        kernel = ops.cast(effective_kernel(v, g, self._norm_axes), self.compute_dtype)
        outputs = self._linear(ops.cast(inputs, self.compute_dtype), kernel)
        if self.layer.bias is not None:
            shape = [1] * len(outputs.shape)
            shape[self._channel_axis(len(outputs.shape))] = -1
            bias = ops.cast(self.layer.bias, self.compute_dtype)
            outputs = outputs + ops.reshape(bias, shape)
        if self.layer.activation is not None:
            outputs = self.layer.activation(outputs)
        return outputs

    def compute_output_shape(self, input_shape):
        # Keras' transposed convolutions answer with a list.
        return tuple(self.layer.compute_output_shape(input_shape))

    @classmethod
    def from_config(cls, config, custom_objects=None):
        # `Wrapper.from_config` pops "layer" from the dict it is given.
        return super().from_config(dict(config), custom_objects)

    def get_config(self):
        return {**super().get_config(), "data_init": self.data_init}


@keras.saving.register_keras_serializable(package="kerasnorm")
class WeightNorm(WeightNormMixin, keras.layers.Wrapper):
    """Weight normalization (Salimans & Kingma, 2016) of a linear layer.

    Re-parameterizes the wrapped layer's kernel per output channel as a
    direction `v` (the layer's own `kernel` variable) and a length `g`:

    ```python
    kernel = g * v / norm(v)   # norm over every kernel axis but the output channel
    y = activation(linear(x, kernel) + bias)
    ```

    `g` has one entry per output channel: shape `(units,)` for `Dense`,
    `(filters,)` for `Conv*D` and `Conv*DTranspose` (whose kernels are laid out
    `(..., filters, in)`), and `(in, depth_multiplier)` for `DepthwiseConv*D`.
    It starts at `norm(v)`, so an untrained wrapper computes exactly the
    wrapped layer.

    With `data_init=True`, the first batch seen in training (`training=True`,
    e.g. the first step of `fit`) sets `g` and the bias by the paper's
    data-dependent initialization: with `t = linear(x, v / norm(v))`, per
    output channel `g = 1 / std(t)` and `bias = -mean(t) / std(t)`, so the
    pre-activations of that batch have mean 0 and variance 1. A non-trainable
    weight `initialized` records that it ran; it is saved with the model, so a
    reloaded model is not initialized again. The choice is made in the graph
    (`ops.cond` on that weight), so it runs under `jit_compile=True`. Under a
    `tf.distribute` strategy the statistics are those of the global batch:
    each training step sums `3 * channels` floats across replicas (zeros
    after the first), because a collective cannot sit inside the `cond`.
    The variance is `E[t^2] - E[t]^2` in float32. Without a bias
    (`use_bias=False`) only `g` is set.

    On the JAX backend, `fit` cannot run the initialization: Keras' JAX
    trainer is stateless and keeps only the non-trainable variables a
    training step assigns, so `initialized` would be set while `g` and the
    bias keep their values. Initialize eagerly once before `fit` instead,
    `model(x_batch, training=True)`; later steps leave both alone.

    Under mixed precision `g`, the norm and the kernel are computed in
    float32 (`v` is read in the compute dtype, as the plain layer reads it,
    and squared in float32); the kernel is cast to the compute dtype after
    normalization. At export,
    `kerasnorm.export` replaces the wrapper by the plain layer with the
    effective kernel, so no norm is computed at inference.

    Examples:
        ```python
        conv = kerasnorm.WeightNorm(keras.layers.Conv1D(64, 7, padding="same"))
        dense = kerasnorm.WeightNorm(keras.layers.Dense(10), data_init=False)
        ```

    Args:
        layer: the layer to normalize: a `keras.layers.Dense`, `Conv1D`,
            `Conv2D`, `Conv3D`, `Conv1DTranspose`, `Conv2DTranspose`,
            `Conv3DTranspose`, `DepthwiseConv1D` or `DepthwiseConv2D`
            (exactly these classes; subclasses may compute something else).
        data_init: whether to run the data-dependent initialization on the
            first training batch. Defaults to `True`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Reference:
        - [Salimans & Kingma, 2016](https://arxiv.org/abs/1602.07868), §2, §3.
    """

    def remove(self):
        """The plain layer this built wrapper computes at inference.

        A fresh layer of the wrapped layer's class and config, named after
        the wrapper (so output names in exported signatures do not change),
        built as the wrapped layer was, with `kernel = g * v / ||v||`
        computed once in float64 and stored in the layer's variable dtype,
        and the wrapped layer's bias. The wrapper itself is left untouched.
        (TensorFlow Addons' `WeightNormalization.remove`; `kerasnorm.export`
        does this for every wrapper of a model.)
        """
        if not self.built:
            raise ValueError(
                "`remove` needs a built `WeightNorm` (call it or build it "
                f"first). Received: wrapper={self.name!r}, built=False"
            )
        inner = self.layer
        config = {**_compat.layer_config(inner), "name": self.name}
        plain = type(inner).from_config(config)
        plain.build_from_config(inner.get_build_config())
        # `effective_kernel`'s formula (its norm floor included) in float64
        # with numpy, on every backend (JAX computes float32 unless told
        # otherwise), over the axes and g shape `build` worked out.
        v = np.asarray(keras.ops.convert_to_numpy(self._direction()), "float64")
        g = np.asarray(keras.ops.convert_to_numpy(self.g), "float64")
        sumsq = np.sum(np.square(v), axis=self._norm_axes, keepdims=True)
        kernel = v / np.sqrt(np.maximum(sumsq, _NORM_FLOOR)) * g.reshape(self._g_shape)
        plain.kernel.assign(kernel.astype(plain.kernel.dtype))
        if inner.bias is not None:
            plain.bias.assign(inner.bias.numpy())
        return plain
