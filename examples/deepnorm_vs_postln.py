"""Deep narrow encoder stacks: Post-LN vs DeepNorm (vs Pre-LN), same schedule.

The DeepNet paper (Wang et al., 2022) reports that Post-LN transformers
become untrainable as depth grows, and that DeepNorm (residual scaled by
alpha, sub-layer weights initialized with gain beta, docs/design.md §3) fixes it
without touching the learning rate or adding warm-up. This script trains the
same encoder stack three ways on a synthetic task and plots loss vs step:

    task: reverse a sequence of random tokens (vocab 16, length 12); the loss
          at chance is ln(16) = 2.77, and only attention can solve it.
    model: token + position embedding, `--depth` TransformerEncoderBlocks of
          width `--width`, a Dense read-out per position (Pre-LN adds the
          final norm a Pre-LN stack needs).
    optimizer: Adam at a constant `--lr`, no warm-up, no clipping.

Run (about 8 minutes on 2 CPU cores with the defaults, most of it tracing
the 48-block training step, ~1.5 minutes per model; `--variants post
deepnorm` skips the Pre-LN reference; `--smoke`: 2 blocks, 3 steps):

    python examples/deepnorm_vs_postln.py --out docs

writes deepnorm_vs_postln.png and deepnorm_vs_postln.json to `--out`.
"""

import argparse
import json
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import kerasnorm

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=48)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=16)
    parser.add_argument(
        "--lr", type=float, nargs="+", default=[1e-3], help="one curve set per LR"
    )
    parser.add_argument("--variants", nargs="+", default=["post", "deepnorm", "pre"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--jit",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="XLA-compile the train step (compiling a deep stack takes long on CPU)",
    )
    parser.add_argument(
        "--out",
        default=os.path.join(HERE, "output", "deepnorm_vs_postln"),
        help="directory for deepnorm_vs_postln.png and .json",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="2 blocks, 3 steps: checks it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.depth, args.steps = 2, 3
    return args


def batches(args):
    rng = np.random.default_rng(args.seed)
    for _ in range(args.steps):
        x = rng.integers(0, args.vocab, size=(args.batch, args.seq))
        yield x, x[:, ::-1]


def build_model(args, position):
    tokens = keras.Input((args.seq,), dtype="int32")
    x = keras.layers.Embedding(args.vocab, args.width)(tokens)
    positions = keras.ops.arange(args.seq)[None]
    x = x + keras.layers.Embedding(args.seq, args.width)(positions)
    for _ in range(args.depth):
        x = kerasnorm.TransformerEncoderBlock(
            num_heads=args.heads,
            key_dim=args.width // args.heads,
            intermediate_dim=4 * args.width,
            norm_position=position,
            num_layers=args.depth,
        )(x)
    if position == "pre":
        x = kerasnorm.LayerNorm()(x)
    logits = keras.layers.Dense(args.vocab)(x)
    return keras.Model(tokens, logits)


def train(args, position, lr):
    keras.utils.set_random_seed(args.seed)
    model = build_model(args, position)
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=args.jit,
    )
    losses, accuracies = [], []
    start = time.perf_counter()
    for step, (x, y) in enumerate(batches(args)):
        if step == 1:
            start = time.perf_counter()  # step 0 includes tracing
        loss, accuracy = model.train_on_batch(x, y)
        losses.append(loss)
        accuracies.append(accuracy)
        if not math.isfinite(loss):
            break
    return np.array(losses), np.array(accuracies), time.perf_counter() - start


def summarize(losses, accuracies, window=20):
    last = slice(-window, None)
    finite = losses[np.isfinite(losses)]
    return {
        "steps": len(losses),
        "diverged": not np.all(np.isfinite(losses)),
        "final_loss": float(np.mean(finite[last])) if len(finite) else math.nan,
        "final_accuracy": float(np.mean(accuracies[last])),
        "max_loss": float(np.max(finite)) if len(finite) else math.nan,
    }


def plot(results, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs = sorted({lr for _, lr in results})
    fig, axes = plt.subplots(
        1, len(lrs), figsize=(6 * len(lrs), 4), squeeze=False, sharey=True
    )
    colors = {"post": "tab:red", "deepnorm": "tab:blue", "pre": "tab:gray"}
    labels = {"post": "Post-LN", "deepnorm": "DeepNorm", "pre": "Pre-LN"}
    for ax, lr in zip(axes[0], lrs, strict=True):
        for (position, run_lr), (losses, _, _) in results.items():
            if run_lr != lr:
                continue
            ax.plot(losses, color=colors[position], label=labels[position], lw=1)
        ax.axhline(math.log(args.vocab), color="k", ls=":", lw=0.8, label="chance")
        ax.set_title(f"{args.depth} blocks, width {args.width}, Adam lr={lr:g}")
        ax.set_xlabel("step")
        ax.set_ylim(0, 2 * math.log(args.vocab))
        ax.legend()
    axes[0][0].set_ylabel("training loss (reverse a sequence)")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "deepnorm_vs_postln.png"), dpi=80)


def main():
    args = parse_args()
    results, summaries = {}, []
    for lr in args.lr:
        for position in args.variants:
            losses, accuracies, seconds = train(args, position, lr)
            results[(position, lr)] = (losses, accuracies, seconds)
            s = summarize(losses, accuracies)
            summaries.append({"variant": position, "lr": lr, "seconds": seconds, **s})
            print(
                f"{position:>8} lr={lr:g}: {s['steps']} steps in {seconds:.0f}s, "
                f"final loss {s['final_loss']:.3f}, final accuracy "
                f"{s['final_accuracy']:.3f}, max loss {s['max_loss']:.2f}"
                + (", DIVERGED (non-finite loss)" if s["diverged"] else ""),
                flush=True,
            )
    os.makedirs(args.out, exist_ok=True)
    plot(results, args)
    with open(os.path.join(args.out, "deepnorm_vs_postln.json"), "w") as f:
        config = {k: v for k, v in vars(args).items() if k != "out"}
        json.dump({"config": config, "runs": summaries}, f, indent=1)
    print(f"chance loss ln({args.vocab}) = {math.log(args.vocab):.3f}")
    print(f"plot and numbers: {args.out}")


if __name__ == "__main__":
    main()
