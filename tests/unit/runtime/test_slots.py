"""Lists that keep their slots (rocev2_emu.runtime.slots) and the FIFOs built on them."""

from __future__ import annotations

import random
from collections import deque

from rocev2_emu.runtime.slots import front_cut, put
from switch.port_state import Fifo, PrioQueue, QueueEntry


def test_put_fills_kept_slots_before_it_appends() -> None:
    items = ["a", "b", "c"]
    assert put(items, 1, "x") == 2
    assert items == ["a", "x", "c"]
    assert put(items, 3, "y") == 4
    assert items == ["a", "x", "c", "y"]


def test_front_cut_goes_back_to_the_front_and_cuts_a_long_read_part() -> None:
    items = list(range(10))
    assert front_cut(items, 10, 10) == 10  # all read: back to the front, the slots kept
    assert len(items) == 10
    assert front_cut(items, 3, 10) == 0  # a short read part stays
    items = list(range(100))
    assert front_cut(items, 64, 100) == 64  # most of it read, at least 64: cut off
    assert items == list(range(64, 100))


def _entry(n: int) -> QueueEntry:
    return QueueEntry(n.to_bytes(4, "big"), n % 3, n, False)


def test_a_fifo_gives_its_frames_back_in_order_through_every_cut() -> None:
    rng = random.Random(7)
    fifo, model = Fifo(), deque[int]()
    n = 0
    for _ in range(5000):
        if model and rng.random() < 0.5:
            assert fifo.pop().size == model.popleft()
        else:
            fifo.push(_entry(n))
            model.append(n)
            n += 1
        assert fifo.empty() == (not model)
        assert [e.size for e in fifo.queued()] == list(model)
    assert len(fifo.items) <= 2 * max(64, n)  # what it holds is bounded by what it held


def test_an_emptied_fifo_keeps_its_slots() -> None:
    fifo = Fifo()
    for i in range(8):
        fifo.push(_entry(i))
    for _ in range(8):
        fifo.pop()
    assert fifo.empty() and fifo.head == fifo.tail == 0
    assert len(fifo.items) == 8  # (not freed: the next frames take these slots)
    fifo.push(_entry(99))
    assert len(fifo.items) == 8 and fifo.pop().size == 99


def test_ingress_ports_take_turns_in_a_priority_queue() -> None:
    q, spare = PrioQueue(), list[Fifo]()
    for i in range(6):  # ports 0, 1, 2, 0, 1, 2
        q.push(i % 3, _entry(i), spare)
    q.push(0, _entry(6), spare)
    order = [q.pop(spare).size for _ in range(7)]
    assert order == [0, 1, 2, 3, 4, 5, 6]
    assert q.empty() and len(spare) == 3
