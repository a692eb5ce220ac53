"""The session process behind `verify.child` and `verify.fresh`
(`verify.session`): one instance while it is usable, replaced when it died
or belongs to the process this one was forked from, and only the owner
closes it. A Python process that echoes its requests stands in for
LiteRT's and TensorFlow's."""

import queue

import pytest

from kerasnorm.export.verify import session

ECHO = r"""
import sys
for line in sys.stdin:
    print("noise", flush=True)
    print("echo:" + line.strip(), flush=True)
"""


class Echo(session.SessionProcess):
    def __init__(self):
        super().__init__(ECHO)

    def parse(self, line):
        return ("answer", line[5:].strip()) if line.startswith("echo:") else None


@pytest.fixture
def echo():
    process = Echo()
    yield process
    process.close()


def test_requests_are_answered_in_order_and_other_lines_ignored(echo):
    echo.send("one")
    echo.send("two")
    assert echo.event(30) == ("answer", "one")
    assert echo.event(30) == ("answer", "two")
    with pytest.raises(queue.Empty):
        echo.event(0.2)


def test_closed_process_ends_its_events_and_is_replaced(echo):
    assert session.current(echo, Echo) is echo
    echo.close()
    assert echo.event(30) == session.EOF
    assert not echo.usable
    replaced = session.current(echo, Echo)
    try:
        assert replaced is not echo and replaced.usable
        assert session.current(None, Echo) is not replaced
    finally:
        replaced.close()


def test_a_forked_process_starts_its_own_and_leaves_the_parents_open(echo):
    echo.pid = -1  # as seen from a process forked after it started
    assert not echo.usable
    own = session.current(echo, Echo)
    try:
        assert own is not echo
        # Not closed: the parent still uses it.
        assert echo._child.poll() is None
        echo.send("still")
        assert echo.event(30) == ("answer", "still")
        session.close_own(echo)
        assert echo._child.poll() is None
    finally:
        own.close()


def test_kept_serves_one_process_and_replaces_a_dead_one():
    kept = session.Kept(Echo)
    try:
        first = kept.get()
        assert kept.get() is first
        first.send("hello")
        assert first.event(30) == ("answer", "hello")
        first.close()
        second = kept.get()
        assert second is not first and second.usable
        kept.close()
        assert kept.process is None and not second.usable
    finally:
        kept.close()
