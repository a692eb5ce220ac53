"""What every example shares: the digits split, the arguments, the outputs,
the side-by-side timing.

Not an example itself (`tests/test_examples.py` skips files starting with
`_`). Each example imports it as `_common`; Python puts the script's own
folder on `sys.path`, so `python examples/<name>.py` works from anywhere.
"""

import argparse
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def parser(doc, name, seeds=3):
    """An argument parser with the options every example takes."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        default=os.path.join(HERE, "output", name),
        help=f"directory for {name}.png and {name}.json (default: %(default)s)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny budget that only checks the script runs end to end",
    )
    p.add_argument(
        "--seeds", type=int, nargs="+", default=list(range(seeds)), help="seeds"
    )
    return p


def digits(flatten=True, smoke=False, seed=0):
    """scikit-learn's 8x8 digits scaled to [0, 1]: 1437 train / 360 test.

    The split is stratified and fixed (`seed`), so every model of an example
    sees the same train and test cases. `smoke` keeps 256 / 128 of them.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.images / 16.0).astype("float32")
    x = x.reshape(len(x), -1) if flatten else x[..., None]
    y = data.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    if smoke:
        return x_train[:256], x_test[:128], y_train[:256], y_test[:128]
    return x_train, x_test, y_train, y_test


def band(ax, x, runs, label, color, **kwargs):
    """Plot the mean of `runs` (one row per seed) with a min/max band."""
    runs = np.asarray(runs, dtype="float64")
    ax.plot(x, runs.mean(axis=0), color=color, label=label, lw=1.4, **kwargs)
    if len(runs) > 1:
        ax.fill_between(x, runs.min(axis=0), runs.max(axis=0), color=color, alpha=0.2)


def spread(values):
    """Mean, min and max of per-seed numbers, for the JSON summary."""
    values = np.asarray(values, dtype="float64")
    return {
        "mean": float(values.mean()),
        "min": float(values.min()),
        "max": float(values.max()),
        "per_seed": [float(v) for v in values],
    }


def save(args, name, fig, results):
    """Write `<out>/<name>.png` and `<out>/<name>.json`; print both paths."""
    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, f"{name}.png")
    fig.savefig(png, dpi=80)
    results = {"smoke": args.smoke, "seeds": args.seeds, **results}
    path = os.path.join(args.out, f"{name}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, allow_nan=True)
        f.write("\n")
    print(f"plot: {png}\nnumbers: {path}")


def interleaved_medians(candidates, rounds):
    """Median seconds of each zero-argument callable in `candidates` (name ->
    callable returning one measurement), over `rounds` rounds that measure
    each once in a rotating order, so that load from other processes hits
    all of them alike (as benchmarks/timing.py does for the benchmarks)."""
    names = list(candidates)
    samples = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(candidates[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
