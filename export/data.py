"""The export benchmarks' data: scikit-learn's digits and seeded synthetic tasks.

Every benchmark that trains does it on one of these, so that its accuracy
figures compare across scripts and runs: the digits (8x8 images, values in
[0, 1], an 80/20 split after a seeded shuffle, as `kerasnorm demo` trains
them), the digits' rows as 8-step sequences, and two sequence tasks whose
answer needs the recurrent state.
"""

import numpy as np


def digits(seed=0):
    """scikit-learn's digits as `(x_train, y_train, x_test, y_test)`, `x`
    of shape `(n, 8, 8, 1)` in [0, 1]; an 80/20 split after a shuffle seeded
    by `seed`."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise SystemExit(
            "The export benchmarks train on scikit-learn's digits: "
            'pip install "kerasnorm[examples]" (or scikit-learn).'
        ) from err
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def digits_rows(seed=0):
    """The digits as sequences: 8 steps (the rows) of 8 features."""
    x_train, y_train, x_test, y_test = digits(seed)
    return x_train[..., 0], y_train, x_test[..., 0], y_test


def running_sum(n_train, n_test, steps, seed=0):
    """Is the sum of feature 0 over all `steps` positive? Feature 1 is noise
    the model has to ignore; the answer needs the whole sequence. As
    `(x_train, y_train, x_test, y_test)`, `x` of shape `(n, steps, 2)`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_train + n_test, steps, 2)).astype("float32")
    y = (x[..., 0].sum(axis=1) > 0).astype("int32")
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def cumulative_sum(n, steps, seed):
    """Four features per step; the targets are the running sums of the first
    two, scaled by 1/sqrt(steps): a regression that needs the state at every
    step. `(x, y)`, shapes `(n, steps, 4)` and `(n, steps, 2)`."""
    x = np.random.default_rng(seed).standard_normal((n, steps, 4)).astype("float32")
    return x, np.cumsum(x[..., :2], axis=1) / np.sqrt(steps)


def upsample(x, steps):
    """Sequences `(n, time, features)` resampled to `steps` steps by linear
    interpolation along time."""
    source = np.linspace(0, 1, x.shape[1])
    target = np.linspace(0, 1, steps)
    flat = x.transpose(0, 2, 1).reshape(-1, x.shape[1])
    out = np.stack([np.interp(target, source, row) for row in flat])
    return out.reshape(x.shape[0], x.shape[2], steps).transpose(0, 2, 1)


def uniform_images(rng, n, side):
    """`n` random `side` x `side` RGB images in [-1, 1], float32."""
    return rng.uniform(-1, 1, (n, side, side, 3)).astype("float32")
