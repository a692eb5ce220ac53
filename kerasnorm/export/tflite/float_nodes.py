"""The int8 file's float islands beyond the norm statistics: attention
scores and each norm's normalization, found in the float file's graph.

Measured on kerasnorm's transformer blocks over token inputs (Pre-LN,
Post-LN and DeepNorm encoder and decoder blocks after an `Embedding`,
trained; docs/design.md §11 has the table), two int8 tensors broke the fast
int8 file where float inputs had hidden them:

- **the attention scores**. Between the `BATCH_MATMUL` of queries and keys
  and the `SOFTMAX` (both float) the file held an int8 `MUL` (the
  1/sqrt(key_dim) scale) and, under a padding or causal mask, an int8
  `SELECT_V2` filling masked scores with -0.7 x float32 max (Keras'
  TensorFlow `dot_product_attention`). `SELECT_V2` shares one scale across
  its inputs and output, so the scores were quantized at 9e35 a step: rms
  error 0.9-1.2, accuracy down to chance. Without a mask the int8 scores
  still cost (rms 0.26 -> 0.02 on a trained DeepNorm decoder).
  `score_nodes` keeps the chain from the matmul to the softmax in float.
- **a norm's centring and scaling**. The int8 `SUB` (x - mean) was given
  the scale of the `MUL` by the inverse deviation after it, so an input
  whose range is far below the normalized output's (an embedding's, +-0.08
  against +-3) kept a few int8 levels: rms 0.21 on an untrained Pre-LN
  block, 0.11 trained. `normalization_nodes` keeps `SUB` and that `MUL` in
  float; the statistics already read the float input, so the file only
  quantizes the normalized output instead of the mean and the deviation
  (no slower: int8/float32 latency 0.71 -> 0.69 on two masked blocks of
  64 tokens x 128 on tokens, 0.89 -> 0.85 on a conv net with LayerNorm).

On a trained keras-hub Llama whose residual stream carries outlier
channels (docs/design.md §14), a third: **the queries and keys**. The key
projection's int8 output (one scale per tensor, set by a few large head
dimensions) and the rotary embedding's int8 ops after it cost next-token
accuracy 0.819 -> 0.788; `query_key_nodes` keeps the path from each
projection to the scores' matmul in float (0.819).
"""

from kerasnorm._compat import interpreter_ops
from kerasnorm.export.litert.runner import unallocated

# Elementwise ops that may sit between the scores' matmul and the softmax:
# the scale, a mask's fill (`SELECT_V2`/`SELECT`) or additive bias.
_SCORE_OPS = ("MUL", "ADD", "SUB", "DIV", "SELECT_V2", "SELECT")
# Ops that only reshape the scores, kept in float with them: an int8 reshape
# between the float matmul and the float softmax takes a scale of its own
# (keras-hub's attention reshapes the scores before its masked softmax).
_SHAPE_ONLY = ("RESHAPE", "EXPAND_DIMS", "SQUEEZE")
# How many such ops the walk back from a softmax crosses at most.
_SCORE_DEPTH = 4
_ROOTS = ("RSQRT",)
# Ops the queries and keys cross between their projection and the scores'
# matmul: reshapes, the rotary embedding's halves, sign and sums, the
# key/value head repeat.
_QUERY_KEY_OPS = (
    "RESHAPE",
    "TRANSPOSE",
    "EXPAND_DIMS",
    "SQUEEZE",
    "TILE",
    "SPLIT",
    "STRIDED_SLICE",
    "CONCATENATION",
    "PACK",
    "NEG",
    "MUL",
    "ADD",
    "SUB",
)
# The op that marks a rotary embedding on the path (rotate-half's sign).
_ROTARY = ("NEG",)
# The projections that end the walk back (kept in float with the path).
_PROJECTIONS = ("FULLY_CONNECTED",)
# How many ops the walk back from a scores' matmul crosses at most.
_QUERY_KEY_DEPTH = 24


def _graph(content):
    interpreter = unallocated(bytes(content))
    ops = interpreter_ops(interpreter)
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    producer = {int(t): op for op in ops for t in op["outputs"]}
    consumers = {}
    for op in ops:
        for t in op["inputs"]:
            consumers.setdefault(int(t), []).append(op)
    return ops, names, producer, consumers


def score_nodes(content: bytes) -> list:
    """The output tensor names of the ops between each attention's scores
    `BATCH_MATMUL` and its `SOFTMAX` in a float file: the path back from
    the softmax's input through `_SCORE_OPS` to the matmul. A softmax not
    fed that way (a classifier's head) contributes nothing."""
    ops, names, producer, _ = _graph(content)
    chosen = set()
    for op in ops:
        if op["op_name"] == "SOFTMAX":
            path = _path_to_matmul(producer.get(int(op["inputs"][0])), producer)
            chosen.update(int(member["outputs"][0]) for member in path or ())
    return sorted(names[t] for t in chosen)


def query_key_nodes(content: bytes) -> list:
    """The output tensor names of the ops computing each attention's
    queries and keys in a float file: from each scores `BATCH_MATMUL` (one
    whose product reaches a `SOFTMAX`, `score_nodes`) back through
    `_QUERY_KEY_OPS` to the `FULLY_CONNECTED` projection, that projection
    included, where the branch holds a rotary embedding (a `NEG`: rotate
    half); queries and keys read through reshapes alone stay int8. A
    branch that reaches no projection within the depth (a constant, a
    model input, another op) contributes nothing, so the walk never enters
    the residual stream before the projection."""
    _, names, path = _query_key_path(content)
    return sorted(names[int(t)] for op in path for t in op["outputs"] if int(t) >= 0)


def query_key_split_ops(content: bytes) -> tuple:
    """The types of the multi-output ops on `query_key_nodes`' path (the
    rotary embedding's `SPLIT`): the quantizer finds no node of several
    outputs by tensor name, so these are kept in float by type."""
    _, _, path = _query_key_path(content)
    return tuple(sorted({op["op_name"] for op in path if len(op["outputs"]) > 1}))


def _query_key_path(content):
    ops, names, producer, _ = _graph(content)
    matmuls = [
        _scores_matmul(producer.get(int(op["inputs"][0])), producer)
        for op in ops
        if op["op_name"] == "SOFTMAX"
    ]
    matmuls = {m["index"] for m in matmuls if m is not None}
    path, seen = {}, {}
    for op in ops:
        if op["index"] not in matmuls:
            continue
        for t in op["inputs"]:
            branch = _path_to_projection(producer.get(int(t)), producer, seen=seen)
            # Only a rotated branch (rotate-half's `NEG`): a projection read
            # through reshapes alone (an encoder's) stays int8 and fast.
            if any(member["op_name"] in _ROTARY for member in branch):
                path.update((member["index"], member) for member in branch)
    return ops, names, list(path.values())


def _scores_matmul(op, producer, depth=_SCORE_DEPTH):
    """The `BATCH_MATMUL` `_path_to_matmul` reaches from `op`, else None."""
    if op is None:
        return None
    if op["op_name"] == "BATCH_MATMUL":
        return op
    if op["op_name"] in _SHAPE_ONLY:
        return _scores_matmul(producer.get(int(op["inputs"][0])), producer, depth)
    if op["op_name"] not in _SCORE_OPS or depth == 0:
        return None
    for t in op["inputs"]:
        found = _scores_matmul(producer.get(int(t)), producer, depth - 1)
        if found is not None:
            return found
    return None


def _path_to_projection(op, producer, depth=_QUERY_KEY_DEPTH, seen=None):
    """The ops from `op` back to the projections it reaches through
    `_QUERY_KEY_OPS` (every branch that reaches one), else `[]`. `seen`
    holds each op's answer: the rotary halves meet again."""
    seen = {} if seen is None else seen
    if op is None or depth == 0:
        return []
    if op["index"] in seen:
        return seen[op["index"]]
    found = []
    if op["op_name"] in _PROJECTIONS:
        found = [op]
    elif op["op_name"] in _QUERY_KEY_OPS:
        for t in op["inputs"]:
            found += _path_to_projection(
                producer.get(int(t)), producer, depth - 1, seen
            )
        found = [op, *found] if found else []
    seen[op["index"]] = found
    return found


def _path_to_matmul(op, producer, depth=_SCORE_DEPTH):
    if op is None:
        return None
    if op["op_name"] == "BATCH_MATMUL":
        return []
    if op["op_name"] in _SHAPE_ONLY:
        path = _path_to_matmul(producer.get(int(op["inputs"][0])), producer, depth)
        return None if path is None else [op, *path]
    if op["op_name"] not in _SCORE_OPS or depth == 0:
        return None
    for t in op["inputs"]:
        path = _path_to_matmul(producer.get(int(t)), producer, depth - 1)
        if path is not None:
            return [op, *path]
    return None


def normalization_nodes(content: bytes) -> list:
    """The output tensor names of each norm's normalization in a float file:
    the `MUL` by the inverse square root (`RSQRT`) and the `SUB` (x - mean)
    feeding it (RMS norms have none). The affine (`gamma`, `beta`) after it
    stays int8."""
    ops, names, producer, consumers = _graph(content)
    chosen = set()
    for op in ops:
        if op["op_name"] not in _ROOTS:
            continue
        for user in consumers.get(int(op["outputs"][0]), ()):
            if user["op_name"] != "MUL":
                continue
            chosen.add(int(user["outputs"][0]))
            chosen.update(_centred(user, producer))
            # A gain folded into the root (`normalize`'s `rsqrt * gamma`,
            # InstanceNorm and GroupNorm): the normalization is the next
            # `MUL`, of the centred input by that product.
            if _has_constant_input(user, producer):
                for product in consumers.get(int(user["outputs"][0]), ()):
                    centred = _centred(product, producer)
                    if product["op_name"] == "MUL" and centred:
                        chosen.add(int(product["outputs"][0]))
                        chosen.update(centred)
    return sorted(names[t] for t in chosen)


def _centred(op, producer):
    """The outputs of the `SUB` ops (x - mean) feeding `op`."""
    found = []
    for t in op["inputs"]:
        source = producer.get(int(t))
        if source is not None and source["op_name"] == "SUB":
            found.append(int(source["outputs"][0]))
    return found


def _has_constant_input(op, producer):
    """Whether an input of `op` is a constant (no op computes it)."""
    return any(int(t) >= 0 and int(t) not in producer for t in op["inputs"])


def embedding_nodes(content: bytes) -> list:
    """The output tensor names of each token lookup scaled by a constant in
    a float file: a `GATHER` from a constant table whose one reader is a
    `MUL` by a constant (Gemma's `sqrt(hidden_dim)`), and that `MUL`.

    An int8 `GATHER` shares its table's scale, and the quantizer gives it
    the scale of the product after it: the table is rounded at a step
    `sqrt(hidden_dim)` times too coarse. In float the table keeps float32
    weights (4x the int8 table's bytes) and the product is quantized once.
    """
    ops, names, producer, consumers = _graph(content)
    chosen = set()
    for op in ops:
        if op["op_name"] != "GATHER" or int(op["inputs"][0]) in producer:
            continue
        output = int(op["outputs"][0])
        readers = consumers.get(output, ())
        if len(readers) != 1 or readers[0]["op_name"] != "MUL":
            continue
        others = [int(t) for t in readers[0]["inputs"] if int(t) != output]
        if others and all(t not in producer for t in others):
            chosen.update((output, int(readers[0]["outputs"][0])))
    return sorted(names[t] for t in chosen)
