"""Lists that keep their slots (sans-IO, compiled with mypyc): a collection that empties and
fills at every frame - a FIFO, the things due for a look - as ``items[head:tail]`` of a list
that is never emptied, since CPython frees an emptied list's memory and the next append
allocates it again.  The list holds as many slots as the collection once held items.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def put(items: list[T], tail: int, item: T) -> int:
    """``item`` after ``items[:tail]``, in a slot kept or a new one; the new tail."""
    if tail < len(items):
        items[tail] = item
    else:
        items.append(item)
    return tail + 1


def front_cut(items: list[T], head: int, tail: int) -> int:
    """``items[:head]`` read: how far ``head`` and ``tail`` go back.  All read, both go back to
    the front (the slots stay); a read part of at least 64 that is most of it is cut off."""
    if head == tail:
        return head
    if head >= 64 and head * 2 >= tail:
        del items[:head]
        return head
    return 0
