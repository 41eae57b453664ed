"""A switch's routes to every host, held as a default and its exceptions.

In a Clos most of a switch's hosts are reached the same way - a rack switch sends everything
but its own hosts up its uplinks, a cluster switch everything outside its zone up to the
aggregation layer - so a table of every host per switch grows as switches x hosts (42 M
entries for the 24 576-accelerator cluster).  A :class:`RouteTable` keeps the ports most
hosts are reached by and the hosts reached otherwise: it grows with those, and reads as the
full table (a mapping of every host).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TypeVar

K = TypeVar("K")

Ports = tuple[int, ...]


class RouteTable(Mapping[K, Ports]):
    """Every key of ``keys`` (the fabric's hosts, in order, shared by its tables; ``members``
    the same as a set) to its ports: ``other`` where it has them, else ``default``."""

    __slots__ = ("default", "keys_", "members", "other")

    def __init__(
        self, keys: tuple[K, ...], members: frozenset[K], default: Ports, other: dict[K, Ports]
    ) -> None:
        self.keys_ = keys
        self.members = members
        self.default = default
        self.other = other

    @classmethod
    def of(cls, full: dict[K, Ports], keys: tuple[K, ...], members: frozenset[K]) -> RouteTable[K]:
        """The table of ``full`` (every key of ``keys``), its commonest ports the default."""
        if not full:
            return cls(keys, members, (), {})
        default = Counter(full.values()).most_common(1)[0][0]
        return cls(keys, members, default, {k: p for k, p in full.items() if p != default})

    @classmethod
    def of_runs(
        cls, runs: list[tuple[list[K], Ports]], keys: tuple[K, ...], members: frozenset[K]
    ) -> RouteTable[K]:
        """The table of ``runs`` (keys that take the same ports, each key once): the table
        :meth:`of` makes of the full mapping they spell, in their order, without making it."""
        counts: dict[Ports, int] = {}
        for names, ports in runs:
            counts[ports] = counts.get(ports, 0) + len(names)
        if not counts:
            return cls(keys, members, (), {})
        default = max(counts, key=counts.__getitem__)  # the first of the commonest, as of's
        other = {k: ports for names, ports in runs if ports != default for k in names}
        return cls(keys, members, default, other)

    def __getitem__(self, key: K) -> Ports:
        got = self.other.get(key)
        if got is not None:
            return got
        if key in self.members:
            return self.default
        raise KeyError(key)

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)
