"""int8 streaming step files whose error does not grow with the stream.

A full-integer step file rounds the recurrent state to int8 at every step
and the rounding compounds: a LayerNormLSTM(32) on 28-step digits rows
drifts to rms 0.09 of the logits at 28 steps and 0.21 at 64, however many
steps calibrate it. Keeping the cell's elementwise math in float (the gate
nonlinearities, the state update's products and sums, the norms'
statistics) and only the matmuls in int8 holds it at 0.03 / 0.04: int8
weights, float state, XNNPACK still one partition. The ranges of the int8
matmul inputs are calibrated on the states the float step reaches over
whole sequences (the pipeline's one calibration feed), a few thousand
steps of them (200 left rms 0.07 at 64 steps), hence `to_tflite`'s
default of `modes.CALIBRATION_STEPS`.
Measured in export/README.md (on-device section).
"""

from kerasnorm.export.tflite.selective import FLOAT_OPS
from kerasnorm.export.tflite.selective import SelectiveInt8
from kerasnorm.export.tflite.selective import quantize_selectively

# The cell's elementwise ops: in int8 each step's state would be rounded.
STATE_FLOAT_OPS = (*FLOAT_OPS, "MUL", "ADD", "SUB", "TANH", "LOGISTIC")


def quantize_step(float_step: bytes, representative_dataset) -> SelectiveInt8:
    """An int8 step file with a float state: int8 matmuls, the cell's
    elementwise math and the norms' statistics in float. `to_tflite` also
    quantizes a whole-sequence file with unrolled recurrent layers this
    way (their state passes from copy to copy of the cell).

    Args:
        float_step: the float32 step file (`to_tflite(..., streaming=True)`).
        representative_dataset: a callable returning an iterator of
            `{signature name: array}` feeds: frames with the states the
            float model reaches there (the pipeline's calibration feed,
            `streaming.step.calibration_feed` through
            `tflite.converter.calibration_feed`), `modes.CALIBRATION_STEPS` of them
            by default in `to_tflite`.

    Returns:
        A `SelectiveInt8`: the bytes and the ops left in float.
    """
    return quantize_selectively(
        float_step, representative_dataset, float_ops=STATE_FLOAT_OPS
    )
