"""The public names of `kerasnorm.export` and `kerasnorm.export.litert`,
whole: a name added or removed is a decision this test makes visible."""

import pytest

from kerasnorm import export
from kerasnorm.export import litert

pytestmark = pytest.mark.tf_only


def test_export_public_names():
    assert sorted(export.__all__) == [
        "DEFAULT_TOLERANCE",
        "Delegation",
        "EXPORT_FORMATS",
        "EmbedderExport",
        "ExportConversionError",
        "ExportResult",
        "ExportVerificationError",
        "FoldReport",
        "FoldVerificationError",
        "GenerativeExport",
        "LoraAdapter",
        "QUANTIZE_MODES",
        "VERIFY_SAMPLES",
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
    assert all(hasattr(export, name) for name in export.__all__)


def test_litert_public_names():
    assert sorted(litert.__all__) == [
        "Generator",
        "Runner",
        "SIGNATURE_KEY",
        "StreamingRunner",
        "convert",
        "op_counts",
        "op_names",
        "run",
        "signature_names",
    ]
    assert all(hasattr(litert, name) for name in litert.__all__)
