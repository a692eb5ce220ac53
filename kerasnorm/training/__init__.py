"""XLA-compiled training, chosen by measurement, also under tf.distribute.

- `compile(model, *, optimizer, loss, ...)`: `model.compile` with XLA on
  CPU-only machines and under a strategy (each replica's forward and
  backward pass compiled, the update outside XLA), an early error naming a
  layer XLA cannot compile, `jit_compile="norms"` (XLA for the normalization
  layers only) and `jit_compile="measure"` (the fastest of the three).
- `train_step(model, optimizer, loss_fn, ...)`: a compiled step for custom
  loops, with loss scaling under `mixed_float16` and global-norm clipping.

See the [Training guide](../guides/training.md).
"""

from kerasnorm._core.dependencies import require_tensorflow

require_tensorflow("kerasnorm.training")

from kerasnorm.training._compile import XLACompileError
from kerasnorm.training._compile import compile
from kerasnorm.training._compile import jit_compile_mode
from kerasnorm.training._measure import JitMeasurement
from kerasnorm.training._train_step import TrainStep
from kerasnorm.training._train_step import train_step

__all__ = [
    "JitMeasurement",
    "TrainStep",
    "XLACompileError",
    "compile",
    "jit_compile_mode",
    "train_step",
]
