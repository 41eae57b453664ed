"""Receive slots from the arena: zeros, page-aligned, and a forked node process's own."""

from __future__ import annotations

import os

import numpy as np

from collectives.comm import arena


def test_slots_are_zeros_apart_and_a_forked_childs_writes_stay_in_the_child() -> None:
    a, b = arena.zeros(5000), arena.zeros(3)
    assert a.dtype == np.uint8 and a.size == 5000 and not a.any() and not b.any()
    a[:] = 1
    assert not b.any()  # a page apart: writing one never reaches the next
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a node process forked from the launcher takes slots of its own
        c = arena.zeros(4096)
        c[:] = 7
        a[:] = 9
        os.write(write, b"x")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"x"
    os.waitpid(pid, 0)
    d = arena.zeros(4096)  # the same place the child's slot had in its copy of the arena
    assert not d.any() and (a == 1).all()  # the child's writes never reached the parent
