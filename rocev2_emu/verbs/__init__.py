"""The verbs API: what an application of the emulated fabric imports, shaped after pyverbs.

One import line serves a program (``from rocev2_emu.verbs import Context, PD, MR, CQ, QP,
...``): the device and its objects (:mod:`~rocev2_emu.verbs.api`), work requests and
completions, access flags, QP attributes and states, the errors, and the out-of-band exchange
that brings two QPs to RTS (:mod:`~rocev2_emu.verbs.oob`).  Layers above the NIC (the fabric's
host agents, the collectives, perftest) use only these names.
"""

from __future__ import annotations

from rocev2_emu.transport.errors import LocalVerbsError, RemoteVerbsError, VerbsError
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.qp_state import QPAttr, QPState
from rocev2_emu.transport.work import (
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context, DeviceConfig, RemoteQP
from rocev2_emu.verbs.doorbell import Doorbell
from rocev2_emu.verbs.oob import (
    DEFAULT_OOB_PORT,
    FABRIC_SECRET_ENV,
    OobChannel,
    OobError,
    QPInfo,
    connect_qp,
    connection_limit,
    fabric_secret,
    serve_requests,
)

__all__ = [
    "CQ",
    "DEFAULT_OOB_PORT",
    "FABRIC_SECRET_ENV",
    "MR",
    "PD",
    "QP",
    "Access",
    "Context",
    "DeviceConfig",
    "Doorbell",
    "LocalVerbsError",
    "OobChannel",
    "OobError",
    "QPAttr",
    "QPInfo",
    "QPState",
    "RecvWR",
    "RemoteQP",
    "RemoteVerbsError",
    "SendFlags",
    "SendWR",
    "Sge",
    "VerbsError",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
    "connect_qp",
    "connection_limit",
    "fabric_secret",
    "serve_requests",
]
