"""Replacing a `WeightNorm` wrapper by the plain layer it computes.

At inference the reparameterization `g * v / ||v||` is a constant: computing
it once (docs/design.md §6) leaves the exported graph with the wrapped layer's
own ops and nothing else. The work is `WeightNorm.remove`; this adds the
checks the folding pass wants before it.
"""

from __future__ import annotations

import keras

from kerasnorm.norms.weight_norm import WeightNorm


def unwrap_weight_norm(wrapper: WeightNorm) -> keras.layers.Layer:
    """The plain layer a built `WeightNorm` computes at inference
    (`WeightNorm.remove`); the wrapper itself is left untouched."""
    if not isinstance(wrapper, WeightNorm):
        raise ValueError(
            "`unwrap_weight_norm` expects a `kerasnorm.WeightNorm`. "
            f"Received: wrapper={wrapper!r} (class {type(wrapper).__name__})"
        )
    if not wrapper.built:
        raise ValueError(
            "`unwrap_weight_norm` needs a built `WeightNorm` (call it or build "
            f"it first). Received: wrapper={wrapper.name!r}, built=False"
        )
    return wrapper.remove()
