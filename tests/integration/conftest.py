"""Processes a test starts are its own to end: each starts in a session (process group) of
its own, and a group still alive when its test is over - the test failed before it could end
it - is killed, with everything in it (a fabric's nodes).  And the signals a test sends reach
a child as a terminal's would: pytest started as a shell's background job ignores SIGINT,
which its children would inherit (POSIX), so it takes SIGINT's default back first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_STARTED: list[int] = []  # every process a test started, in order
_popen_init = subprocess.Popen.__init__


def _own_session(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    if not kwargs.get("process_group") and "preexec_fn" not in kwargs:
        kwargs.setdefault("start_new_session", True)
    _popen_init(self, *args, **kwargs)
    _STARTED.append(self.pid)


subprocess.Popen.__init__ = _own_session  # type: ignore[method-assign]


def _kill_groups(pids: list[int]) -> list[int]:
    """Kill the process group of each of ``pids`` still alive; the ones it killed."""
    killed = []
    for pid in pids:
        with contextlib.suppress(OSError):  # (the group is gone: nothing of it is left)
            os.killpg(pid, signal.SIGKILL)  # its group, though its leader may have ended
            killed.append(pid)
    return killed


@pytest.fixture(autouse=True)
def _end_what_the_test_started() -> Iterator[None]:
    first = len(_STARTED)
    yield
    _kill_groups(_STARTED[first:])
    del _STARTED[first:]
