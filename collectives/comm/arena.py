"""Receive slots from a few large anonymous mappings: memory committed page by page as it is
written, never when it is handed out.

A link end holds ``slots x slot_bytes`` of receive slots (1 MiB by default), and a job of
thousands of ranks holds several per rank, of which a small message writes a few pages.  Taken
with ``np.zeros``, glibc serves such a block from its heap once a freed mapping has raised its
mmap threshold, and clears it there: every page is touched at once.  Here slots are slices of
private anonymous mappings of :data:`CHUNK` bytes (zero pages until written; a block larger
than that gets a mapping of its own), page-aligned; a mapping goes back to the kernel once no
slice of it is left.  Grows with the slots handed out, a mapping per ``CHUNK``: the process's
count of mappings (``vm.max_map_count``) stays small.
"""

from __future__ import annotations

import mmap
from typing import Final

import numpy as np

CHUNK: Final = 256 << 20
_PAGE: Final = mmap.PAGESIZE
_PRIVATE: Final = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # never shared with a forked child
_open: list[tuple[mmap.mmap, int]] = []  # the mapping slices come from, and its next free byte


def _map(size: int) -> mmap.mmap:
    """Anonymous memory of ``size`` bytes, private: Python's default mapping is shared, and a
    node process forked from the launcher would write into the launcher's slots."""
    return mmap.mmap(-1, size, flags=_PRIVATE)


def zeros(nbytes: int) -> np.ndarray:
    """``nbytes`` zero bytes (uint8), writable, committed as they are written."""
    size = max(nbytes, 1)
    if size > CHUNK:
        return np.frombuffer(_map(size), np.uint8)[:nbytes]
    if not _open or _open[0][1] + size > CHUNK:
        _open[:] = [(_map(CHUNK), 0)]
    block, at = _open[0]
    _open[0] = (block, at + -(-size // _PAGE) * _PAGE)
    return np.frombuffer(block, np.uint8, count=nbytes, offset=at)
