"""A helper process a Python session keeps for its exports: one at a time,
replaced when it dies or in a forked process, closed at exit.

Two checks run a new artifact outside this process: LiteRT's first load
of a `.tflite` file (`verify.child`, where a crash must not end the
caller's process) and a SavedModel's load where it will run
(`verify.fresh`, away from the state of the process that wrote it). Each
keeps a `SessionProcess`: a Python interpreter started on a source string,
fed one request per line on its standard input, its prefixed lines on
standard output read by a thread into a queue of events. Starting one costs
an import (LiteRT: under a second; TensorFlow: seconds), so one serves a
session, and the module that keeps it holds it in a `Kept`: `Kept.get`
returns it while it is usable and starts a new one otherwise, and it is
stopped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import subprocess
import sys
import threading

# The event a reader puts in the queue when the process's output ends.
EOF = ("eof", None)


class SessionProcess:
    """A Python process running `source` (see the module docstring); its
    `parse` turns a line of its output into an event or None (ignored)."""

    def __init__(self, source, stderr=subprocess.DEVNULL):
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        # -P: the working directory is not put on the path (a user's
        # `numpy.py` or `tensorflow.py` there must not shadow the real one).
        self._child = subprocess.Popen(
            [sys.executable, "-P", "-c", source],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        self.pid = os.getpid()
        self._events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def parse(self, line):
        raise NotImplementedError

    def _read(self):
        for line in self._child.stdout:
            event = self.parse(line)
            if event is not None:
                self._events.put(event)
        self._events.put(EOF)

    def send(self, request: str):
        """Write one request line; OSError when the process is gone."""
        self._child.stdin.write(request + "\n")
        self._child.stdin.flush()

    def event(self, timeout):
        """The next event; queue.Empty after `timeout` seconds."""
        return self._events.get(timeout=timeout)

    @property
    def usable(self) -> bool:
        return self._child.poll() is None and self.pid == os.getpid()

    def close(self):
        """Stop the process: its input closed, it ends; killed if it hangs."""
        if self._child.poll() is None:
            with contextlib.suppress(OSError):
                self._child.stdin.close()
            try:
                self._child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()


def current(process, start):
    """`process` while it is usable, else `start()`: a dead process, or one
    a forked process inherited, is replaced (closed first if it is this
    process's own). Call it under the keeping module's lock."""
    if process is not None and process.usable:
        return process
    close_own(process)
    return start()


def close_own(process):
    """Close `process` if this process started it (not in a forked child,
    which shares its pipes with the parent)."""
    if process is not None and process.pid == os.getpid():
        process.close()


class Kept:
    """The one process of a kind a session keeps (`start()` makes one): `get`
    returns it, started or replaced when needed (`current`); `run_lock`
    holds one request at a time, as the process answers in order; it is
    stopped at exit if this process started it."""

    def __init__(self, start):
        self._start = start
        self._starting = threading.Lock()
        self.run_lock = threading.Lock()
        self.process = None
        atexit.register(self.close)

    def get(self):
        with self._starting:
            self.process = current(self.process, self._start)
            return self.process

    def close(self):
        """Stop the kept process (if this process started it) and forget it."""
        close_own(self.process)
        self.process = None
