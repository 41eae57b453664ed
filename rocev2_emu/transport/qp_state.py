"""The RC queue-pair state machine as a table (IBTA §10.3.1; ibv_modify_qp(3)).

Rules, in one place:

* States: RESET, INIT, RTR (ready to receive), RTS (ready to send), SQD (send queue drained),
  SQE (send queue error), ERR.  Any state may go to RESET or ERR with no attributes.
* Each other transition names the attributes it *requires* and those it *allows*; anything else
  is a :class:`~rocev2_emu.transport.errors.LocalVerbsError` naming the attribute and the
  transition.
* RESET/INIT may not post sends; RESET may not post receives; RTR and later receive; RTS (and
  SQD, for requests already started) send.  ERR accepts posts and flushes them.
* What the timer codes mean: the local ACK timeout (§9.7.6.1.3, C9-141) is 4.096 µs x
  2^timeout, 0 meaning infinite; the RNR NAK timer (§9.7.5.2.8, table 45) is the responder's
  min_rnr_timer code, 0..31, carried in the AETH.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Final

from rocev2_emu.transport.errors import LocalVerbsError
from rocev2_emu.transport.memory import Access


class QPState(enum.IntEnum):
    """ibv_qp_state."""

    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


PATH_MTUS: Final = (256, 512, 1024, 2048, 4096)


@dataclass(slots=True)
class QPAttr:
    """ibv_qp_attr; the fields that are not None form the attribute mask."""

    qp_state: QPState | None = None
    qp_access_flags: Access | None = None
    pkey_index: int | None = None
    port_num: int | None = None
    # INIT -> RTR
    path_mtu: int | None = None
    dest_qp_num: int | None = None
    rq_psn: int | None = None
    max_dest_rd_atomic: int | None = None
    min_rnr_timer: int | None = None
    ah_attr: str | None = None  # destination IPv4 address (the RoCEv2 GID is IPv4-mapped)
    traffic_class: int | None = None  # DSCP of the QP's packets (ah_attr.grh.traffic_class >> 2)
    # RTR -> RTS
    sq_psn: int | None = None
    timeout: int | None = None
    retry_cnt: int | None = None
    rnr_retry: int | None = None
    max_rd_atomic: int | None = None

    def mask(self) -> set[str]:
        return {name for name in _ATTR_NAMES if getattr(self, name) is not None}


_ATTR_NAMES: Final = tuple(f.name for f in fields(QPAttr) if f.name != "qp_state")


S = QPState
_INIT_ATTRS: Final = {"qp_access_flags", "pkey_index", "port_num"}
_RTR_REQ: Final = {
    "ah_attr",
    "path_mtu",
    "dest_qp_num",
    "rq_psn",
    "max_dest_rd_atomic",
    "min_rnr_timer",
}
_RTS_REQ: Final = {"sq_psn", "timeout", "retry_cnt", "rnr_retry", "max_rd_atomic"}
_RTS_OPT: Final = {"qp_access_flags", "min_rnr_timer"}

# (from, to) -> (required, optional)
TRANSITIONS: Final[dict[tuple[QPState, QPState], tuple[frozenset[str], frozenset[str]]]] = {
    (S.RESET, S.INIT): (frozenset({"qp_access_flags", "port_num"}), frozenset({"pkey_index"})),
    (S.INIT, S.INIT): (frozenset(), frozenset(_INIT_ATTRS)),
    (S.INIT, S.RTR): (
        frozenset(_RTR_REQ),
        frozenset({"qp_access_flags", "pkey_index", "traffic_class"}),
    ),
    (S.RTR, S.RTS): (frozenset(_RTS_REQ), frozenset(_RTS_OPT)),
    (S.RTS, S.RTS): (frozenset(), frozenset(_RTS_OPT)),
    (S.RTS, S.SQD): (frozenset(), frozenset()),
    (S.SQD, S.RTS): (frozenset(), frozenset(_RTS_OPT)),
    (S.SQD, S.SQD): (
        frozenset(),
        frozenset(
            _RTS_OPT | {"timeout", "retry_cnt", "rnr_retry", "max_rd_atomic", "max_dest_rd_atomic"}
        ),
    ),
    (S.SQE, S.RTS): (frozenset(), frozenset({"qp_access_flags"})),
}

_RANGES: Final[dict[str, tuple[int, int]]] = {
    "pkey_index": (0, 0),
    "port_num": (1, 1),
    "dest_qp_num": (0, 0xFFFFFF),
    "rq_psn": (0, 0xFFFFFF),
    "sq_psn": (0, 0xFFFFFF),
    "max_dest_rd_atomic": (0, 16),
    "max_rd_atomic": (0, 16),
    "min_rnr_timer": (0, 31),
    "timeout": (0, 31),
    "traffic_class": (0, 63),
    "retry_cnt": (0, 7),
    "rnr_retry": (0, 7),
}


def check_transition(current: QPState, attr: QPAttr) -> QPState:
    """Validate a modify-QP call; returns the target state or raises LocalVerbsError."""
    target = attr.qp_state
    if target is None:
        target = current
    elif not isinstance(target, QPState):  # an int: EnumType.__call__, the slow way
        target = QPState(target)
    given = attr.mask()
    if target is QPState.RESET or target is QPState.ERR:
        if given:
            raise LocalVerbsError(
                f"{current.name}->{target.name} takes no attributes, got {sorted(given)}"
            )
        return target
    rule = TRANSITIONS.get((current, target))
    if rule is None:
        raise LocalVerbsError(f"no QP transition {current.name}->{target.name}")
    required, optional = rule
    missing = required - given
    if missing:
        raise LocalVerbsError(f"{current.name}->{target.name} requires {sorted(missing)}")
    extra = given - required - optional
    if extra:
        raise LocalVerbsError(f"{current.name}->{target.name} does not allow {sorted(extra)}")
    for name in given:
        value = getattr(attr, name)
        if name in _RANGES:
            lo, hi = _RANGES[name]
            if not lo <= value <= hi:
                raise LocalVerbsError(f"QP attribute {name}={value} not in [{lo}, {hi}]")
    if attr.path_mtu is not None and attr.path_mtu not in PATH_MTUS:
        raise LocalVerbsError(f"QP attribute path_mtu={attr.path_mtu} not in {PATH_MTUS}")
    return target


def can_post_send(state: QPState) -> bool:
    # QPState's members, not the alias S: compiled, each is a C static (S is a globals look-up
    # and a class attribute read each: ~3 000 instructions a post)
    return state is QPState.RTS or state is QPState.SQD or state is QPState.ERR


def can_post_recv(state: QPState) -> bool:
    return state is not QPState.RESET


# -- what the timer attributes mean (IBTA §9.7.6.1.3, §9.7.5.2.8) ------------------------------

ACK_TIMEOUT_UNIT: Final = 4.096e-6

# Table 45: RNR NAK timer field encodings, in milliseconds; code 0 is the longest (655.36 ms).
RNR_TIMER_MS: Final[tuple[float, ...]] = (  # not a fixed-size native tuple: mypyc left that unset
    655.36,
    0.01,
    0.02,
    0.03,
    0.04,
    0.06,
    0.08,
    0.12,
    0.16,
    0.24,
    0.32,
    0.48,
    0.64,
    0.96,
    1.28,
    1.92,
    2.56,
    3.84,
    5.12,
    7.68,
    10.24,
    15.36,
    20.48,
    30.72,
    40.96,
    61.44,
    81.92,
    122.88,
    163.84,
    245.76,
    327.68,
    491.52,
)

RNR_RETRY_INFINITE: Final = 7


def local_ack_timeout(code: int) -> float | None:
    """Seconds the requester waits for an ACK before retrying; None when disabled (code 0)."""
    if code == 0:
        return None
    return ACK_TIMEOUT_UNIT * (1 << code)


def rnr_delay(code: int) -> float:
    return RNR_TIMER_MS[code & 0x1F] / 1000.0
