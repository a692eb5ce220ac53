"""How a `.tflite` file runs on LiteRT's default CPU delegate, XNNPACK.

A file can be correct and still slow: every op XNNPACK does not take runs on
TFLite's reference kernels between delegate partitions, often behind a
`QUANTIZE`/`DEQUANTIZE` pair. `delegation` reports the split from the
allocated interpreter itself, so it matches what a phone with the same
runtime does.

How the split is read: after `allocate_tensors` the interpreter's node list
holds the file's ops followed by one `DELEGATE` node per partition, whose
inputs and outputs are the tensors that cross the partition's border. The
replaced ops stay in the list (the execution plan, which skips them, is not
exposed to Python), so which ops were replaced is read from the data flow:
an op whose output leaves a partition was replaced; an op whose output enters
a partition from outside was not; an op whose output does neither stays
inside one side, that of the ops that consume it.

Only the main graph is read, so only it is delegated: a file of several
signatures (a generative file's decode and prefills) is read with the
others' subgraphs named as the interpreter's validation subgraphs
(`VALIDATION:`), which it leaves to its own kernels. XNNPACK packs the
weights of each subgraph it takes, so the three signatures of Gemma 3
270M's float32 file held three packed copies of its 1 GB of weights to
count the decode step's partitions; now the file's copy with the names
changed, and one packed copy.
"""

import dataclasses
import os

from kerasnorm._compat import interpreter_ops
from kerasnorm.export.litert.runner import interpreter

DELEGATE_OP = "DELEGATE"
# The prefix of a subgraph's name that keeps the interpreter's delegates off it.
VALIDATION = "VALIDATION:"


@dataclasses.dataclass(frozen=True)
class Delegation:
    """The delegate partitions of a file's main graph and the ops left out.

    Attributes:
        partitions: how many XNNPACK partitions (delegate nodes) run.
        delegated_ops: how many of the file's ops run inside them.
        undelegated: op name -> count of the ops that run on the reference
            (builtin) kernels instead, sorted by name.
    """

    partitions: int
    delegated_ops: int
    undelegated: dict

    @property
    def undelegated_ops(self) -> int:
        """How many ops run outside the partitions, of every type."""
        return sum(self.undelegated.values())

    @property
    def fully_delegated(self) -> bool:
        """One partition and nothing outside it: the fast case."""
        return self.partitions == 1 and not self.undelegated

    def __str__(self):
        text = f"{self.partitions} partition{'s' * (self.partitions != 1)}"
        if not self.undelegated:
            return f"{text}, all {self.delegated_ops} ops delegated"
        left = ", ".join(f"{name} {n}" for name, n in self.undelegated.items())
        return f"{text}, {self.undelegated_ops} ops outside: {left}"


def delegation(model) -> Delegation:
    """Counts a file's XNNPACK partitions and the ops left out of them.

    Only the main graph (subgraph 0) is counted: the bodies of a `WHILE`
    (a rolled recurrent layer) are delegated separately and the interpreter
    does not list their nodes. The split does not depend on the thread
    count; the interpreter's XNNPACK log line ("Created TensorFlow Lite
    XNNPACK delegate for CPU.", written by C++ to stderr) is dropped.

    Args:
        model: the `.tflite` file's path, or its bytes.

    Returns:
        A `Delegation`.
    """
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            model = f.read()
    return _split(interpreter_ops(interpreter(_main_graph_delegated(bytes(model)))))


def _main_graph_delegated(content):
    """`content`, the subgraphs of its signatures other than the main
    graph's named as validation subgraphs (see the module); `content`
    itself when it has no other signature."""
    from kerasnorm.export.weights.buffers import read_model
    from kerasnorm.export.weights.buffers import write_model
    from kerasnorm.export.weights.edits import flatbuffer_schema

    schema, fu = flatbuffer_schema()
    root = schema.Model.GetRootAs(content, 0)
    others = {
        root.SignatureDefs(i).SubgraphIndex() for i in range(root.SignatureDefsLength())
    } - {0}
    if not others:
        return content
    model, _ = read_model(fu, content)
    for index in sorted(others):
        name = model.subgraphs[index].name or b""
        if isinstance(name, bytes):
            name = name.decode()
        model.subgraphs[index].name = VALIDATION + name
    return write_model(schema, fu, model)


def _split(ops) -> Delegation:
    delegates = [op for op in ops if op["op_name"] == DELEGATE_OP]
    file_ops = [op for op in ops if op["op_name"] != DELEGATE_OP]
    inside = placement(ops)
    undelegated = {}
    for op in file_ops:
        if not inside[op["index"]]:
            undelegated[op["op_name"]] = undelegated.get(op["op_name"], 0) + 1
    return Delegation(
        partitions=len(delegates),
        delegated_ops=sum(inside.values()),
        undelegated=dict(sorted(undelegated.items())),
    )


def placement(ops):
    """`{op index: whether XNNPACK runs it}` for the file's ops in `ops`
    (`interpreter_ops` of an allocated interpreter), read from the data
    flow as the module docstring says."""
    delegates = [op for op in ops if op["op_name"] == DELEGATE_OP]
    file_ops = [op for op in ops if op["op_name"] != DELEGATE_OP]
    leaving = {int(t) for op in delegates for t in op["outputs"]}
    entering = {int(t) for op in delegates for t in op["inputs"]} - leaving
    consumers = {}
    for op in file_ops:
        for t in op["inputs"]:
            consumers.setdefault(int(t), []).append(op["index"])
    inside = {}
    # Ops are stored in execution order, so every consumer of an op's output
    # comes after it: deciding from the last op backwards sees consumers first.
    for op in reversed(file_ops):
        outputs = [int(t) for t in op["outputs"] if int(t) >= 0]
        if any(t in leaving for t in outputs):
            inside[op["index"]] = True
        elif any(t in entering for t in outputs):
            inside[op["index"]] = False
        else:
            users = [c for t in outputs for c in consumers.get(t, ())]
            inside[op["index"]] = (
                bool(delegates)
                and bool(users)
                and all(inside.get(c, False) for c in users)
            )
    return inside
