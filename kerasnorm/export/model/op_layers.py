"""Which Keras layer created each op of a traced graph.

A converter or a runtime names TensorFlow ops (`Erfc`, `FFT2D`,
`EagerPyFunc`) and graph nodes (`functional_1/dense_2/BiasAdd`); a user
knows layers. `recording()` watches a trace (the one an export converts or
saves) and keeps, for every op it creates, the path of the Keras layers
calling at that moment (`'block/ffn/dense'`). Graph scope names cannot be
used instead: TensorFlow makes a scope unique by appending `_1`, the name
Keras gives the second layer of a class, so `f_net_layer`'s ops can sit in
scope `f_net_layer_1`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re

from kerasnorm._compat import calling_layers
from kerasnorm._compat import op_creation_callback

# Where an op created by no layer (a Functional model's `x + y`) is listed.
OUTSIDE = "the model's own ops between its layers"

# Python callbacks: they exist only in the process that traced them, so no
# TFLite runtime and no other process loading a SavedModel can run them.
PROCESS_BOUND_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")


@dataclasses.dataclass(frozen=True)
class OpRecord:
    """One op a trace created: its graph name and type, and the layers
    calling when it was created, outermost first, the exported model
    itself left out (empty: none of its layers)."""

    name: str
    type: str
    layers: tuple[str, ...]

    @property
    def layer(self) -> str | None:
        """The layer path the user reads: the model's own layer first and
        the sublayer inside it (`'block/dense_1'`); None outside any."""
        return "/".join(self.layers) if self.layers else None


class OpLayers:
    """The ops a `recording()` saw, and the layers that created them."""

    def __init__(self, root=None):
        self.root = root
        self.records: list[OpRecord] = []

    def _add(self, op_type, op_name):
        names = []
        for layer in calling_layers():
            # A layer calling a model of its own name (a Sequential
            # `feed_forward` inside `feed_forward`) is one step of the path.
            if layer is not self.root and (not names or names[-1] != layer.name):
                names.append(layer.name)
        self.records.append(OpRecord(op_name, op_type, tuple(names)))

    def layers_using(self, op_types) -> dict[str, list[str]]:
        """`{op type: [layer paths]}` for each of `op_types` the trace
        created, every layer that created one, in creation order; an op
        created outside every layer counts as `OUTSIDE`."""
        wanted = set(op_types)
        return _layers_by_type(r for r in self.records if r.type in wanted)

    def layers_of_nodes(self, node_names) -> dict[str, list[str]]:
        """`{op type: [layer paths]}` of the graph nodes `node_names`
        (as a converter's locations give them: possibly prefixed by the
        calls they were inlined through, `PartitionedCall/...`); a node
        of no layer counts as `OUTSIDE`."""
        by_name = {}
        for record in self.records:
            by_name.setdefault(record.name, record)
        records = []
        for node in node_names:
            record = by_name.get(node)
            if record is None:
                parts = node.split("/")
                for i in range(1, len(parts)):
                    record = by_name.get("/".join(parts[i:]))
                    if record is not None:
                        break
            if record is not None:
                records.append(record)
        return _layers_by_type(records)

    def op_types(self) -> set[str]:
        """Every op type the trace created."""
        return {record.type for record in self.records}


def _layers_by_type(records) -> dict[str, list[str]]:
    """`{op type: [layer paths]}` of `records`, each layer once, in order;
    an op of no layer counts as `OUTSIDE`."""
    found: dict[str, list[str]] = {}
    for record in records:
        layer = record.layer or OUTSIDE
        layers = found.setdefault(record.type, [])
        if layer not in layers:
            layers.append(layer)
    return found


def tensor_layer(tensor_name, ops) -> str:
    """The layer path that created a converter tensor (`'a/b;c/d'`: the
    graph nodes fused into it, possibly prefixed by the calls they were
    inlined through): the first fused node a layer created, else the
    layer of the longest recorded op name inside the tensor's name, else
    `OUTSIDE` for a node of the model's own, else the tensor's name. `ops`:
    the trace's `OpLayers` (None: the tensor's name)."""
    if ops is None:
        return tensor_name
    outside = False
    # `layers_of_nodes` looks a node up without the calls it was inlined
    # through (`StatefulPartitionedCall/...`).
    for part in tensor_name.split(";"):
        for layers in ops.layers_of_nodes([part]).values():
            named = [layer for layer in layers if layer != OUTSIDE]
            if named:
                return named[0]
            outside = True
    best = None
    for record in ops.records:
        if record.layer and record.name and record.name in tensor_name:
            if best is None or len(record.name) > len(best.name):
                best = record
    if best is not None:
        return best.layer
    return OUTSIDE if outside else tensor_name


@contextlib.contextmanager
def recording(root=None):
    """Record the ops created while the block runs (a trace) with the
    layers creating them: `with recording(model) as ops: trace()`, then
    `ops.layers_using({"Erfc"})`; `root`, the model traced, is left out
    of the layer paths."""
    ops = OpLayers(root)
    with op_creation_callback(ops._add):
        yield ops


def layer_list(layers) -> str:
    """`'a', 'b' and 'c'`: layer paths as a message names them."""
    quoted = [name if name == OUTSIDE else repr(name) for name in layers]
    if len(quoted) <= 1:
        return "".join(quoted)
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


_NODE = re.compile(r'fused\["(\w+):", "([^"@]+)(?:@[^"]*)?"\]')


def converter_nodes(text) -> list[str]:
    """The graph node names in a converter error's MLIR locations
    (`loc(callsite(fused["Erfc:", "PartitionedCall/.../Erfc@__inference_..."]`),
    in order, each once; calls themselves left out."""
    nodes = []
    for op_type, node in _NODE.findall(text):
        if op_type in ("PartitionedCall", "StatefulPartitionedCall"):
            continue
        if node not in nodes:
            nodes.append(node)
    return nodes
