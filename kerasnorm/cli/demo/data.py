"""The demo's data: scikit-learn's bundled 8x8 digits (no download)."""


def load_digits(seed=0):
    """scikit-learn's digits as (x_train, y_train, x_test, y_test), x in [0, 1].

    `x` has shape `(n, 8, 8, 1)`; an 80/20 split after a seeded shuffle.
    """
    import numpy as np

    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as err:
        raise SystemExit(
            "The demo trains on scikit-learn's digits: "
            'pip install "kerasnorm[examples]"'
        ) from err
    data = sk_load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]
