"""A topology's graph elements: its nodes (hosts and switches) and the links between them, and
the error a topology file that cannot be used raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names file, key and value."""


PAYLOADS = ("real", "none")  # [fabric] payload, --payload: real bytes, or timing-only


@dataclass(slots=True)
class Link:
    index: int
    a: str
    b: str
    rate_bps: float
    delay: float  # emulated seconds, one way
    loss: float

    @property
    def vni(self) -> int:
        return self.index + 1


class NodeKind(StrEnum):
    """What a node is: a host (its NIC and ranks) or a switch; its value is the topology
    file's table name (``[[host]]``, ``[[switch]]``) and the metrics' ``role`` label."""

    HOST = "host"
    SWITCH = "switch"


@dataclass(slots=True)
class Node:
    name: str
    kind: NodeKind
    index: int  # position among all nodes
    address: str  # local-mode UDP address
    ranks: int = 0
    rx_gbps: float = 0.0  # hosts: how fast the host drains its NIC (0: as fast as the link)
    ip: str = ""  # hosts: emulated IPv4 (the GID)
    buffer_bytes: int = 0  # switches: their own buffer (0: the fabric's [buffer] size_bytes)
    buffer_mode: str = ""  # switches: their own buffer mode ("": the fabric's [buffer] mode)
    server: str = ""  # hosts: the server whose accelerator's NIC this is ("": a server of its own)
    ports: list[tuple[Link, str]] = field(default_factory=list)  # (link, neighbour name)
