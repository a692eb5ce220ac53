"""What an export whose process died left beside its target, removed by
the next export to the same target.

An export stages its artifact beside the target (`staging.staged`) and
removes the temporary when it fails; a process killed meanwhile (a crash in
native code, `kill -9`, a closed notebook kernel) cannot. Each temporary's
name holds the writing process's id, `.<name>.tmp-<pid>-<random>`; the next
export to the same target removes every such temporary, and every
`.<name>.old-` directory a replacement was moving aside, whose process is no
longer running on this machine. A temporary of a running export is never
touched; names without a process id (written before it was added) are
removed once an hour old.
"""

from __future__ import annotations

import os
import re
import shutil
import time

# A temporary without a process id in its name is left alone this long: an
# export writing it may still be running.
UNOWNED_AGE_S = 3600


def tagged(base):
    """The prefix of this process's temporaries for target name `base`."""
    return f".{base}.tmp-{os.getpid()}-"


def remove_leftovers(parent, base):
    """Remove, from directory `parent`, the temporaries of exports to target
    name `base` whose process has died; their names, sorted."""
    pattern = re.compile(
        rf"\.{re.escape(base)}\.(tmp|old)-(?:(\d+)-)?[0-9a-zA-Z_]+(\.\w+)?"
    )
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        path = os.path.join(parent, name)
        pid = match.group(2)
        if pid is not None:
            if _running(int(pid)):
                continue
        else:
            try:
                if time.time() - os.lstat(path).st_mtime < UNOWNED_AGE_S:
                    continue
            except OSError:
                continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                continue
        removed.append(name)
    return sorted(removed)


def _running(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: running
    return True
