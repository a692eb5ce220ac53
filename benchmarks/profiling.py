"""Reading what the profiles record: XLA:CPU's HLO dump and the TensorFlow
profiler's per-kernel trace (profile_norms.py, profile_recurrent.py,
profile_training.py).

XLA:CPU records one trace event per thunk when
`--xla_cpu_enable_xprof_traceme` is on, named after the HLO instruction, so
each event maps back to the fusion or dot it ran. The flags must be set
before TensorFlow starts: each profile runs in a child process with
`XLA_FLAGS=xla_flags(workdir)` (benchmarks/rerun.py).
"""

import collections
import glob
import os
import re


def xla_flags(workdir):
    """XLA_FLAGS for one profiled process: the optimized HLO as text under
    `<workdir>/hlo`, and one trace event per thunk."""
    return (
        f"--xla_dump_to={workdir}/hlo --xla_dump_hlo_as_text "
        "--xla_dump_hlo_pass_re=^$ --xla_cpu_enable_xprof_traceme=true"
    )


def parse_hlo(path):
    """Map instruction name -> (computation, shape, op_name) and list the
    while bodies (name -> ordered instruction kinds) of an HLO text dump."""
    instructions, computations = {}, collections.defaultdict(list)
    current = None
    text = open(path).read()
    for line in text.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$", line)
        if header:
            current = "entry" if line.startswith("ENTRY") else header.group(1)
            continue
        inst = re.match(r"^\s+(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\(", line)
        if inst and current is not None:
            name, shape, kind = inst.groups()
            op = re.search(r'op_name="([^"]+)"', line)
            instructions.setdefault(
                name, (current, shape, kind, op.group(1) if op else "")
            )
            computations[current].append(kind)
    bodies = re.findall(r"while\(.*?body=%?([\w.\-]+)", text)
    return instructions, {body: computations[body] for body in bodies}


def parse_trace(trace_dir):
    """Total duration (ps) and count of each event name in the trace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    total, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                name = names[event.metadata_id].name
                total[name] += event.duration_ps
                count[name] += 1
    return total, count
