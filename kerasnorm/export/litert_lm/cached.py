"""What every cached step of a decoder LM is (`CachedModel`), and the error
raised where one cannot be written (`CachePathError`): the base the
keras-hub step (`hub_step`), the functional-graph step (`graph_step`) and
the dispatcher (`steps`) share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


class CachePathError(ValueError):
    """The model has a layer a cached step cannot be written through."""


@dataclasses.dataclass
class CachedModel:
    """What the writer and the runner need of a decoder LM.

    `cache_shapes[i]` is `(g, d)` of layer `i` (the cache is `(1, g, L, d)`);
    `step(tokens (1, T), positions (T,), caches, last=False)` returns
    `(logits (1, T, vocab), caches)`, `caches` a list `[k_0, v_0, k_1, ...]`;
    with `last=True` only the last row goes through the final norm and the
    head: logits `(1, 1, vocab)` (a prefill's head then costs one row). A
    step without `last` has its logits sliced after the head.
    """

    name: str
    cache_shapes: list[tuple[int, int]]
    step: Callable
    vocabulary_size: int
    # The longest context each query may see (sliding-window attention), or
    # None: a cache longer than that would need the window's mask.
    window: int | None = None
    # The products that read one input, computed as one while the step is
    # traced (`fused_products.FusedProduct`).
    fused: tuple = ()
