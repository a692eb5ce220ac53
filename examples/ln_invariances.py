"""The invariances of BatchNorm, WeightNorm and LayerNorm, measured.

Table 1 of the LayerNorm paper (Ba et al., 2016, §5.1) lists which
re-parametrizations leave each method's normalized summed inputs unchanged.
This script applies each transformation to random weights and data and
measures the change of the layer's output, in float64:

    summed inputs: a = x W (W: inputs x units, no bias before the norm).
    BatchNorm: keras BatchNormalization in training mode (statistics of the
           batch of cases, per unit).
    WeightNorm: kerasnorm WeightNorm around Dense (kernel v = W, gain g;
           y = x (g v / ||v||), per unit).
    LayerNorm: kerasnorm LayerNorm (statistics of each case, over the units).

    weight matrix re-scaling:     W -> 3.7 W
    weight matrix re-centering:   W -> W + c 1^T (the same vector c added to
                                  every unit's incoming weights)
    weight vector re-scaling:     w_0 -> 3.7 w_0 (one unit's weights only)
    dataset re-scaling:           x_n -> 3.7 x_n for every case n
    dataset re-centering:         x_n -> x_n + c for every case n
    single training case re-scaling: x_0 -> 3.7 x_0 (one case only)

A transformation is "invariant" when the largest change, relative to the
largest output, is below 1e-6 in every seed (epsilon is 1e-12, so float64
round-off is the only difference), and "no" when it is above 1e-3. The table is
printed beside the paper's and written as PNG and JSON.

Run (seconds; `--smoke` runs the same thing):

    python examples/ln_invariances.py --out docs/examples
"""

import _common
import keras
import numpy as np

import kerasnorm

NAME = "ln_invariances"
EPSILON = 1e-12
SCALE = 3.7
# Ba et al. (2016), Table 1: True = invariant.
PAPER = {
    "BatchNorm": (True, False, True, True, True, False),
    "WeightNorm": (True, False, True, False, False, False),
    "LayerNorm": (True, True, False, True, False, True),
}
TRANSFORMS = (
    "weight matrix re-scaling",
    "weight matrix re-centering",
    "weight vector re-scaling",
    "dataset re-scaling",
    "dataset re-centering",
    "single training case re-scaling",
)


def batch_norm(inputs, units):
    layer = keras.layers.BatchNormalization(epsilon=EPSILON, dtype="float64")
    return lambda x, w: layer(x @ w, training=True)


def weight_norm(inputs, units):
    layer = kerasnorm.layers.WeightNorm(
        keras.layers.Dense(units, use_bias=False, dtype="float64"),
        data_init=False,
        dtype="float64",
    )
    layer.build((None, inputs))

    # The gain g stays what it is; only the direction's kernel v changes.
    def call(x, w):
        layer.layer.kernel.assign(w)
        return layer(x)

    return call


def layer_norm(inputs, units):
    layer = kerasnorm.layers.LayerNorm(epsilon=EPSILON, dtype="float64")
    return lambda x, w: layer(x @ w)


# Each builds one layer, so that both calls of a comparison share its weights.
METHODS = {"BatchNorm": batch_norm, "WeightNorm": weight_norm, "LayerNorm": layer_norm}


def transformed(name, x, w, rng):
    """(x, w) after the named transformation."""
    x, w = x.copy(), w.copy()
    shift_x = rng.normal(size=x.shape[1])
    shift_w = rng.normal(size=(w.shape[0], 1))
    if name == "weight matrix re-scaling":
        w *= SCALE
    elif name == "weight matrix re-centering":
        w += shift_w
    elif name == "weight vector re-scaling":
        w[:, 0] *= SCALE
    elif name == "dataset re-scaling":
        x *= SCALE
    elif name == "dataset re-centering":
        x += shift_x
    elif name == "single training case re-scaling":
        x[0] *= SCALE
    return x, w


def relative_change(method, x, w, name, rng):
    normalized = method(*w.shape)
    before = keras.ops.convert_to_numpy(normalized(x, w))
    after = keras.ops.convert_to_numpy(normalized(*transformed(name, x, w, rng)))
    return float(np.max(np.abs(after - before)) / np.max(np.abs(before)))


def measure(seeds, cases=16, inputs=10, units=12):
    """Largest relative change over the seeds, per method and transformation."""
    changes = {m: {t: 0.0 for t in TRANSFORMS} for m in METHODS}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(cases, inputs))
        w = rng.normal(size=(inputs, units))
        for m, method in METHODS.items():
            for t in TRANSFORMS:
                change = relative_change(method, x, w, t, rng)
                changes[m][t] = max(changes[m][t], change)
    return changes


def verdict(change):
    if change < 1e-6:
        return "invariant"
    if change > 1e-3:
        return "no"
    return "unclear"


def table(changes):
    width = max(map(len, TRANSFORMS))
    lines = [f"{'':<{width}}  " + "".join(f"{m:>24}" for m in METHODS)]
    for i, t in enumerate(TRANSFORMS):
        row = f"{t:<{width}}  "
        for m in METHODS:
            measured = verdict(changes[m][t])
            paper = "invariant" if PAPER[m][i] else "no"
            mark = "" if measured == paper else " (paper: " + paper + ")"
            row += f"{measured + mark:>24}"
        lines.append(row)
    return "\n".join(lines)


def plot(changes):
    plt = _common.pyplot()
    values = np.array([[changes[m][t] for t in TRANSFORMS] for m in METHODS])
    logs = np.log10(np.maximum(values, 1e-17))
    fig, ax = plt.subplots(figsize=(11, 3.4))
    image = ax.imshow(logs, cmap="RdYlGn_r", vmin=-17, vmax=1, aspect="auto")
    for i, m in enumerate(METHODS):
        for j, t in enumerate(TRANSFORMS):
            measured = verdict(changes[m][t])
            paper = "invariant" if PAPER[m][j] else "no"
            ax.text(
                j,
                i,
                f"{measured}\n{values[i, j]:.0e}\npaper: {paper}",
                ha="center",
                va="center",
                fontsize=8,
            )
    ax.set_xticks(
        range(len(TRANSFORMS)), [t.replace(" re-", "\nre-") for t in TRANSFORMS]
    )
    ax.set_yticks(range(len(METHODS)), list(METHODS))
    ax.tick_params(labelsize=8)
    fig.colorbar(image, ax=ax, label="log10 relative change")
    ax.set_title("LN paper Table 1, measured: largest relative change of the output")
    fig.tight_layout()
    return fig


def main():
    args = _common.parser(__doc__, NAME).parse_args()
    changes = measure(args.seeds)
    print(table(changes))
    measured = {m: {t: verdict(changes[m][t]) for t in TRANSFORMS} for m in METHODS}
    agree = {
        m: {
            t: measured[m][t] == ("invariant" if PAPER[m][i] else "no")
            for i, t in enumerate(TRANSFORMS)
        }
        for m in METHODS
    }
    all_agree = all(all(row.values()) for row in agree.values())
    print("every entry matches the paper" if all_agree else "MISMATCH with the paper")
    results = {
        "relative_change": changes,
        "measured": measured,
        "paper": {
            m: {
                t: "invariant" if v else "no"
                for t, v in zip(TRANSFORMS, row, strict=True)
            }
            for m, row in PAPER.items()
        },
        "verdict": {"matches_paper": agree, "all_match": all_agree},
    }
    _common.save(args, NAME, plot(changes), results)


if __name__ == "__main__":
    main()
