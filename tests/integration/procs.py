"""Finding a node process of a run: the supervisor forks it from the launcher and names it after
its nodes (rocev2_emu/fabric/forked.py), so its command line is the launcher's but its name -
``/proc/PID/comm``, the first 15 characters - and its parent say which it is."""

from __future__ import annotations

import time
from pathlib import Path


def node_pid(parent: int, name: str, timeout: float = 30.0) -> int:
    """The pid of node process ``name`` that process ``parent`` started (waiting up to
    ``timeout`` wall seconds for it to have taken its name)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") :]
            if comm == name[:15] and int(rest.split()[2]) == parent:
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError(f"no node process {name} of process {parent}")
