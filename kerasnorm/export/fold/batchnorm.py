"""`fold_batchnorm`: inference-mode BatchNormalization merged into adjacent
linear layers (docs/design.md §4), checked against the original.

The steps, one module each of this package:

- `plan`: which BN folds into which layer, and why the others stay;
- `affine`: which norm's gain and offset fold into the linear layers
  after it (a float32 `.tflite` file's extra pass, `fold_unchecked(...,
  affines=True)`);
- `fold_math`: BN's scale and shift, and the fold after / before a layer;
- `rewrite`: the rebuilt graph and the folded layers' weights
  (`weight_norm`: a WeightNorm replaced by its plain layer);
- `check`: the self-check (and its float64 re-check);
- `report`: `FoldReport`, `FoldedBN`, `KeptBN`, `FoldVerificationError`.
"""

from __future__ import annotations

import keras

from kerasnorm.export.fold.check import SelfCheck
from kerasnorm.export.fold.report import FoldedBN as FoldedBN
from kerasnorm.export.fold.report import FoldReport
from kerasnorm.export.fold.report import FoldVerificationError as FoldVerificationError
from kerasnorm.export.fold.report import KeptBN as KeptBN
from kerasnorm.export.fold.rewrite import fold_unchecked
from kerasnorm.export.inputs.data import InputSpec
from kerasnorm.export.inputs.data import sample_inputs
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.facts import check_model
from kerasnorm.export.numerics import precision


def fold_batchnorm(
    model: keras.Model,
    *,
    return_report: bool = False,
    verify_inputs=None,
    tolerance: float | None = None,
) -> keras.Model | tuple[keras.Model, FoldReport]:
    """A copy of `model` with every foldable BatchNormalization merged away.

    Works on Functional and Sequential models, nested models, several inputs
    and outputs. BNs that cannot be folded exactly (activation in between,
    several consumers, axis not the channel axis, "same" padding with a
    non-zero shift, shared layers, training mode) stay in place and are listed
    in the report with the reason.

    The result is checked: both models run on `verify_inputs` and must agree
    within `tolerance` of each output's scale. When they do not, or when the
    model computes in float16 / bfloat16, both are rebuilt in float64 with
    the same weights, folded and compared again
    ([Design §4](../design.md#4-batchnorm-at-inference-and-folding-it-away)): float
    rounding alone cannot pass the first comparison and fail that one, a
    wrong fold fails both. `FoldVerificationError` then names the layers
    whose outputs diverge first and gives both figures; the report has them
    too. Each run starts from, and leaves, the state the models had (a
    stateful RNN's states, non-trainable variables).

    The folded model is meant for inference and export. It shares the layers
    that folding leaves unchanged with `model` (the same objects, so every
    piece of their state carries over exactly); `model` itself is never
    modified, but training the folded copy would train those shared layers.

    Args:
        model: a built Functional or Sequential Keras model. Never modified.
        return_report: also return the `FoldReport`. Defaults to `False`.
        verify_inputs: model inputs (any structure `model` accepts) for the
            self-check. Defaults to `None`: two standard-normal samples of the
            input spec, integers below the smallest `Embedding.input_dim` (2
            without one), undefined dimensions 32, else the first of 16, 8,
            4, 2, 1 the model runs on.
        tolerance: allowed max |folded - original| / max |original| per
            output. Defaults to `None`: 1e-5, or 1e-2 / 5e-2 when a layer
            computes in float16 / bfloat16; the float64 re-check allows 1e-5.

    Returns:
        The folded model, or `(folded_model, report)` with `return_report=True`.

    Example:

    ```python
    folded, report = fold_batchnorm(model, return_report=True)
    print(report)  # BatchNorm folding: 3 folded, 1 kept ...
    ```
    """
    check_model(model, needs_graph=True)
    folded, report = fold_unchecked(model)
    layers = list(all_layers(model))
    if verify_inputs is None:
        flat = sample_inputs(model, 2, layers=layers)
        verify_inputs = InputSpec.of(model).pack(flat)
    check = SelfCheck(
        model,
        folded,
        report,
        tolerance,
        compute_dtype=precision.compute_dtype(model),
        layers=layers,
    )
    check.run(verify_inputs)
    return (folded, report) if return_report else folded
