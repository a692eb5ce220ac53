"""Rewrites for the 16x8 quantizer, and the zero-scale check of its output.

The 16x8 quantizer (16-bit activations, 8-bit weights) has no `SQUARE`,
`SQUARED_DIFFERENCE` or `NEG` kernel (TF 2.21). `square_as_mul` rewrites the
traced graph so that `Square(x)` is `Mul(x, x)`, `SquaredDifference(a, b)`
is `Mul(a - b, a - b)` and `Neg(x)` is `Mul(x, -1)`: the same values, in ops
it quantizes. The training graph keeps the one-op forms.

Two patterns are kept out of that rewrite or rewritten too:

- the `Neg` of the exact GELU, `0.5 * x * erfc(-x / sqrt(2))` (what
  `tf.nn.gelu(approximate=False)`, hence Keras' `"gelu"`, traces to): the
  converter fuses that pattern into TFLite's `GELU` builtin, which has an
  int16 kernel, and with `Mul(x, -1)` in place of `Neg` it no longer
  recognises it and fails on `tf.Erfc`, which TFLite has no op for;
- the negative-index wrap of an `Embedding`'s lookup, `where(ids < 0, ids +
  input_dim, ids)`: the 16x8 quantizer quantizes the inputs of `LESS`,
  `ADD` and `SELECT_V2` whatever their type, so integer ids going through
  them fail calibration ("Max and min for dynamic tensors should be
  recorded"); the `GATHER` reads the ids directly instead. Ids in
  `[0, input_dim)` give the same rows; a negative id, which Keras wraps, is
  an out-of-bounds error of the file's `GATHER` instead.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from kerasnorm._compat import convert_variables_to_constants
from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.blocks.transformer_decoder_block import TransformerDecoderBlock
from kerasnorm.blocks.transformer_encoder_block import TransformerEncoderBlock
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.op_layers import layer_list
from kerasnorm.export.model.op_layers import tensor_layer
from kerasnorm.export.numerics.errors import ExportConversionError


def square_as_mul(function):
    """A concrete function computing what `function` computes, its variables
    frozen, with `Square`, `SquaredDifference` and `Neg` written with `Mul`
    (the module docstring says why)."""
    frozen = convert_variables_to_constants(function)
    graph_def = frozen.graph.as_graph_def()
    _rewrite(graph_def.node, top_level=True)
    # Inside a function body a node's outputs are named `node:out:0`, not
    # `node:0`: only the rewrite that adds no node is done there.
    for function_def in graph_def.library.function:
        _rewrite(function_def.node_def, top_level=False)
    specs = list(function.structured_input_signature[0])
    structure = function.structured_outputs
    feeds = [t.name for t in frozen.inputs]
    fetches = [t.name for t in frozen.outputs]

    @tf.function(input_signature=specs)
    def serve(*args):
        # Imported into the function itself, not called as a function of
        # its own: the converter would prefix every tensor name of the file
        # with "PartitionedCall/" (15 KiB of a 16-step unrolled LN-GRU).
        outputs = tf.graph_util.import_graph_def(
            graph_def,
            input_map=dict(zip(feeds, args, strict=True)),
            return_elements=fetches,
            name="",
        )
        # Named outputs (a streaming step's dict) keep their names.
        return tf.nest.pack_sequence_as(structure, list(outputs))

    return serve.get_concrete_function()


def _rewrite(nodes, *, top_level):
    extra = []
    by_name = {node.name: node for node in nodes}
    gelu_negations = _gelu_negations(nodes, by_name) if top_level else set()
    if top_level:
        _unwrap_gather_indices(nodes, by_name)
    for node in nodes:
        if node.op == "Neg" and node.name in gelu_negations:
            continue
        if node.op == "Square":
            node.op = "Mul"
            node.input.insert(1, node.input[0])
        elif node.op == "Neg" and top_level:
            minus_one = tf.compat.v1.NodeDef(
                name=f"{node.name}/kerasnorm_minus_one", op="Const"
            )
            minus_one.attr["dtype"].CopyFrom(node.attr["T"])
            minus_one.attr["value"].tensor.CopyFrom(
                tf.make_tensor_proto(-1.0, tf.as_dtype(node.attr["T"].type))
            )
            extra.append(minus_one)
            node.op = "Mul"
            node.input.insert(1, minus_one.name)
        elif node.op == "SquaredDifference" and top_level:
            sub = tf.compat.v1.NodeDef(
                name=f"{node.name}/kerasnorm_difference",
                op="Sub",
                input=list(node.input[:2]),
            )
            sub.attr["T"].CopyFrom(node.attr["T"])
            extra.append(sub)
            node.op = "Mul"
            controls = list(node.input[2:])
            del node.input[:]
            node.input.extend([sub.name, sub.name, *controls])
    nodes.extend(extra)


def _source(by_name, name):
    """The node producing input `name` (`node`, `node:0`; not `^control`)."""
    if name.startswith("^"):
        return None
    return by_name.get(name.split(":")[0])


def _gelu_negations(nodes, by_name):
    """Names of the `Neg` nodes in `Erfc(Mul(Neg(x), c))`: the exact GELU."""
    found = set()
    for node in nodes:
        if node.op != "Erfc":
            continue
        product = _source(by_name, node.input[0])
        if product is None or product.op != "Mul":
            continue
        for name in product.input[:2]:
            negation = _source(by_name, name)
            if negation is not None and negation.op == "Neg":
                found.add(negation.name)
    return found


def _unwrap_gather_indices(nodes, by_name):
    """`GatherV2(table, SelectV2(Less(ids, 0), AddV2(ids, n), ids))` reads
    `ids` directly (the module docstring says why)."""
    for node in nodes:
        if node.op not in ("GatherV2", "ResourceGather") or len(node.input) < 2:
            continue
        select = _source(by_name, node.input[1])
        if select is None or select.op != "SelectV2" or len(select.input) < 3:
            continue
        less = _source(by_name, select.input[0])
        add = _source(by_name, select.input[1])
        ids = select.input[2]
        if (
            less is not None
            and add is not None
            and less.op == "Less"
            and add.op in ("AddV2", "Add")
            and less.input[0] == ids
            and ids in add.input[:2]
        ):
            node.input[1] = ids


def refuse_zero_scales(content, mode, ops=None):
    """Raise ExportConversionError when a quantized tensor of the file has a
    zero scale: TFLite's int16 kernels abort the process preparing it (TF
    2.21), so the parity run would kill the caller. The 16x8 quantizer gives
    a tensor that is 0 on every calibration sample a zero symmetric range:
    in an unrolled LN-GRU, the norm of `h @ U` at the first step, where `h`
    is the zero initial state, when the converter has not folded it away.
    With int16 activations a subnormal scale (below float32's smallest
    normal) is refused too: a ReLU unit that never fires on the calibration
    data is given 3.6e-43, and preparing the next op aborts the same way.
    `ops`: the trace's `op_layers.OpLayers`, which names the layers."""
    if not mode.calibrates:
        return
    quantize = mode.name
    smallest = np.finfo(np.float32).tiny if mode.int16_activations else 0.0
    zero = [
        t["name"]
        for t in unallocated(content).get_tensor_details()
        if len(t["quantization_parameters"]["scales"])
        and not (np.abs(t["quantization_parameters"]["scales"]) > smallest).all()
    ]
    if zero:
        layers = list(dict.fromkeys(tensor_layer(name, ops) for name in zero))
        raise ExportConversionError(
            f"quantize={quantize!r} gave tensor(s) {', '.join(map(repr, zero[:5]))} "
            f"a zero quantization scale (layer(s) {layer_list(layers[:5])}): "
            "they are 0 on every representative sample (a product with a zero "
            "initial state, a unit whose ReLU never fires), and TFLite's "
            "kernels abort the process on a zero scale, so the file was not "
            'run or written. Export with quantize="int8" or "dynamic", '
            "calibrate on data where those layers are not always 0 (a "
            "recurrent layer: a non-zero initial state), or remove them."
        )


# The mask arguments of an encoder block and of `MultiHeadAttention`.
_MASK_ARGUMENTS = ("padding_mask", "attention_mask", "query_mask", "value_mask")


def _attention_mask_problem(node):
    """Why the call `node` (`graph_nodes`) applies an attention mask, or
    None: a decoder block's causal mask, a mask argument given."""
    layer = node.operation
    if isinstance(layer, TransformerDecoderBlock):
        return "its causal self-attention mask"
    if not isinstance(
        layer, (TransformerEncoderBlock, keras.layers.MultiHeadAttention)
    ):
        return None
    if node.kwargs.get("use_causal_mask") is True:
        return "use_causal_mask=True"
    given = [
        name
        for name in _MASK_ARGUMENTS
        if isinstance(node.kwargs.get(name), keras.KerasTensor)
    ]
    return f"its {given[0]}" if given else None


def refuse_attention_masks(model):
    """Raise ExportConversionError, before conversion, naming the first
    attention layer of `model` that masks its scores: the mask is applied
    with SELECT_V2 and combined with LOGICAL_AND, which the 16x8 quantizer
    has no kernels for (TF 2.21: a decoder block failed with "Quantization
    to 16x8-bit not yet supported for op: 'SELECT_V2'", an encoder block
    given a padding_mask with the same for 'LOGICAL_AND')."""
    for graph in _graphs(model):
        for node in graph_nodes(graph):
            problem = _attention_mask_problem(node)
            if problem:
                layer = node.operation
                raise ExportConversionError(
                    f"Cannot export layer {layer.name!r} ({type(layer).__name__}) "
                    f"with quantize='int16x8': {problem} is applied to the "
                    "attention scores with SELECT_V2 (two masks are combined "
                    "with LOGICAL_AND), and TFLite's 16x8 quantizer quantizes "
                    "neither (TF 2.21). Export it with quantize='int8' or "
                    "'dynamic'; an encoder block without a mask converts at "
                    "int16x8."
                )


def _graphs(model):
    """The Functional graphs of `model` and of the models nested in it."""
    graph = functional_of(model)
    if graph is None:
        return
    yield graph
    for node in graph_nodes(graph):
        if isinstance(node.operation, keras.Model):
            yield from _graphs(node.operation)


def refuse_masks(model):
    """Raise ExportConversionError, before conversion, when `model` makes a
    Keras mask (`Embedding(mask_zero=True)`, `Masking`): the 16x8 quantizer
    has no 16x8 `SELECT_V2`, which every masked step of a recurrent layer,
    a masked softmax or pooling goes through, nor `NOT_EQUAL`, which makes
    the mask (measured on TF 2.21: "Quantization to 16x8-bit not yet
    supported for op", and on integer ids a calibration failure)."""
    for layer in all_layers(model):
        masked = (
            isinstance(layer, keras.layers.Embedding) and layer.mask_zero
        ) or isinstance(layer, keras.layers.Masking)
        if not masked:
            continue
        made = "mask_zero=True" if isinstance(layer, keras.layers.Embedding) else ""
        raise ExportConversionError(
            f"Cannot export layer {layer.name!r} ({type(layer).__name__}"
            f"{', ' + made if made else ''}) with quantize='int16x8': the mask it "
            "makes is applied with SELECT_V2 (the masked steps of a recurrent "
            "layer, the masked scores of attention) and made with NOT_EQUAL, "
            "and TFLite's 16x8 quantizer quantizes neither (TF 2.21). Export "
            "it with quantize='int8' or 'dynamic', or without the mask."
        )
