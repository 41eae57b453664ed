"""Benchmarks that print figures: the plain-UDP baseline and the NIC's datagram rate.

``udp-baseline`` measures what plain blocking Python moves on this machine: one process sends
datagrams of a RoCE data frame's size (a 4096-byte payload in VXLAN/Ethernet/IPv4/UDP/BTH/ICRC)
on a connected socket as fast as it can, another receives them with ``recv_into``; the figure is
datagrams received per wall second.  ``write-bw`` measures the same thing for the emulated NIC:
perftest write-bw between two processes over a direct link at unpaced emulated rate, MTU 4096,
TDF 1 (so emulated and wall time coincide), and reports data packets per second next to the
baseline measured in the same run.  Figures, never assertions: CI does not time anything.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event as EventType
from typing import Any, Final

from rocev2_emu.tools.perftest import wait_until_listening
from rocev2_emu.wire.bth import BTH_LEN, ICRC_LEN
from rocev2_emu.wire.ethernet import ETH_LEN, IPV4_LEN, LINK_UDP_PORT, UDP_LEN, VXLAN_LEN

DATA_DATAGRAM: Final = VXLAN_LEN + ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN + 4096 + ICRC_LEN


READY_S: Final = 60.0  # how long a process may take to start, or a forwarder to pass a frame


def _udp_receiver(
    addr: tuple[str, int],
    seconds: float,
    out: mp.Queue[tuple[int, float]],
    through: EventType | None = None,
    go: EventType | None = None,
) -> None:
    """Count the datagrams arriving at ``addr``: from the first one (however long its sender
    takes to start) until 2 s of silence.  With ``through`` and ``go``: first wait for a probe
    to come through the forwarder (set ``through``), let the probes drain (0.2 s of silence),
    then set ``go`` and count the blast.  Puts ``(0, 0.0)`` once bound, then (count, seconds)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(addr)
    buf = bytearray(65536)
    out.put((0, 0.0))  # bound
    count = 0
    first = last = 0.0
    try:
        if through is not None and go is not None:
            sock.settimeout(READY_S)
            sock.recv_into(buf)  # a probe came through: the forwarder is up
            through.set()
            sock.settimeout(0.2)
            drained = time.monotonic() + 5
            with contextlib.suppress(TimeoutError):
                while time.monotonic() < drained:
                    sock.recv_into(buf)
            go.set()
        sock.settimeout(READY_S)
        deadline = time.monotonic() + READY_S + seconds
        while time.monotonic() < deadline:
            sock.recv_into(buf)
            last = time.monotonic()
            if count == 0:
                first = last
                sock.settimeout(2.0)
            count += 1
    except TimeoutError:
        pass
    finally:
        sock.close()
    out.put((count, last - first))


def _udp_sender(addr: tuple[str, int], seconds: float, size: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    sock.connect(addr)  # the faster of the two plain ways (the NIC's port connects too)
    data = bytes(size)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(64):
            sock.send(data)
    sock.close()


def udp_baseline(
    seconds: float = 3.0, size: int = DATA_DATAGRAM, addr: tuple[str, int] = ("127.0.0.9", 47910)
) -> float:
    """Datagrams per second from a blocking Python sender to a blocking Python receiver."""
    ctx = mp.get_context("spawn")
    q: mp.Queue[tuple[int, float]] = ctx.Queue()
    rx = ctx.Process(target=_udp_receiver, args=(addr, seconds, q))
    rx.start()
    q.get(timeout=READY_S)
    tx = ctx.Process(target=_udp_sender, args=(addr, seconds, size))
    tx.start()
    tx.join(READY_S + seconds)
    count, elapsed = q.get(timeout=2 * READY_S + seconds)
    rx.join(10)
    return count / elapsed if elapsed > 0 else 0.0


def nic_write_bw(seconds: float = 3.0, size: int = 65536) -> tuple[float, str]:
    """Data packets per second of perftest write-bw, unpaced, MTU 4096, TDF 1; and its output."""
    base = [
        sys.executable,
        "-m",
        "rocev2_emu",
        "write-bw",
        "--rate",
        "0",
        "--tdf",
        "1",
        "-m",
        "4096",
        "-s",
        str(size),
        "-D",
        str(seconds),
        "-p",
        "18599",
    ]
    server = subprocess.Popen(
        [*base, "--nic-addr", "127.0.0.12"], stdout=subprocess.PIPE, text=True
    )
    try:
        wait_until_listening(server)
        out = subprocess.run(
            [*base, "127.0.0.1", "--nic-addr", "127.0.0.13"],
            capture_output=True,
            text=True,
            timeout=seconds * 10 + 60,
            check=True,
        ).stdout
    finally:
        server.communicate(timeout=30)
    m = re.search(r"^\s*\d+\s+\d+\s+([\d.]+)\s+([\d.]+)", out, re.M)
    if m is None:
        raise RuntimeError(f"could not read perftest output:\n{out}")
    mb_per_s = float(m.group(2))
    return mb_per_s * 2**20 / 4096, out


def _frame_sender(
    addr: tuple[str, int],
    seconds: float,
    vni: int,
    bind: tuple[str, int],
    through: EventType,
    go: EventType,
) -> None:
    """Probe ``addr`` until a frame came through (``through``), then, on ``go``, blast one valid
    4096-byte-payload RoCE frame (10.0.0.1 -> 10.0.0.2) at it from ``bind`` (a switch port takes
    frames only from its link's peer address)."""
    from rocev2_emu.wire.roce import FrameTemplate

    tpl = FrameTemplate(
        vni=vni,
        src_mac=bytes(6),
        dst_mac=bytes(6),
        src_ip=0x0A000001,
        dst_ip=0x0A000002,
        sport=0xC000,
    )
    data = tpl.build(0x07, 1, 0, payload=bytes(4096))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(bind)
    sock.connect(addr)
    ready = time.monotonic() + READY_S
    while not through.wait(0.02):  # a probe every 20 ms until one came through
        if time.monotonic() > ready:
            sock.close()
            return
        with contextlib.suppress(OSError):  # ECONNREFUSED while the forwarder starts
            sock.send(data)
    if go.wait(READY_S):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(64):
                with contextlib.suppress(OSError):
                    sock.send(data)
    sock.close()


def _plain_forwarder(listen: tuple[str, int], out: tuple[str, int], seconds: float) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(listen)
    rx.settimeout(READY_S)  # the first frame: however long the sender takes to start
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    buf = bytearray(65536)
    view = memoryview(buf)
    deadline = time.monotonic() + 2 * READY_S + seconds
    try:
        while time.monotonic() < deadline:
            n = rx.recv_into(buf)
            rx.settimeout(2.0)
            tx.sendto(view[:n], out)
    except TimeoutError:
        pass


def _forwarding_rate(
    start_forwarder: Callable[[], Any],
    listen: tuple[str, int],
    sink: tuple[str, int],
    seconds: float,
    vni: int,
    source: tuple[str, int],
) -> float:
    ctx = mp.get_context("spawn")
    q: mp.Queue[tuple[int, float]] = ctx.Queue()
    through, go = ctx.Event(), ctx.Event()
    rx = ctx.Process(target=_udp_receiver, args=(sink, seconds, q, through, go))
    rx.start()
    q.get(timeout=READY_S)
    forwarder = start_forwarder()
    # no sleep: the sender probes until a frame came through the forwarder, then blasts
    tx = ctx.Process(target=_frame_sender, args=(listen, seconds, vni, source, through, go))
    tx.start()
    tx.join(3 * READY_S + seconds)
    count, elapsed = q.get(timeout=3 * READY_S + seconds)
    rx.join(10)
    if isinstance(forwarder, subprocess.Popen):
        forwarder.terminate()
        forwarder.wait(10)
    else:
        forwarder.join(seconds + 30)
    return count / elapsed if elapsed > 0 else 0.0


def switch_vs_forwarder(seconds: float) -> tuple[float, float]:
    """Frames/s through a plain blocking Python forwarder and through one emulated switch."""
    import tempfile

    from rocev2_emu.fabric import blocks
    from rocev2_emu.topology.file import load
    from rocev2_emu.topology.generate import single_switch

    ctx = mp.get_context("spawn")
    fwd_in, sink = ("127.0.0.60", LINK_UDP_PORT), ("127.0.0.61", LINK_UDP_PORT)
    plain = _forwarding_rate(
        lambda: _started(ctx.Process(target=_plain_forwarder, args=(fwd_in, sink, seconds))),
        fwd_in,
        sink,
        seconds,
        1,
        ("127.0.0.62", LINK_UDP_PORT),
    )
    with tempfile.TemporaryDirectory() as tmp:
        topo = f"{tmp}/bench.toml"
        with open(topo, "w") as f:
            f.write(single_switch(2, rate_gbps=0.0, delay_us=0.0))
        # sw0, h0 (the switch's port 0, VNI 1) and h1 (the sink) on a free block of 127/8
        two = load(topo)
        block = blocks.first_free(two, list(two.nodes))
        if block is None:
            raise OSError("no block of 127/8 has the switch's nodes' ports free")
        sw0, h0, h1 = (two.nodes[n].address for n in ("sw0", "h0", "h1"))
        switch = _forwarding_rate(
            lambda: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rocev2_emu",
                    "node",
                    topo,
                    "sw0",
                    "--tdf",
                    "1",
                    "--no-metrics",
                ],
                stdout=subprocess.DEVNULL,
                env={**os.environ, blocks.ENV: str(block)},
            ),
            (sw0, LINK_UDP_PORT),
            (h1, LINK_UDP_PORT),
            seconds,
            1,
            (h0, LINK_UDP_PORT),  # the peer of the switch's port 0
        )
    return plain, switch


def _started(proc: Any) -> Any:
    proc.start()
    return proc


def main(which: str, seconds: float) -> int:
    print(
        f"# datagram of {DATA_DATAGRAM} bytes (4096-byte RoCE payload in VXLAN), "
        f"{seconds:g} s per run, 127.0.0.0/8 loopback"
    )
    if which == "switch":
        plain, switch = switch_vs_forwarder(seconds)
        print(f"forwarder      blocking Python recv_into -> sendto   {plain:>10.0f} frames/s")
        print(f"switch         rocev2-emu node (unpaced links)       {switch:>10.0f} frames/s")
        if not switch or not plain:
            who = "the switch" if not switch else "the blocking forwarder"
            print(f"error: no frame came through {who}: no ratio (see rocev2-emu node -v)")
            return 1
        print(f"ratio          switch / forwarder                    {switch / plain:>10.2f}")
        return 0
    baseline = udp_baseline(seconds)
    print(f"udp-baseline   blocking Python send -> recv_into     {baseline:>10.0f} datagrams/s")
    if which == "udp-baseline":
        return 0
    rate, out = nic_write_bw(seconds)
    print(out.rstrip())
    print(f"nic write-bw   perftest, unpaced, MTU 4096, TDF 1    {rate:>10.0f} data packets/s")
    if not rate or not baseline:
        who = "the NIC" if not rate else "the plain UDP baseline"
        print(f"error: no datagram came through {who}: no ratio")
        return 1
    print(f"ratio          nic / baseline                        {rate / baseline:>10.2f}")
    return 0
