"""One case per public class of `kerasnorm.layers`, shared by the tests that
go through every class: the tf_keras twins (`test_legacy_layers.py`), the
Keras 3 -> tf_keras bridge (`test_qat.py`) and XLA / mixed-precision training
(`test_training_layers.py`).

A new public class fails `tests/test_cases.py` until it has a case here, and
then every one of those tests runs it.

Each case builds a small instance through the public API, with options that
change its computation, from a Keras module: `keras` for the Keras 3 layer,
`tf_keras` for its twin in `kerasnorm.legacy.layers`. A recurrent cell comes
back inside that module's `layers.RNN`, the way it is used.
"""

import dataclasses
from collections.abc import Callable

import kerasnorm.layers

PUBLIC_CLASSES = sorted(
    name
    for name in kerasnorm.layers.__all__
    if isinstance(getattr(kerasnorm.layers, name), type)
)


@dataclasses.dataclass(frozen=True)
class Case:
    """How to build one public class.

    Attributes:
        make: `make(cls, fw)` -> the layer to call, given the class (Keras 3
            or its tf_keras twin) and the Keras module `fw` its arguments
            come from.
        shapes: the shapes of the layer's positional inputs, without the
            batch axis.
        slow_under_xla: its XLA compile takes 10-25 s on a busy 2-core
            machine (time loops, attention), so `test_training_layers.py`
            marks it slow.
        bridge_refused: why `kerasnorm.export.to_tf_keras` refuses the class
            (`test_qat.py` skips it with that reason); empty: it is bridged.
    """

    make: Callable
    shapes: tuple
    slow_under_xla: bool = False
    bridge_refused: str = ""


def _in_rnn(**rnn_kwargs):
    def make(cls, fw):
        return fw.layers.RNN(cls(4), return_sequences=True, **rnn_kwargs)

    return make


SEQUENCE = ((6, 5),)
CASES = {
    "LayerNorm": Case(lambda cls, fw: cls(axis=[1, 2]), ((5, 8),)),
    "RMSNorm": Case(lambda cls, fw: cls(partial=0.5, center=True), ((5, 8),)),
    "GroupNorm": Case(lambda cls, fw: cls(groups=4), ((6, 6, 8),)),
    # Channels first: the statistics run over the last two axes.
    "InstanceNorm": Case(lambda cls, fw: cls(axis=1), ((4, 5, 5),)),
    "WeightNorm": Case(
        lambda cls, fw: cls(fw.layers.Conv1D(4, 3, padding="causal")), ((7, 3),)
    ),
    "LayerNormSimpleRNNCell": Case(
        _in_rnn(go_backwards=True), SEQUENCE, slow_under_xla=True
    ),
    "LayerNormLSTMCell": Case(_in_rnn(), SEQUENCE, slow_under_xla=True),
    "LayerNormGRUCell": Case(_in_rnn(unroll=True), SEQUENCE, slow_under_xla=True),
    "LayerNormSimpleRNN": Case(
        lambda cls, fw: cls(4, return_sequences=True, go_backwards=True),
        SEQUENCE,
        slow_under_xla=True,
    ),
    # Three outputs: the sequence's last output and both states.
    "LayerNormLSTM": Case(
        lambda cls, fw: cls(4, return_state=True), SEQUENCE, slow_under_xla=True
    ),
    "LayerNormGRU": Case(
        lambda cls, fw: cls(4, return_sequences=True, kernel_regularizer="l2"),
        SEQUENCE,
        slow_under_xla=True,
    ),
    "NormResidual": Case(
        lambda cls, fw: cls(fw.layers.Dense(8), "deepnorm", alpha=1.5), ((5, 8),)
    ),
    "TransformerEncoderBlock": Case(
        lambda cls, fw: cls(2, 4, 16, norm_position="deepnorm", num_layers=2),
        ((5, 8),),
        slow_under_xla=True,
    ),
    # Cross-attention: the encoder sequence (another length and width) is the
    # second positional input.
    "TransformerDecoderBlock": Case(
        lambda cls, fw: cls(2, 4, 16, norm_type="rms"),
        ((5, 8), (4, 6)),
        slow_under_xla=True,
    ),
}


# Options of a public class that a single case does not reach but the twin
# and bridge tests must: named "<class>[<variant>]".
VARIANTS = {
    "TransformerEncoderBlock[post]": Case(
        lambda cls, fw: cls(2, 4, 16, norm_position="post"),
        ((5, 8),),
        slow_under_xla=True,
    ),
}

# Every public class once, then the variants.
CASE_NAMES = [*PUBLIC_CLASSES, *sorted(VARIANTS)]


def class_of(name):
    """The public class name of a case name (`"X[variant]"` -> `"X"`)."""
    return name.split("[", 1)[0]


def case(name):
    """The case of public class `name`; fails the test when it has none."""
    if name in VARIANTS:
        return VARIANTS[name]
    if name not in CASES:
        import pytest

        pytest.fail(
            f"kerasnorm.layers.{name} has no case in tests/support/cases.py CASES: "
            "add one, and every test that goes through the public classes "
            "runs it."
        )
    return CASES[name]
