"""The bases the normalization layers share: options, weights, shape and axis
checks, masks, config.

Subclasses choose the reduction axes and call the math core in `call`;
nothing here computes a statistic.

`axis` is resolved against the rank of each input the layer is called on, as
in Keras' `LayerNormalization`: a negative axis counts from the end, so a layer
built for `(batch, features)` and called on `(batch, time, features)` still
normalizes the features. The `input_spec` set at the end of `build` pins the
size of every axis that carries `gamma`/`beta`.

The bases are mixins over no Layer class: each layer is one mixin holding its
arguments, weights and `call`, and two thin classes put it over
`keras.layers.Layer` (`kerasnorm.LayerNorm`, ...) and over `tf_keras`'s Layer
(`kerasnorm.legacy.layers.LayerNorm`, ...). The mixins reach what differs
between the two Keras generations (initializers, regularizers, constraints,
`InputSpec`) through the class attribute `_framework`, the `keras` module here
and `tf_keras` in the legacy classes; the math is `keras.ops`, which runs on
the TensorFlow tensors a `tf_keras` layer is called with.
"""

import keras
from keras import ops

from kerasnorm._core import broadcast_shape
from kerasnorm._core import check_axis
from kerasnorm._core import check_epsilon
from kerasnorm._core import normalize_axes


class NormBase:
    """Base mixin: `axis`, epsilon, optional gain `gamma` and bias `beta`.

    Norm parameters are float32 variables read without autocasting, so under a
    `mixed_float16`/`mixed_bfloat16` policy they stay float32 and the statistics
    are computed in float32; only the output is cast to the compute dtype.

    Subclasses implement `_param_axes(input_shape)`: the axes that carry
    `gamma`/`beta` for an input of that shape, raising a ValueError when the
    shape does not suit the layer. It is called by `build`, `call` and
    `compute_output_shape`, so the three check the same things.
    """

    _min_rank = 1
    # The Keras generation the layer is built on (see the module docstring).
    _framework = keras

    def __init__(
        self,
        *,
        axis,
        epsilon,
        center,
        scale,
        beta_initializer="zeros",
        gamma_initializer="ones",
        beta_regularizer=None,
        gamma_regularizer=None,
        beta_constraint=None,
        gamma_constraint=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.axis = axis
        self.epsilon = check_epsilon(epsilon)
        self.center = bool(center)
        self.scale = bool(scale)
        fw = self._framework
        self.beta_initializer = fw.initializers.get(beta_initializer)
        self.gamma_initializer = fw.initializers.get(gamma_initializer)
        self.beta_regularizer = fw.regularizers.get(beta_regularizer)
        self.gamma_regularizer = fw.regularizers.get(gamma_regularizer)
        self.beta_constraint = fw.constraints.get(beta_constraint)
        self.gamma_constraint = fw.constraints.get(gamma_constraint)
        self.supports_masking = True
        # Statistics are promoted to float32 in the core anyway; casting the
        # inputs to the compute dtype first would only add a pass.
        self.autocast = False
        self.gamma = None
        self.beta = None
        self._param_sizes = None

    def _axis_entries(self):
        """The `axis` entries as given, in the order the parameters store them."""
        return (self.axis,)

    def build(self, input_shape):
        axes = self._param_axes(input_shape)
        self._param_sizes = tuple(self._defined_size(input_shape, a) for a in axes)
        self._build_affine(self._param_sizes)
        entries = self._axis_entries()
        self.input_spec = self._framework.layers.InputSpec(
            min_ndim=max(self._min_rank, *(a + 1 if a >= 0 else -a for a in entries)),
            axes=dict(zip(entries, self._param_sizes, strict=True)),
        )

    def _defined_size(self, input_shape, axis):
        size = input_shape[axis]
        if size is None:
            raise ValueError(
                f"The size of axis {axis} of the input to {type(self).__name__} "
                "(an axis of gamma and beta) must be defined: the input tensor "
                "should have a defined dimension but the layer received an "
                f"input with shape {tuple(input_shape)}. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        return int(size)

    def _build_affine(self, shape):
        """Create `gamma` (if `scale`) and `beta` (if `center`) of `shape`."""
        if self.scale:
            self.gamma = self.add_weight(
                name="gamma",
                shape=shape,
                initializer=self.gamma_initializer,
                regularizer=self.gamma_regularizer,
                constraint=self.gamma_constraint,
                trainable=True,
                autocast=False,
            )
        if self.center:
            self.beta = self.add_weight(
                name="beta",
                shape=shape,
                initializer=self.beta_initializer,
                regularizer=self.beta_regularizer,
                constraint=self.beta_constraint,
                trainable=True,
                autocast=False,
            )

    def _affine(self, shape=None):
        """`(gamma, beta)` reshaped to `shape` (unchanged when None)."""
        if shape is None:
            return self.gamma, self.beta
        return tuple(
            None if p is None else ops.reshape(p, shape)
            for p in (self.gamma, self.beta)
        )

    def _param_shape(self, rank, axes):
        """The shape that broadcasts the parameters on `axes` of a `rank` input,
        or None when they broadcast as they are (parameters on the last axis)."""
        if axes == (rank - 1,):
            return None
        return broadcast_shape(rank, axes, self._param_sizes)

    @staticmethod
    def _apply_mask(inputs, mask, reduced_axes):
        """The one path every layer takes for a Keras mask.

        Returns `(inputs, stats_mask)`. Padded entries of `inputs` are replaced
        by 0 with `where` before any arithmetic: padding may hold NaN or inf,
        which a product with the mask keeps (nan * 0 is NaN), and which would
        reach the gradients of `gamma`/`beta` through the padded outputs even
        when the statistics leave them out. Padded outputs are therefore the
        layer's output for a zero input: finite, and not meant to be read.

        `stats_mask` is the mask with trailing size-1 axes up to the input's
        rank when the statistics reduce over one of the masked axes, else None:
        Keras masks cover the leading (batch, time, ...) axes, and per-step
        statistics of padded steps are never read.
        """
        if mask is None:
            return inputs, None
        mask_rank = len(mask.shape)
        mask = ops.cast(mask, "bool")
        for _ in range(len(inputs.shape) - mask_rank):
            mask = ops.expand_dims(mask, -1)
        inputs = ops.where(mask, inputs, ops.zeros((), inputs.dtype))
        if not any(0 < a < mask_rank for a in reduced_axes):
            return inputs, None
        return inputs, mask

    def compute_output_shape(self, input_shape):
        self._param_axes(input_shape)
        return tuple(input_shape)

    def get_config(self):
        fw = self._framework
        config = {
            # `tf_keras` wraps a list attribute for tracking; configs hold lists.
            "axis": self.axis if isinstance(self.axis, int) else list(self.axis),
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
            "beta_initializer": fw.initializers.serialize(self.beta_initializer),
            "gamma_initializer": fw.initializers.serialize(self.gamma_initializer),
            "beta_regularizer": fw.regularizers.serialize(self.beta_regularizer),
            "gamma_regularizer": fw.regularizers.serialize(self.gamma_regularizer),
            "beta_constraint": fw.constraints.serialize(self.beta_constraint),
            "gamma_constraint": fw.constraints.serialize(self.gamma_constraint),
        }
        return {**super().get_config(), **config}


class AxesNormBase(NormBase):
    """LayerNorm and RMSNorm: statistics and parameters over the same axes.

    `axis` is an int or a list of ints; `gamma`/`beta` have the sizes of those
    axes, in the order the axes take in the input the layer was built for.
    """

    def __init__(self, *, axis, **kwargs):
        super().__init__(axis=check_axis(axis), **kwargs)
        self._axis_order = None

    def _axis_entries(self):
        return self._axis_order

    def build(self, input_shape):
        rank = len(input_shape)
        entries = [self.axis] if isinstance(self.axis, int) else self.axis
        normalize_axes(self.axis, rank)
        self._axis_order = tuple(sorted(entries, key=lambda a: a % rank))
        super().build(input_shape)

    def _param_axes(self, input_shape):
        rank = len(input_shape)
        axes = normalize_axes(self.axis, rank)
        if self._axis_order is not None:
            resolved = tuple(a % rank for a in self._axis_order)
            # Axes given with mixed signs (`[2, -2]`) can swap places at
            # another rank; the parameters would then be laid out wrongly.
            if resolved != axes:
                raise ValueError(
                    f"{type(self).__name__} was built with its `axis` entries "
                    f"in the order {list(self._axis_order)}, which an input of "
                    f"rank {rank} reverses. Received: axis={self.axis}, "
                    f"input_shape={tuple(input_shape)}"
                )
        return axes


class ChannelNormBase(NormBase):
    """GroupNorm and InstanceNorm: per-channel parameters on one channel axis,
    statistics over the spatial axes (and, for GroupNorm, a channel group).

    `axis` is the channel axis, an int other than the batch axis.
    """

    _min_rank = 2
    # The input layout named in the rank error.
    _layout = "(batch, ..., channels)"

    def __init__(self, *, axis, **kwargs):
        axis = check_axis(axis, allow_list=False)
        if axis == 0:
            # Known without an input; a negative axis that resolves to 0 is
            # caught in `_param_axes`.
            raise ValueError(self._batch_axis_message(axis))
        super().__init__(axis=axis, **kwargs)

    @staticmethod
    def _batch_axis_message(axis, input_shape=None):
        shape = "" if input_shape is None else f" for input_shape={tuple(input_shape)}"
        return (
            "`axis` is the channel axis and cannot be the batch axis 0. "
            f"Received: axis={axis}{shape}"
        )

    def _param_axes(self, input_shape):
        rank = len(input_shape)
        if rank < self._min_rank:
            raise ValueError(
                f"{type(self).__name__} expects inputs of rank >= "
                f"{self._min_rank} {self._layout}. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        axes = normalize_axes(self.axis, rank)
        if axes == (0,):
            raise ValueError(self._batch_axis_message(self.axis, input_shape))
        return axes

    def _check_mask(self, mask, channel_axis):
        """Refuse a Keras mask that covers the channel axis.

        Keras masks cover the leading (batch, time, ...) axes; on
        channels-first data the channels sit where such a mask expects time.
        """
        if mask is not None and len(mask.shape) > channel_axis:
            raise ValueError(
                f"{type(self).__name__} accepts a Keras mask only over axes "
                "before the channel axis (channels-last data). Received: "
                f"axis={self.axis} with a mask of shape {tuple(mask.shape)}"
            )
