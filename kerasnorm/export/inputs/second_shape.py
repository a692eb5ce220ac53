"""The second shape every check of a dynamic artifact runs at besides the
inputs' own: each dynamic dimension at another size (`second_inputs`), and
a dynamic batch at another batch size (`batch_for_second`), so that a file
that computes right at one size only fails its check."""

from __future__ import annotations

import numpy as np

# Samples run at the second shape of a dynamic artifact.
SECOND_SHAPE_SAMPLES = 4


def dynamic_axes(shape):
    """The axes of an artifact's input shape that are dynamic."""
    return tuple(axis for axis, d in enumerate(shape) if d is None)


def second_inputs(model, spec, arrays, shapes):
    """Inputs at a second shape for the artifact whose input shapes are
    `shapes` (None: dynamic), or None when none of its dimensions is
    dynamic: the first `SECOND_SHAPE_SAMPLES` samples, each dynamic
    dimension of each input at another size than in `arrays` (half of it,
    else one less, else twice it; a size of 1 becomes 2, the input
    repeated). The batch these run at is the caller's (`batch_for_second`).

    The sizes are those `model` runs on: a model may bound a dimension (a
    position embedding) or need it divisible. Raises ValueError, naming the
    input and dimension, when the model runs on none of them.
    """
    axes = [tuple(a for a in dynamic_axes(s) if a > 0) for s in shapes]
    batch_dynamic = any(s[0] is None for s in shapes)
    head = [np.asarray(x[:SECOND_SHAPE_SAMPLES]) for x in arrays]
    if not any(axes):
        return head if batch_dynamic else None
    candidates = (
        [_resized(x, a, choice) for x, a in zip(head, axes, strict=True)]
        for choice in range(3)
    )
    candidate, failures = spec.first_run(model, candidates)
    if candidate is not None:
        return candidate
    where = ", ".join(
        f"input {name!r} dimension {a}"
        for name, a_list in zip(spec.names, axes, strict=True)
        for a in a_list
    )
    raise ValueError(
        f"A dynamic artifact is checked at two shapes of each dynamic "
        f"dimension ({where}), and model {model.name!r} ran on its inputs' "
        "own sizes only (tried half, one less and twice each). Fix the "
        "dimension with input_signature= (a fixed size the artifact takes), "
        f"or check shorter inputs. It raised: {failures[-1]}"
    ) from failures[-1]


def _resized(x, axes, choice):
    for axis in axes:
        size = x.shape[axis]
        if size == 1:
            x = np.concatenate([x, x], axis=axis)
            continue
        new = (size // 2, size - 1, 2 * size)[choice]
        if new > size:
            x = np.concatenate([x, x], axis=axis)
        else:
            x = np.take(x, range(new), axis=axis)
    return x


def batch_for_second(first_batch):
    """The batch of the second-shape calls of an artifact with a dynamic
    batch: another size than `first_batch` (the first calls')."""
    return 1 if first_batch != 1 else 2
