"""int8 streaming step files whose error does not grow with the stream.

A full-integer step rounds the recurrent state to int8 at every step and
the rounding compounds; keeping the cell's elementwise math in float and
only the matmuls in int8 holds the error, still one XNNPACK partition. The
int8 matmul inputs are calibrated on the states the float step reaches, a
few thousand steps of them (`modes.CALIBRATION_STEPS`). docs/design.md §11
has the figures.
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
