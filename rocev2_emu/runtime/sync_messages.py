"""The messages of an exact run's synchronisation, typed: what a node process says to the
coordinator (:class:`Hello`, then a :class:`Report` per window, and :data:`BEAT` while it
computes a long window) and what it hears back (a
:class:`Grant` of the next window, or :class:`Stop`), with the :class:`LinkChange` either
may carry.

Each has ``wire()`` (the msgpack-able value sent, after the connection's length prefix) and
``from_wire()`` (the value received, checked field by field: a ValueError names what is
wrong), as :mod:`rocev2_emu.control.requests` does for the control port.  Sans-IO: the
coordinator's decisions (:mod:`rocev2_emu.runtime.rounds`) and the node's engine
(:mod:`rocev2_emu.runtime.exact`) read and make these, the trio shells move them.  Each
message is a few fields, but a report's ``sent`` and a grant's ``expect`` hold one count per
process they exchanged frames with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from rocev2_emu.control.kvstore import StoreOp, StoreReply
from rocev2_emu.runtime.link import faults_from_request

MAX_CHANGE_LINKS: Final = 4096  # links in one change (a bound on what a report may carry)
DONE: Final = "done"  # the stop reason of a run that ended normally
SHOWN_NODES: Final = 8  # nodes a message names of a process that hosts more
# What a node process says while it computes a granted window, every BEAT_SECONDS (wall): it is
# alive and working, so the coordinator does not take a window longer than its stall limit
# (thousands of nodes in one process, on a busy machine) for a process that stopped.
BEAT: Final = {"beat": True}
BEAT_SECONDS: Final = 10.0


def is_beat(msg: Any) -> bool:
    """Whether a node's message is :data:`BEAT` (anything else must be a report)."""
    return isinstance(msg, dict) and msg.get("beat") is True and len(msg) == 1


def process_label(name: str) -> str:
    """A node process as a message names it: its nodes (comma-separated), at most
    :data:`SHOWN_NODES` of them and how many more - a worker hosting 13 137 nodes is one short
    line, not 100 KB."""
    nodes = name.split(",")
    if len(nodes) <= SHOWN_NODES:
        return name
    return f"{','.join(nodes[:SHOWN_NODES])} and {len(nodes) - SHOWN_NODES} more"


class SyncError(Exception):
    """The synchronised run cannot go on (a dead or silent process, a broken link); ``node``:
    the process it is about, when one is to blame (its own last error line explains it)."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


class RunOver(Exception):
    """The coordinator ended the run normally (its job is done)."""


def ended_normally(exc: BaseException) -> bool:
    """``exc`` (what a process's trio run raised) is the coordinator's end of the run, a
    RunOver alone or in groups, and nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        over, rest = exc.split(RunOver)
        return over is not None and rest is None
    return isinstance(exc, RunOver)


@dataclass(slots=True, frozen=True)
class LinkChange:
    """The links between the named nodes go down (``up`` False) or come back at ``at`` (None:
    as soon as the run can take it - a change from outside the run, ``rocev2-emu link`` or the
    map; the coordinator gives it the instant its windows have reached).  With ``faults`` it
    changes the links' faults instead (both directions; the settings of
    :class:`~rocev2_emu.runtime.link.LinkFaults`, ``up`` unused)."""

    at: float | None
    pairs: tuple[tuple[str, str], ...]
    up: bool
    faults: tuple[tuple[str, float], ...] | None = None  # sorted (field, value) pairs

    def wire(self) -> list[Any]:
        item = [self.at, [list(p) for p in self.pairs], self.up]
        return item if self.faults is None else [*item, dict(self.faults)]

    def at_instant(self, at: float) -> LinkChange:
        return LinkChange(at, self.pairs, self.up, self.faults)

    @classmethod
    def from_wire(cls, item: Any) -> LinkChange:
        """A change as a process sent it, checked (ValueError names what is wrong)."""
        if not isinstance(item, list | tuple) or len(item) not in (3, 4):
            raise ValueError(f"a link change is [at, [[a, b], ...], up(, faults)]: {item!r:.80}")
        at, pairs, up = item[:3]
        if at is not None and (not isinstance(at, int | float) or not math.isfinite(at) or at < 0):
            raise ValueError(f"link change time {at!r:.40}")
        if not isinstance(up, bool) or not isinstance(pairs, list | tuple):
            raise ValueError(f"a link change's links or state: {item!r:.80}")
        if not 0 < len(pairs) <= MAX_CHANGE_LINKS or not all(
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and all(isinstance(n, str) for n in pair)
            for pair in pairs
        ):
            raise ValueError(f"a link change names 1 to {MAX_CHANGE_LINKS} [a, b] node pairs")
        faults = None
        if len(item) == 4:
            faults = change_faults(item[3])
        when = None if at is None else float(at)
        return cls(when, tuple((str(a), str(b)) for a, b in pairs), up, faults)


def change_faults(settings: Any) -> tuple[tuple[str, float], ...]:
    """Fault settings of a change, checked as a link's are (ValueError names the field)."""
    faults_from_request(settings)
    return tuple(sorted((str(k), float(v)) for k, v in settings.items()))


@dataclass(slots=True, frozen=True)
class Hello:
    """A node process's first word, once it has proved the run's secret: its name, and the
    indices of the hosts whose store operations it sends."""

    name: str
    origins: tuple[int, ...] = ()

    def wire(self) -> dict[str, Any]:
        return {"hello": self.name, "origin": list(self.origins)}

    @classmethod
    def from_wire(cls, msg: Any) -> Hello:
        name = msg.get("hello") if isinstance(msg, dict) else None
        if not isinstance(name, str):
            raise ValueError(f"a sync hello is {{'hello': name, 'origin': [...]}}: {msg!r:.80}")
        origins = msg.get("origin", [])
        items = origins if isinstance(origins, list) else [origins]
        return cls(name, tuple(o for o in items if isinstance(o, int) and not isinstance(o, bool)))


@dataclass(slots=True)
class Report:
    """One process's report at the end of a window."""

    next_time: float  # its next event, deadline or held instant; inf: none
    quiet: bool  # no frame event or core deadline on its heap, nothing in flight from it
    sent: dict[str, int]  # frames sent to each other process since the start
    received: int  # frames received since the start
    window: int = 0  # how many windows it had been granted when it reported
    strays: int = 0  # datagrams from addresses that are no peer's, dropped since the start
    store: list[StoreOp] = field(default_factory=list)  # operations for the store
    changes: list[LinkChange] = field(default_factory=list)  # changes to the fabric it asks for
    held: bool = False  # its clock is held for an out-of-band wait
    busy: bool = False  # its application decides in wall time (a torch rank computing)
    done: bool = False  # its application has finished

    def wire(self) -> dict[str, Any]:
        return {
            "next": self.next_time,
            "quiet": self.quiet,
            "held": self.held,
            "busy": self.busy,
            "done": self.done,
            "sent": self.sent,
            "received": self.received,
            "window": self.window,
            "strays": self.strays,
            "store": [op.wire() for op in self.store],
            "changes": [c.wire() for c in self.changes],
        }

    @classmethod
    def from_wire(cls, msg: Any) -> Report:
        """A report as a node sent it, each field checked (ValueError names it)."""
        if not isinstance(msg, dict):
            raise ValueError(f"a sync report must be a map, not {type(msg).__name__}")
        try:
            next_time = float(msg["next"])
            quiet = bool(msg["quiet"])
            sent = {str(k): int(v) for k, v in dict(msg["sent"]).items()}
            received = int(msg["received"])
            window = int(msg["window"])
            strays = int(msg.get("strays", 0))
            store = [StoreOp.from_wire(op) for op in msg.get("store", ())]
            changes = [LinkChange.from_wire(c) for c in msg.get("changes", ())]
            flags = [bool(msg.get(k)) for k in ("held", "busy", "done")]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a sync report's field is missing or wrong: {exc!r}") from exc
        if math.isnan(next_time):
            raise ValueError("a sync report's next time is NaN")
        return cls(next_time, quiet, sent, received, window, strays, store, changes, *flags)


@dataclass(slots=True)
class Grant:
    """The window a process may run: its end (``until``, emulated seconds), how many frames
    each other process has sent it so far (``expect``: all of them must be in first), the
    store's replies due to it, and the changes to the fabric handed out with the window."""

    until: float
    expect: dict[str, int] = field(default_factory=dict)
    store: list[StoreReply] = field(default_factory=list)
    changes: list[LinkChange] = field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"until": self.until, "expect": self.expect}
        if self.store:
            msg["store"] = [reply.wire() for reply in self.store]
        if self.changes:
            msg["changes"] = [c.wire() for c in self.changes]
        return msg

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> Grant:
        """A grant as the coordinator sent it, checked (ValueError names what is wrong)."""
        try:
            until = float(msg["until"])
            expect = {str(k): int(v) for k, v in dict(msg["expect"]).items()}
            store = [
                StoreReply(float(at), int(origin), int(seq), value, error)
                for at, origin, seq, value, error in msg.get("store", ())
            ]
            changes = [LinkChange.from_wire(item) for item in msg.get("changes", ())]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a grant's field is missing or wrong: {exc!r}") from exc
        if math.isnan(until):
            raise ValueError("a grant's window ends at NaN")
        return cls(until, expect, store, changes)


@dataclass(slots=True, frozen=True)
class Stop:
    """The run is over: normally (``reason`` :data:`DONE`) or why it was stopped."""

    reason: str

    def wire(self) -> dict[str, Any]:
        return {"stop": self.reason}


def from_coordinator(msg: Any) -> Grant | Stop:
    """What a node heard from the coordinator: a grant, or the end of the run (anything that
    is no grant is a stop, saying what came)."""
    if isinstance(msg, dict) and "stop" not in msg and "until" in msg:
        try:
            return Grant.from_wire(msg)
        except ValueError as exc:
            return Stop(f"a malformed grant ({exc})")
    why = msg.get("stop") if isinstance(msg, dict) else msg
    return Stop(why if isinstance(why, str) else repr(why))
