"""Quantization-aware training: `quantize_aware` (`aware`) and the
`tf_keras` bridge it needs (`bridge`)."""
