"""Protection domains and memory regions: what a remote peer may touch, and how.

A memory region registers a buffer (numpy array, bytearray, or any writable C-contiguous buffer)
with a protection domain and access flags (ibv_access_flags: LOCAL_WRITE, REMOTE_WRITE,
REMOTE_READ, REMOTE_ATOMIC).  It is addressed by a virtual address range and carries an lkey
and an rkey; keys, like QPNs, come from a CSPRNG (``random.SystemRandom``) so a peer cannot
guess them; tests may inject a seeded ``random.Random`` for reproducible runs.
Deregistration revokes both keys at once.  The responder checks remote access in the order
IBTA §9.7.4.1.3 (C9-89..C9-92) gives: rkey, protection domain, bounds, access rights.
"""

from __future__ import annotations

import enum
import random
from typing import Any

from rocev2_emu.transport.errors import LocalVerbsError


class Access(enum.IntFlag):
    """ibv_access_flags."""

    NONE = 0
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


class ProtectionDomain:
    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return f"ProtectionDomain({self.handle})"


class MemoryRegion:
    """A registered buffer: [addr, addr + length) with keys and access flags."""

    __slots__ = ("access", "addr", "buffer", "length", "lkey", "obj", "pd", "rkey", "valid")

    def __init__(
        self, pd: ProtectionDomain, obj: Any, access: Access, addr: int, lkey: int, rkey: int
    ) -> None:
        try:
            view = memoryview(obj)
        except TypeError as exc:
            raise LocalVerbsError(f"cannot register {type(obj).__name__}: not a buffer") from exc
        if view.readonly:
            raise LocalVerbsError("cannot register a read-only buffer")
        if not view.c_contiguous:
            raise LocalVerbsError("cannot register a non-contiguous buffer")
        self.buffer = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self.obj = obj
        self.pd = pd
        self.access = access
        self.addr = addr
        self.length = len(self.buffer)
        self.lkey = lkey
        self.rkey = rkey
        self.valid = True

    def contains(self, addr: int, length: int) -> bool:
        return self.addr <= addr and addr + length <= self.addr + self.length

    def view(self, addr: int, length: int) -> memoryview:
        off = addr - self.addr
        return self.buffer[off : off + length]

    def __repr__(self) -> str:
        return (
            f"MemoryRegion(addr=0x{self.addr:x}, length={self.length}, "
            f"lkey=0x{self.lkey:x}, rkey=0x{self.rkey:x}, access={self.access!r})"
        )


class MemoryTable:
    """Every MR of one NIC, looked up by lkey or rkey."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.SystemRandom()
        self._by_lkey: dict[int, MemoryRegion] = {}
        self._by_rkey: dict[int, MemoryRegion] = {}
        self._pd_count = 0

    def alloc_pd(self) -> ProtectionDomain:
        self._pd_count += 1
        return ProtectionDomain(self._pd_count)

    def _fresh_key(self) -> int:
        while True:
            key = self.rng.getrandbits(32)
            if key and key not in self._by_lkey and key not in self._by_rkey:
                return key

    def register(self, pd: ProtectionDomain, obj: Any, access: Access) -> MemoryRegion:
        if (
            access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)
            and not access & Access.LOCAL_WRITE
        ):
            # ibv_reg_mr(3): remote write or atomic requires local write
            raise LocalVerbsError(f"access {access!r} needs LOCAL_WRITE with REMOTE_WRITE/ATOMIC")
        addr = (0x7F00_0000_0000 | self.rng.getrandbits(36) << 12) & ~0xFFF
        mr = MemoryRegion(pd, obj, access, addr, self._fresh_key(), self._fresh_key())
        self._by_lkey[mr.lkey] = mr
        self._by_rkey[mr.rkey] = mr
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        if not mr.valid:
            raise LocalVerbsError(f"{mr!r} is already deregistered")
        mr.valid = False
        del self._by_lkey[mr.lkey]
        del self._by_rkey[mr.rkey]

    def by_lkey(self, lkey: int) -> MemoryRegion | None:
        return self._by_lkey.get(lkey)

    def by_rkey(self, rkey: int) -> MemoryRegion | None:
        return self._by_rkey.get(rkey)

    def __len__(self) -> int:
        return len(self._by_lkey)
