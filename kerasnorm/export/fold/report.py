"""What folding reports: the BNs folded and kept, the WeightNorms removed,
the self-check's figures, and the error a failed self-check raises."""

from __future__ import annotations

import dataclasses


class FoldVerificationError(RuntimeError):
    """The folded model does not compute what the original model computes."""


@dataclasses.dataclass(frozen=True)
class FoldedBN:
    """One BatchNormalization merged into a linear layer."""

    batchnorm: str
    into: str
    position: str  # "after" (BN follows the layer) or "before"


@dataclasses.dataclass(frozen=True)
class KeptBN:
    """One BatchNormalization left in place, and why."""

    batchnorm: str
    reason: str


@dataclasses.dataclass(frozen=True)
class FoldedAffine:
    """One norm's gain (and offset) merged into the linear layer its output
    reaches through `through`, layers that commute with a per-channel scale
    (a ReLU, pooling, dropout): what a float32 `.tflite` file folds
    (docs/design.md §4)."""

    norm: str
    into: str
    through: tuple[str, ...] = ()
    offset: bool = False  # the offset folded too, not only the gain


@dataclasses.dataclass
class FoldReport:
    """What `fold_batchnorm` folded and what it left in place.

    Layer names are paths through nested models: `"outer/inner/bn"`.
    """

    folded: list[FoldedBN] = dataclasses.field(default_factory=list)
    kept: list[KeptBN] = dataclasses.field(default_factory=list)
    # Paths of the WeightNorm wrappers replaced by their plain layer.
    weight_norms: list[str] = dataclasses.field(default_factory=list)
    # The norms whose affine folded into the next linear layer.
    affines: list[FoldedAffine] = dataclasses.field(default_factory=list)
    # The self-check: max |folded - original| / max |original| in the
    # model's own precision, the same in float64 when that was re-checked
    # (None when it was not needed), and the shapes of the inputs it ran on.
    check_error: float | None = None
    check_error_float64: float | None = None
    check_shapes: list[tuple] = dataclasses.field(default_factory=list)

    def changes(self) -> int:
        """How many BNs and norm affines were folded and WeightNorms removed."""
        return len(self.folded) + len(self.weight_norms) + len(self.affines)

    def __str__(self) -> str:
        lines = [f"BatchNorm folding: {len(self.folded)} folded, {len(self.kept)} kept"]
        lines += [
            f"  folded {f.batchnorm} -> {f.into} ({f.position})" for f in self.folded
        ]
        lines += [f"  kept   {k.batchnorm}: {k.reason}" for k in self.kept]
        if self.weight_norms:
            lines.append(f"WeightNorm removed: {len(self.weight_norms)}")
            lines += [f"  computed {name}'s kernel once" for name in self.weight_norms]
        if self.affines:
            lines.append(f"Norm affines folded: {len(self.affines)}")
            for f in self.affines:
                what = "gain and offset" if f.offset else "gain"
                path = "".join(f" through {name}" for name in f.through)
                lines.append(f"  folded {f.norm}'s {what} -> {f.into}{path}")
        if self.check_error is not None:
            shapes = ", ".join(str(tuple(shape)) for shape in self.check_shapes)
            line = f"Self-check: max error {self.check_error:.1e} of the output scale"
            if self.check_error_float64 is not None:
                line += f", {self.check_error_float64:.1e} in float64"
            lines.append(f"{line} (inputs {shapes})")
        return "\n".join(lines)
