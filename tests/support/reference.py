"""numpy float64 references written from docs/design.md (Core), independent of
kerasnorm."""

import math

import numpy as np


def _bshape(rank, axes, sizes):
    shape = [1] * rank
    for a, n in zip(axes, sizes, strict=True):
        shape[a] = n
    return shape


def _affine(y, axes, gamma, beta):
    """`y * gamma + beta`, the parameters over `axes` of `y` (either None:
    left out)."""
    shape = _bshape(y.ndim, axes, [y.shape[a] for a in axes])
    if gamma is not None:
        y = y * np.reshape(gamma, shape)
    if beta is not None:
        y = y + np.reshape(beta, shape)
    return y


def layer_norm(x, axes, eps, gamma=None, beta=None):
    x = np.asarray(x, np.float64)
    axes = tuple(a % x.ndim for a in axes)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return _affine(y, axes, gamma, beta)


def rms_norm(x, axes, eps, partial=1.0, gamma=None, beta=None):
    x = np.asarray(x, np.float64)
    axes = tuple(a % x.ndim for a in axes)
    n = x.shape[-1]
    k = math.ceil(round(partial * n, 6))
    ms = (x[..., :k] ** 2).mean(axis=axes, keepdims=True)
    y = x / np.sqrt(ms + eps)
    return _affine(y, axes, gamma, beta)


def group_norm(x, groups, axis, eps, gamma=None, beta=None):
    """Loops over examples and groups: slices, not reshapes."""
    x = np.asarray(x, np.float64)
    axis = axis % x.ndim
    channels = x.shape[axis]
    size = channels // groups
    y = np.empty_like(x)
    for n in range(x.shape[0]):
        for g in range(groups):
            index = [n] + [slice(None)] * (x.ndim - 1)
            index[axis] = slice(g * size, (g + 1) * size)
            block = x[tuple(index)]
            y[tuple(index)] = (block - block.mean()) / np.sqrt(block.var() + eps)
    return _affine(y, (axis,), gamma, beta)


def instance_norm(x, axis, eps, gamma=None, beta=None):
    x = np.asarray(x, np.float64)
    axis = axis % x.ndim
    spatial = tuple(a for a in range(1, x.ndim) if a != axis)
    mean = x.mean(axis=spatial, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=spatial, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return _affine(y, (axis,), gamma, beta)
