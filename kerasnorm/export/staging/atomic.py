"""Atomic writes: an artifact appears at its path whole, or not at all."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile

from kerasnorm.export.staging.leftovers import remove_leftovers
from kerasnorm.export.staging.leftovers import tagged


def refuse_existing(path, overwrite):
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(
            f"{path!r} already exists. Pass overwrite=True to replace it."
        )


@contextlib.contextmanager
def staged(path, *, directory, suffix=""):
    """A temporary path beside `path`, moved into place if the block succeeds.

    The temporary name starts with a dot: TF Serving only loads numeric
    version directories, so it never picks up a half-written export. On error
    the temporary is removed, and so are the directories above `path` that
    were created for it; whatever was at `path` is left untouched.
    The temporary is created with the modes `open` and `mkdir` give (0o666 and
    0o777 less the umask), not `tempfile`'s owner-only 0o600/0o700, because
    it becomes the artifact: a server running as another user must read it.
    """
    parent = os.path.dirname(os.path.abspath(path))
    created = _missing_directories(parent)
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(path)
    # What an export killed before it could clean up left (`leftovers`).
    remove_leftovers(parent, base)
    tmp = _create_beside(parent, tagged(base), suffix, directory)
    try:
        yield tmp
        if directory and os.path.lexists(path):
            old = tempfile.mkdtemp(prefix=f".{base}.old-{os.getpid()}-", dir=parent)
            os.replace(path, os.path.join(old, base))
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.remove(tmp)
        _remove_empty(created)
        raise


def _missing_directories(directory):
    """`directory` and those of its ancestors that do not exist, deepest first."""
    missing = []
    while not os.path.lexists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    return missing


def _remove_empty(directories):
    """Remove `directories` (deepest first) while they are empty: another
    process may have written into one meanwhile, and that one is kept."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:
            return


def _create_beside(parent, prefix, suffix, directory):
    """Create a new, uniquely named file or directory in `parent`."""
    while True:
        tmp = os.path.join(parent, f"{prefix}{secrets.token_hex(4)}{suffix}")
        try:
            if directory:
                os.mkdir(tmp)
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return tmp


def path_size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
    )
