"""The generative quantize modes (`to_litert_lm`'s `quantize`), one table:
every policy of a mode is read from `GENERATIVE_MODES`, and a new mode is
one row. No other module names a generative mode to decide its policy.

A `GenerativeMode` says how the writer stores the file's weights
(`converter_float16`: the TFLite converter's own float16 pass; else the
flatbuffer pass of `weights.quantize`, with `products` the treatment of each
`FULLY_CONNECTED`'s weights and `lookup` that of each embedding table), the
int4 block sizes it takes, whether its product weights (int4 or int8) are
rounded by GPTQ on calibration inputs (`gptq`), how the check judges the
file (`tolerance`: None is the float32 file's exact check, greedy tokens
equal and logits within 1e-4; else teacher-forced top-1 agreement of at
least `min_agreement` and a relative rms error of at most `tolerance`), and
its name on the command line (`cli_name`; the command's standard-library
copy, `kerasnorm_cli.arguments.GENERATIVE_QUANTIZE_MODES`, is pinned to it
by a test).

Why each tolerance: float16 weights round to 2^-11 (rms ~1 %); int8
weights with dynamic int8 activations lose ~1 % on the tests' small models,
and 11 % on a real one (SmolLM2-135M-Instruct's smoothed `"dynamic"` file:
rms 0.110 at 99.4 % agreement on the check's text, 95 % without its near
ties), so `"dynamic"` is bounded at 0.2 and judged by its agreement;
int4 blocks of 32 round each weight to 1/14 of its block's largest, and
the logits drift ~25 %: what refuses an int4 file is its agreement, the
greedy token lost too often.
"""

from __future__ import annotations

import dataclasses

# The `products` treatments of the weights pass (`weights.quantize`):
# symmetric int8 per output channel, the op quantizing its input per call
# (dynamic range); int4 in blocks along the input dimension, one float16
# scale per block (XNNPACK runs it with dynamic int8 activations); int8 per
# output channel dequantized by a `DEQUANTIZE` op (float32 arithmetic).
INT8_DYNAMIC = "int8_dynamic"
INT4_BLOCKS = "int4_blocks"
INT8_DEQUANTIZED = "int8_dequantized"
PRODUCTS = (INT8_DYNAMIC, INT4_BLOCKS, INT8_DEQUANTIZED)
# The `lookup` treatments of an embedding table (`GATHER` of a float
# table, and a tied head's product that reads the same table): int8 with
# one float scale per row, or the table's int4 blocks (`weights.lookups`).
INT8_ROWS = "int8_rows"
LOOKUPS = (INT8_ROWS, INT4_BLOCKS)
INT4_BLOCK_SIZES = (32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class GenerativeMode:
    """One generative quantize mode's policy (see the module)."""

    name: str | None
    description: str | None
    tolerance: float | None
    min_agreement: float = 1.0
    converter_float16: bool = False
    products: str | None = None
    lookup: str | None = None
    block_sizes: tuple = ()
    default_block: int | None = None
    gptq: bool = False
    # Whether GPTQ (where `gptq`) rounds a tied head's table too, on the
    # head's inputs: the lookup then reads those rows as well. Measured in
    # the int8 modes against the table rounded to nearest
    # (docs/benchmarks.md, "The tied table by GPTQ"): weight-only int8 on
    # both real models, lower KL on the paragraph and on 1,900 held-out
    # steps and higher held-out agreement (SmolLM2 0.959 -> 0.965, Gemma 3
    # 0.970 -> 0.971); `"dynamic"` mixed (SmolLM2's held-out agreement
    # 0.920 -> 0.939, Gemma 3's 0.933 -> 0.929 and its paragraph's
    # perplexity 1.003x -> 1.028x), so off there.
    gptq_tied_head: bool = True
    # `to_litert_lm`'s `smooth` (`litert_lm.smoothing`): None, the mode's
    # products round nothing smoothing moves (`smooth=` refused); False,
    # taken and off by default; True, on by default (where it measures
    # better on the real checkpoints, docs/benchmarks.md "Real models":
    # `"dynamic"` and `"int4"`).
    smooth: bool | None = None
    # The tied head's smoothing (`fold.smooth_head`), on unless `smooth` is
    # False: how the search simulates the head's input ("float": its int8
    # table dequantized; "per_row": quantized per token at run time), or
    # None (not smoothed). Gemma 3 270M, simulated in Keras on the
    # paragraph: the table's int8 rows alone cost 5 points of top-1
    # agreement (0.946); with the head smoothed, weight-only int8 0.936 ->
    # 0.978 (docs/benchmarks.md, "Real models").
    head: str | None = None

    @property
    def cli_name(self):
        """`--quantize MODE` on the command line (None: no flag, float32)."""
        return self.name

    @property
    def exact(self):
        """Whether the check asks for the float32 file's exact agreement."""
        return self.tolerance is None

    @property
    def unpacked(self):
        """Whether LiteRT's XNNPACK holds the file's weights dequantized to
        float32 (float16 weights, int8 weights behind `DEQUANTIZE`), once
        unpacked and once packed for each signature: Gemma 3 270M's 285 MB
        weight-only int8 file takes 3.5 GiB to run so, 1.5 GiB on LiteRT's
        built-in kernels, which is how the check runs such a file
        (docs/benchmarks.md, "Real models")."""
        return self.converter_float16 or self.products == INT8_DEQUANTIZED

    @property
    def pass_mode(self):
        """The mode the flatbuffer weights pass quantizes for (None: it
        only stores identical buffers once)."""
        if self.products is None and self.lookup is None:
            return None
        return self.name

    def block(self, given):
        """The int4 block of an export given `given` (None: the default)."""
        return self.default_block if given is None else given


GENERATIVE_MODES = {
    mode.name: mode
    for mode in (
        GenerativeMode(None, "float32", None),
        GenerativeMode(
            "float16",
            None,
            0.01,
            min_agreement=0.9,
            converter_float16=True,
        ),
        GenerativeMode(
            "dynamic",
            "int8 weights, dynamic-range int8 activations",
            0.2,
            min_agreement=0.9,
            products=INT8_DYNAMIC,
            lookup=INT8_ROWS,
            # GPTQ at int8 (`weights.int_weights.int8_rounding`, the
            # products' inputs on held-out text; a tied table to nearest,
            # `gptq_tied_head`): on the paragraph
            # (docs/benchmarks.md, "Real models"), KL from the float model
            # 0.0191 -> 0.0174 nats a step on Gemma 3 270M, 0.0149 ->
            # 0.0144 on SmolLM2-135M-Instruct.
            gptq=True,
            gptq_tied_head=False,
            # On: with GPTQ rounding the weights that smoothing makes
            # harder, the blocks' smoothing halves the KL (SmolLM2 0.0144
            # -> 0.0084, top-1 agreement 0.938 -> 0.953; Gemma 3 0.0174 ->
            # 0.0095, 0.901 -> 0.949 on the paragraph); rounded to nearest
            # it had measured no better.
            smooth=True,
            head="per_row",
        ),
        GenerativeMode(
            "int4",
            "block-wise int4 weights, dynamic-range int8 activations",
            0.5,
            min_agreement=0.9,
            products=INT4_BLOCKS,
            lookup=INT4_BLOCKS,
            block_sizes=INT4_BLOCK_SIZES,
            default_block=32,
            # GPTQ where a product's calibration rows are enough, else
            # rounded to nearest (`weights.int_weights.int4_rounding`: under
            # 32 rows; the Hessian dampened by a quarter of its trace over
            # the rows). SmolLM2-135M-Instruct off its GGUF grid, calibrated
            # on the check's text (133 rows, every product GPTQ), written at
            # the default check: 0.702 top-1 agreement, perplexity 1.302x,
            # 77.1 MB, the check passed (0.928); rounded to nearest 0.556 /
            # 1.531x, refused; GPTQ at the former fixed damping (1 % of the
            # mean diagonal) 0.709 / 1.385x. A toy model checked on 3 given
            # prompts of 6 tokens (18 rows for inputs of 64 and 128): GPTQ
            # at 1 % agreed 0.87, under the 0.9 rounding to nearest meets,
            # 0.90 with the damping; rounded to nearest under the rule
            # (tests/export/test_int4_blocks.py). Random ids calibrate it
            # worse than rounding to nearest (`litert_lm.calibrate`).
            gptq=True,
            # On, as for `"dynamic"`: off their grid, SmolLM2 0.727 / 1.366x
            # / KL 0.239 -> 0.778 / 1.298x / 0.144, Gemma 3 0.715 / 1.275x
            # -> 0.741 / 1.199x (docs/benchmarks.md, "Real models").
            smooth=True,
        ),
        GenerativeMode(
            "weight_only_int8",
            "int8 weights, float32 arithmetic",
            0.1,
            min_agreement=0.9,
            products=INT8_DEQUANTIZED,
            lookup=INT8_ROWS,
            # Off: a float product's only error is its weights' rounding,
            # which smoothing can only move (SmolLM2-135M-Instruct, every
            # kernel unfolded: 0.982 top-1 agreement unsmoothed, 0.971
            # smoothed in the Keras simulation; docs/benchmarks.md).
            smooth=False,
            # GPTQ at int8, as for `"dynamic"`: KL 0.0037 -> 0.0021 on
            # Gemma 3 270M (its weights' rounding is all this mode loses).
            gptq=True,
            head="float",
        ),
    )
}


def checked_block(quantize, block):
    """`to_litert_lm`'s `int4_block_size` for mode `quantize`: the row's
    default for None; refused by name where the mode takes no block, or
    another."""
    mode = GENERATIVE_MODES[quantize]
    if block is not None and not mode.block_sizes:
        blocked = " or ".join(
            f'quantize="{m.name}"' for m in GENERATIVE_MODES.values() if m.block_sizes
        )
        raise ValueError(
            "to_litert_lm: `int4_block_size` sets the blocks of "
            f"{blocked}; it means nothing with quantize={quantize!r}. "
            f"Received: int4_block_size={block!r}"
        )
    if block is not None and (isinstance(block, bool) or block not in mode.block_sizes):
        raise ValueError(
            f"to_litert_lm: `int4_block_size` is one of {mode.block_sizes}. "
            f"Received: int4_block_size={block!r}"
        )
    return mode.block(block)


def generative_mode(name):
    """The row of mode `name` (KeyError: none)."""
    return GENERATIVE_MODES[name]


def generative_mode_names():
    """The `quantize` values `to_litert_lm` takes, None first."""
    return tuple(GENERATIVE_MODES)


def cli_names():
    """The command line's `--quantize` values for `--format litert_lm`."""
    return tuple(m.cli_name for m in GENERATIVE_MODES.values() if m.cli_name)


def quantize_docs():
    """The `quantize` argument's documentation, from the rows."""
    names = [
        ("`None`" if m.name is None else f'`"{m.name}"`')
        + ("" if m.description is None else f" ({m.description})")
        for m in GENERATIVE_MODES.values()
    ]
    return f"{', '.join(names[:-1])} or {names[-1]}. Defaults to `None`."
