"""int8 streaming step files whose error does not grow with the stream.

A full-integer step file rounds the recurrent state to int8 at every step
and the rounding compounds: a LayerNormLSTM(32) on 28-step digits rows
drifts to rms 0.09 of the logits at 28 steps and 0.21 at 64, however many
steps calibrate it. Keeping the cell's elementwise math in float (the gate
nonlinearities, the state update's products and sums, the norms'
statistics) and only the matmuls in int8 holds it at 0.03 / 0.04: int8
weights, float state, XNNPACK still one partition. The ranges of the int8
matmul inputs are calibrated on the states the float step reaches over
whole sequences, a few thousand steps of them (200 left rms 0.07 at 64
steps). Measured in export/README.md (on-device section).
"""

import numpy as np

from kerasnorm.export import litert
from kerasnorm.export._selective_int8 import FLOAT_OPS
from kerasnorm.export._selective_int8 import SelectiveInt8
from kerasnorm.export._selective_int8 import quantize_selectively

# The cell's elementwise ops: in int8 each step's state would be rounded.
STATE_FLOAT_OPS = (*FLOAT_OPS, "MUL", "ADD", "SUB", "TANH", "LOGISTIC")
CALIBRATION_STEPS = 4000


def state_feed(float_step: bytes, sequences, samples: int = CALIBRATION_STEPS):
    """Calibration feeds of a streaming step file: frames with the states
    the float step reaches there, from zero states over every whole
    sequence, `samples` of them spread evenly over sequences and steps.

    Args:
        float_step: the float32 step file (`to_tflite(..., streaming=True)`).
        sequences: `(n, time, features)` calibration sequences.
        samples: how many (frame, states) feeds. Defaults to
            `CALIBRATION_STEPS`.

    Returns:
        A callable returning an iterator of `{input name: array}` feeds,
        as `quantize_selectively` takes.
    """
    runner = litert.StreamingRunner(float_step)
    batch = runner.batch_size
    sequences = np.asarray(sequences, np.float32)
    usable = len(sequences) // batch * batch
    if usable == 0 or samples < 1:
        raise ValueError(
            f"state_feed needs at least {batch} sequences (the file's batch "
            f"size) and samples >= 1. Received: {len(sequences)} sequences, "
            f"samples={samples}"
        )
    frames, states = [], {name: [] for name in runner.state_names}
    for i in range(0, usable, batch):
        runner.reset()
        for t in range(sequences.shape[1]):
            frame = sequences[i : i + batch, t]
            frames.append(frame)
            for name in runner.state_names:
                states[name].append(runner.states[name].copy())
            runner.step(frame)
    chosen = np.linspace(0, len(frames) - 1, min(samples, len(frames)))
    chosen = chosen.round().astype(int)

    def generate():
        for i in chosen:
            feed = {litert.FRAME: frames[i]}
            feed.update({name: states[name][i] for name in runner.state_names})
            yield feed

    return generate


def quantize_step(
    float_step: bytes, sequences, samples: int = CALIBRATION_STEPS
) -> SelectiveInt8:
    """An int8 step file with a float state: int8 matmuls, the cell's
    elementwise math and the norms' statistics in float.

    Args:
        float_step: the float32 step file (`to_tflite(..., streaming=True)`).
        sequences: `(n, time, features)` calibration sequences.
        samples: calibration feeds (see `state_feed`). Defaults to
            `CALIBRATION_STEPS`.

    Returns:
        A `SelectiveInt8`: the bytes and the ops left in float.
    """
    return quantize_selectively(
        float_step,
        state_feed(float_step, sequences, samples),
        float_ops=STATE_FLOAT_OPS,
    )
