"""What one wake-up costs: the CPU a process spends to be woken by one datagram and send one.

    .venv/bin/python benchmarks/wakeup_cost.py [--count 5000] [--interval-ms 1]

A sender process writes a 4162-byte datagram (a 4 KiB RoCE frame in VXLAN) every
``--interval-ms`` to a receiver, which sends each one on to a sink.  The receiver is, in turn:

- ``blocking``: a plain blocking ``recv`` / ``send`` loop;
- ``trio``: a trio task awaiting ``wait_readable`` on the socket, then draining it;
- ``trio + deadline``: the same inside ``trio.move_on_at`` (a fresh cancel scope per wake-up),
  which is what the emulator's pump does (rocev2_emu/runtime/pump.py) to wake at the core's
  next deadline as well.

It prints microseconds of CPU (user + system, ``getrusage``) per datagram.  Spaced datagrams,
one per wake-up, are what the nodes of a dilated fabric see: at TDF 10 000 a 100 Gbit/s link
carries one 4 KiB frame every 3.4 ms of real time.  Figures, not assertions
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import socket
import time
from collections.abc import Callable

import trio

FRAME = 4162


def _sender(port: int, count: int, interval: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    buf, due = b"x" * FRAME, time.monotonic()
    for _ in range(count):
        due += interval
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        s.send(buf)
    s.close()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _blocking(rx: socket.socket, tx: socket.socket, count: int) -> float:
    rx.setblocking(True)
    rx.recv(65536)  # the clock starts at the first datagram
    start, got = _cpu(), 0
    while got < count:
        tx.send(rx.recv(65536))
        got += 1
    return (_cpu() - start) / got


def _trio(deadline: bool) -> Callable[[socket.socket, socket.socket, int], float]:
    async def loop(rx: socket.socket, tx: socket.socket, count: int) -> float:
        await trio.lowlevel.wait_readable(rx)
        rx.recv(65536)
        start, got = _cpu(), 0
        while got < count:
            if deadline:
                with trio.move_on_at(trio.current_time() + 0.5):
                    await trio.lowlevel.wait_readable(rx)
            else:
                await trio.lowlevel.wait_readable(rx)
            while got < count:
                try:
                    data = rx.recv(65536)
                except BlockingIOError:
                    break
                tx.send(data)
                got += 1
        return (_cpu() - start) / got

    return lambda rx, tx, count: trio.run(loop, rx, tx, count)


def measure(
    receive: Callable[[socket.socket, socket.socket, int], float], count: int, interval: float
) -> float:
    """CPU seconds per datagram of ``receive`` while a sender paces ``count`` + 1 at
    ``interval``."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(sink.getsockname())
    sender = multiprocessing.Process(
        target=_sender, args=(rx.getsockname()[1], count + 1, interval), daemon=True
    )
    sender.start()
    try:
        return receive(rx, tx, count)
    finally:
        sender.join(timeout=count * interval + 10)
        for s in (rx, tx, sink):
            s.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=5000, help="datagrams per receiver (5000)")
    p.add_argument("--interval-ms", type=float, default=1.0, help="between datagrams (1 ms)")
    args = p.parse_args()
    kinds = {
        "blocking": _blocking,
        "trio": _trio(deadline=False),
        "trio + deadline": _trio(deadline=True),
    }
    print(f"# one {FRAME}-byte datagram every {args.interval_ms:g} ms, {args.count} each")
    for name, receive in kinds.items():
        per = measure(receive, args.count, args.interval_ms / 1e3)
        print(f"{name:>16}: {per * 1e6:6.1f} us of CPU per wake-up (one datagram in, one out)")


if __name__ == "__main__":
    main()
