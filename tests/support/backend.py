"""What the tests need to run on every Keras backend.

Keras fixes its backend when it is first imported, so each backend gets its
own pytest process: `KERAS_BACKEND=jax python -m pytest -q -m "not tf_only"`
(see docs/contributing.md). Tests that need TensorFlow itself
(TFLite, SavedModel, `tf.distribute`) carry the `tf_only` marker and are
skipped on the other backends by `conftest.py`.

It also says which kernels this machine has, for tests that need one only
some machines provide (docs/guides/portability.md): each is probed once by running
it, since no setting tells for sure.
"""

import functools

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()


@functools.cache
def nchw_conv_runs(layer="Conv2D"):
    """Whether a `channels_first` (NCHW) `layer` (`"Conv2D"` or
    `"DepthwiseConv2D"`) runs where Keras places it.

    TensorFlow's own CPU convolutions take NHWC only; their NCHW kernels on
    CPU are oneDNN's, and oneDNN is off with `TF_ENABLE_ONEDNN_OPTS=0` and
    by default on CPUs without AVX-512. Newer Keras transposes a depthwise
    one around an NHWC kernel (3.15 does, 3.10 does not). GPUs and the other
    backends have one. The environment variable alone cannot tell (its
    default depends on the CPU), so a 1x1 convolution is run once.
    """
    if BACKEND != "tensorflow":
        return True
    import tensorflow as tf

    conv = getattr(keras.layers, layer)(
        *([1] if layer == "Conv2D" else []),
        1,
        data_format="channels_first",
        name="nchw_conv_probe",
    )
    try:
        conv(np.zeros((1, 1, 2, 2), "float32"))
    except tf.errors.UnimplementedError:
        return False
    return True


def require_nchw_conv(layer="Conv2D"):
    """Skip the calling test where a channels_first `layer` cannot run."""
    if not nchw_conv_runs(layer):
        pytest.skip(
            f"needs an NCHW (channels_first) {layer} kernel: TensorFlow has "
            "one on CPU only through oneDNN, which is off here "
            "(TF_ENABLE_ONEDNN_OPTS=0, or a CPU without AVX-512)"
        )


def value_and_gradients(fn, inputs, variables=(), *, has_aux=False):
    """The scalar `fn(*inputs)` and its gradients, as numpy, on any backend.

    `inputs` are arrays, passed to `fn` as backend tensors; `variables` are
    Keras variables `fn` reads (built beforehand: the JAX path reads them
    through a `keras.StatelessScope`, where no variable can be created).
    Returns `(value, grads)`, grads for `inputs` then `variables` (zeros where
    `fn` does not depend on one); with `has_aux`, `fn` returns
    `(value, aux)` and the result is `(value, aux, grads)` with the tensors in
    `aux` (a list) as numpy.
    """
    variables = list(variables)
    value, aux, grads = _GRADIENTS[BACKEND](fn, list(inputs), variables, has_aux)
    shapes = [np.shape(x) for x in inputs] + [tuple(v.shape) for v in variables]
    grads = [
        np.zeros(shape) if g is None else np.asarray(keras.ops.convert_to_numpy(g))
        for g, shape in zip(grads, shapes, strict=True)
    ]
    value = float(keras.ops.convert_to_numpy(value))
    if not has_aux:
        return value, grads
    aux = [np.asarray(keras.ops.convert_to_numpy(a)) for a in aux]
    return value, aux, grads


def _split(out, has_aux):
    return out if has_aux else (out, [])


def _tensorflow(fn, inputs, variables, has_aux):
    import tensorflow as tf

    tensors = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        value, aux = _split(fn(*tensors), has_aux)
    grads = tape.gradient(value, tensors + [v.value for v in variables])
    return value, aux, grads


def _jax(fn, inputs, variables, has_aux):
    import jax

    def pure(tensors, values):
        with keras.StatelessScope(
            state_mapping=list(zip(variables, values, strict=True))
        ):
            value, aux = _split(fn(*tensors), has_aux)
        return value, aux

    tensors = [jax.numpy.asarray(x) for x in inputs]
    (value, aux), grads = jax.jit(
        jax.value_and_grad(pure, argnums=(0, 1), has_aux=True)
    )(tensors, [v.value for v in variables])
    return value, aux, [*grads[0], *grads[1]]


def _torch(fn, inputs, variables, has_aux):
    import torch

    tensors = [keras.ops.convert_to_tensor(x).requires_grad_(True) for x in inputs]
    value, aux = _split(fn(*tensors), has_aux)
    grads = torch.autograd.grad(
        value, tensors + [v.value for v in variables], allow_unused=True
    )
    return value.detach(), [a.detach() for a in aux], grads


_GRADIENTS = {"tensorflow": _tensorflow, "jax": _jax, "torch": _torch}
