"""tensorflow-model-optimization `QuantizeConfig`s for the legacy layers.

Importing this module imports TFMOT, which sets `TF_USE_LEGACY_KERAS=1`;
`kerasnorm.export.quantize_aware` imports it through a guard that restores
the variable (docs/guides/qat.md).
"""

import tensorflow_model_optimization as tfmot
import tf_keras

_register = tf_keras.saving.register_keras_serializable(package="kerasnorm")


@_register
class NormOutputQuantizeConfig(tfmot.quantization.keras.QuantizeConfig):
    """Quantize a normalization layer's output, keep its computation float.

    The output gets TFMOT's activation quantizer (8 bits, per tensor,
    asymmetric, range from a moving average), as TFMOT gives every layer that
    computes new values (`Add`, `ReLU`, pooling): the layer that follows reads
    int8 values in the range training saw. `gamma` and `beta` get no weight
    quantizer: they scale and shift per channel after the statistics, and
    the converter stores them as the constants of the int8 `MUL`/`ADD`, whose
    ranges it takes from the values themselves. The statistics (mean,
    variance, `rsqrt`) are not simulated in training; the converter
    quantizes them from the calibration data (docs/guides/qat.md says why that is
    the better trade).
    """

    def get_weights_and_quantizers(self, layer):
        return []

    def get_activations_and_quantizers(self, layer):
        return []

    def set_quantize_weights(self, layer, quantize_weights):
        pass

    def set_quantize_activations(self, layer, quantize_activations):
        pass

    def get_output_quantizers(self, layer):
        return [
            tfmot.quantization.keras.quantizers.MovingAverageQuantizer(
                num_bits=8, per_axis=False, symmetric=False, narrow_range=False
            )
        ]

    def get_config(self):
        return {}


@_register
class FloatQuantizeConfig(NormOutputQuantizeConfig):
    """Simulate no quantization in the layer: training sees it in float.

    The int8 converter still quantizes the layer, with ranges calibrated on
    the representative data rather than learned.
    """

    def get_output_quantizers(self, layer):
        return []
