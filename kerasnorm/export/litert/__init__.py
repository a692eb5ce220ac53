"""TFLite conversion and LiteRT execution of Keras models.

The building blocks under `to_tflite` and `verify`, public for code that runs
`.tflite` files from Python (benchmarks, accuracy checks, layer tests):

- `convert(model, ...)`: flatbuffer bytes with one `serving_default`
  signature, its inputs and outputs named as the SavedModel's
  (`signature_names(model)`: the Input names, or a dict model's keys, and
  the output layers' names; `input_<i>` / `output_<i>` where the model
  gives no usable name), builtin ops only, variables frozen into constants.
  No parity check: `to_tflite` adds that.
- `Runner(content)`: calls the signature with float arrays, quantizing and
  dequantizing int8 inputs/outputs; `Runner.predict` batches many samples.
  Arrays are matched by name (a dict) or in `Runner.input_names` order.
- `StreamingRunner(content)`: runs a streaming step file (`to_tflite(...,
  streaming=True)`) one frame per `step`, carrying the states; `reset()`.
- `Generator(content)`: greedy or top-k generation from a generative file
  (`to_litert_lm`): `generate(prompt_ids, max_new_tokens)`. Its signatures
  share one XNNPACK-packed copy of the weights (LiteRT's `CompiledModel`
  with an in-memory weight cache) where the installed ai-edge-litert has
  that option, else they run on one interpreter.
- `run(content, inputs)`, `op_counts(content)`, `op_names(content)`.

```
from kerasnorm.export import litert

content = litert.convert(model)
outputs = litert.Runner(content).predict(x)  # a list, one array per output
assert not any(op.startswith("Flex") for op in litert.op_names(content))
```
"""

from kerasnorm.export.litert.convert import convert
from kerasnorm.export.litert.convert import signature_names
from kerasnorm.export.litert.generator import Generator
from kerasnorm.export.litert.runner import Runner
from kerasnorm.export.litert.runner import StreamingRunner
from kerasnorm.export.litert.runner import op_counts
from kerasnorm.export.litert.runner import op_names
from kerasnorm.export.litert.runner import run
from kerasnorm.export.naming.names import SIGNATURE_KEY

__all__ = [
    "SIGNATURE_KEY",
    "Generator",
    "Runner",
    "StreamingRunner",
    "convert",
    "op_counts",
    "op_names",
    "run",
    "signature_names",
]
