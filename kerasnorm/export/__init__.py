"""Export: BatchNorm folding, SavedModel for TF Serving, TFLite, parity checks.

- `fold_batchnorm(model)`: a copy of the model with BatchNorm merged into the
  adjacent linear layers
  ([Design §4](../design.md#4-batchnorm-at-inference-and-folding-it-away)),
  with a `FoldReport` of what was left, checked against the original
  (`FoldVerificationError` if it differs).
- `export(model, path, format="tf_saved_model"|"litert", **options)`: the
  one door, named as Keras' `Model.export`; `EXPORT_FORMATS` lists the
  formats, `options_for_file` the options of one file of several written
  with the same values (the command line's flags). `to_saved_model` and
  `to_tflite` are its documented shortcuts:
- `to_saved_model(model, path)`: `<path>/<version>/` with a `serving_default`
  signature, verified against the Keras model.
- `to_tflite(model, path, quantize=None|"float16"|"dynamic"|"int8"|"int16x8")`:
  a builtin-ops `.tflite`, verified with the LiteRT interpreter; the
  full-integer modes unroll rolled recurrent layers (`max_unroll_steps`).
  `"int8"` keeps the few ops XNNPACK has no int8 kernel for in float
  (`ExportResult.float_ops`) so that it runs as one partition;
  `int8_io=True` gives the integer-only file.
- `streaming=True` on both: one time step of a sequence model per call, the
  recurrent states as named inputs and outputs (`litert.StreamingRunner`).
- `verify(model, artifact)`: errors, op counts, size and latency of an
  export, and for a `.tflite` file its XNNPACK partitions (`Delegation`);
  `output_errors(got, expected)`: the same error metrics for any outputs.
- `model_inputs(model, data)`: user data (an array, a list, a dict or `.npz`
  archive by input name, a dataset) as the inputs the model takes, in its
  own structure, checked; what every export does with `verify_inputs` and
  `representative_data`.
- `quantize_aware(model)`: a tensorflow-model-optimization QAT copy of a
  `tf_keras` or Keras 3 model (`to_tf_keras` rebuilds the latter), which
  `to_tflite(..., quantize="int8")` turns into a real int8 file (`qat`
  extra; [Quantization-aware training](../guides/qat.md)).
- `to_litert_lm(model, path, max_sequence_length=...)`: a decoder LM
  (keras-hub CausalLM, or kerasnorm decoder blocks) as a generative file:
  `prefill` / `decode` signatures over per-layer key/value caches, the
  layout LiteRT-LM's engine reads, verified token by token against the
  model's full forward pass; `litert.Generator` generates from it.
  `cached_multi_head_attention` runs a `MultiHeadAttention` over such a
  cache, for the `cached_step` of a decoder block of your own.
- `write_lora_adapter(model, "task.tflite")`: a fine-tuned model's LoRA
  adapters as the file LiteRT-LM's engine feeds the base file
  `to_litert_lm(base, path, lora="runtime")` wrote, per conversation.
- `to_litert_embedder(embedder, "x.litertlm", sequence_lengths=...)`: a
  keras-hub `TextEmbedder` as a bundle LiteRT-LM's `EmbeddingEngine` runs
  (one text-encoder signature per length), checked against the embedder.
- `litert`: the conversion and LiteRT runner under `to_tflite` and `verify`
  (`litert.convert`, `litert.Runner`, `litert.op_names`, ...), for running
  `.tflite` files from Python.

Every export is written to a temporary path, verified, and only then moved
into place; existing files are replaced only with `overwrite=True`.

Inside, one folder per format (`tflite`, `saved_model`: the documented
shortcut and the writer) above the stages they share: the one door
(`pipeline.door`) reads the format's row in the table of formats
(`options.formats`), checks the arguments once into an `ExportOptions`
(`options.export_options`; each option declared once, `options.declared`;
the one table of quantize modes, `options.modes`), then `prepare` (the
model prepared once), the format's writer, then `verify` (`pipeline.run`;
[Design §0](../design.md#0-package-layout)).
"""

from kerasnorm._core.dependencies import require_tensorflow

require_tensorflow("kerasnorm.export", extra="export")

from kerasnorm.export import litert
from kerasnorm.export.fold import FoldReport
from kerasnorm.export.fold import FoldVerificationError
from kerasnorm.export.fold import fold_batchnorm
from kerasnorm.export.inputs.data import VERIFY_SAMPLES
from kerasnorm.export.inputs.data import model_inputs
from kerasnorm.export.litert_lm.embedder import EmbedderExport
from kerasnorm.export.litert_lm.embedder import to_litert_embedder
from kerasnorm.export.litert_lm.export import GenerativeExport
from kerasnorm.export.litert_lm.export import to_litert_lm
from kerasnorm.export.litert_lm.graph_attention import cached_multi_head_attention
from kerasnorm.export.litert_lm.lora_adapter import LoraAdapter
from kerasnorm.export.litert_lm.lora_adapter import write_lora_adapter
from kerasnorm.export.numerics.errors import ExportConversionError
from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.numerics.metrics import output_errors
from kerasnorm.export.options.export_options import options_for_file
from kerasnorm.export.options.formats import EXPORT_FORMATS
from kerasnorm.export.options.modes import DEFAULT_TOLERANCE
from kerasnorm.export.options.modes import QUANTIZE_MODES
from kerasnorm.export.pipeline.door import export
from kerasnorm.export.pipeline.result import ExportResult
from kerasnorm.export.qat.aware import quantize_aware
from kerasnorm.export.qat.bridge import to_tf_keras
from kerasnorm.export.saved_model.export import to_saved_model
from kerasnorm.export.tflite.export import to_tflite
from kerasnorm.export.verify.delegation import Delegation
from kerasnorm.export.verify.verification import Verification
from kerasnorm.export.verify.verifier import verify

__all__ = [
    "DEFAULT_TOLERANCE",
    "EXPORT_FORMATS",
    "QUANTIZE_MODES",
    "VERIFY_SAMPLES",
    "Delegation",
    "EmbedderExport",
    "ExportConversionError",
    "ExportResult",
    "ExportVerificationError",
    "FoldReport",
    "FoldVerificationError",
    "GenerativeExport",
    "LoraAdapter",
    "Verification",
    "cached_multi_head_attention",
    "export",
    "fold_batchnorm",
    "litert",
    "model_inputs",
    "options_for_file",
    "output_errors",
    "quantize_aware",
    "to_litert_embedder",
    "to_litert_lm",
    "to_saved_model",
    "to_tf_keras",
    "to_tflite",
    "verify",
    "write_lora_adapter",
]
