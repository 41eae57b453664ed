"""A real fabric: one process per switch and host on 127.10.0.0/16, started by `rocev2-emu up`,
running flow lists whose every byte is verified end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio

from rocev2_emu.control import auth
from rocev2_emu.fabric.blocks import ENV, first_free, running
from rocev2_emu.fabric.control import control
from rocev2_emu.topology.file import load
from rocev2_emu.topology.generate import leaf_spine, single_switch

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "rocev2_emu"]


def node_stats(topo: Path, address: str) -> dict[str, Any]:
    """A running node's counters, asked as ``rocev2-emu`` would (with the fabric's secret)."""
    auth.use_fabric(str(topo))
    try:
        stats: dict[str, Any] = trio.run(control, address, {"cmd": "stats"})
        return stats
    finally:
        auth.use(None)


def write_topology(path: Path, text: str, **sections: dict[str, object]) -> Path:
    lines = [line for line in text.splitlines()]
    extra = []
    for section, values in sections.items():
        extra.append(f"[{section}]")
        extra += [
            f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()
        ]
        # drop the generator's own section of that name
        if f"[{section}]" in lines:
            i = lines.index(f"[{section}]")
            j = i + 1
            while j < len(lines) and lines[j] and not lines[j].startswith("["):
                j += 1
            del lines[i:j]
    path.write_text("\n".join([*lines, "", *extra]) + "\n")
    tomllib.loads(path.read_text())
    return path


def write_flows(path: Path, flows: list[tuple[str, str, int]]) -> Path:
    path.write_text(
        "".join(f'[[flow]]\nsrc = "{s}"\ndst = "{d}"\nsize = {n}\n\n' for s, d, n in flows)
    )
    return path


def up(topology: Path, flows: Path, *extra: str, timeout: float = 240) -> str:
    proc = subprocess.run(
        [*CLI, "up", str(topology), "--clock", "wall", "--flows", str(flows), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def fabric_line(out: str, key: str) -> int:
    m = re.search(rf"{key} (\d+)", out)
    assert m is not None, out
    return int(m.group(1))


INCAST = [(f"h{i}", "h4", 1 << 20) for i in range(4)]


def lossless(out: str) -> bool:
    """What PFC promises: every flow verified, the switch paused its senders, nothing dropped
    and nothing retransmitted."""
    return (
        out.count("ok, verified") == 4
        and fabric_line(out, "PFC frames sent") > 0
        and fabric_line(out, "PFC pauses honoured") > 0
        and re.search(r"drops 0 ", out) is not None
        and fabric_line(out, "retransmitted packets") == 0
    )


def test_incast_with_pfc_is_lossless(tmp_path: Path) -> None:
    topo = write_topology(
        tmp_path / "t.toml",
        single_switch(5),
        buffer={"size_bytes": 1 << 20, "headroom_bytes": 96 * 1024},
        ecn={"enabled": False, "priorities": [3]},
    )
    flows = write_flows(tmp_path / "f.toml", INCAST)
    # on the exact clock a busy machine cannot make the processes fall behind: a loss here
    # would be PFC's failure, whatever the load
    out = up(topo, flows, "--clock", "exact")
    assert lossless(out), out


def test_incast_without_pfc_drops_and_recovers(tmp_path: Path) -> None:
    topo = write_topology(
        tmp_path / "t.toml",
        single_switch(5),
        buffer={"size_bytes": 400 * 1024, "headroom_bytes": 0},
        pfc={"enabled": False},
        ecn={"enabled": False, "priorities": [3]},
        dcqcn={"enabled": False},
        # a small window keeps go-back-N from starving one flow into retry exhaustion, which
        # a lossy incast can really do (and then the test would be about luck)
        transport={"qp_timeout": 8, "max_inflight": 32},
    )
    flows = [(src, dst, 256 << 10) for src, dst, _ in INCAST]
    out = up(topo, write_flows(tmp_path / "f.toml", flows), "--tdf", "1000")
    assert out.count("ok, verified") == 4
    assert fabric_line(out, "PFC frames sent") == 0
    m = re.search(r"drops (\d+) \{'buffer': (\d+)", out)
    assert m is not None and int(m.group(2)) > 0, out
    assert fabric_line(out, "retransmitted packets") > 0


def test_leaf_spine_flow_survives_a_spine_link_going_down(tmp_path: Path) -> None:
    topo = write_topology(tmp_path / "t.toml", leaf_spine(2, 2, 1))
    flows = write_flows(tmp_path / "f.toml", [("h0", "h1", 8 << 20) for _ in range(6)])
    # TDF 2000: the six flows take seconds of wall time, far longer than `link` needs to start
    proc = subprocess.Popen(
        [*CLI, "up", str(topo), "--clock", "wall", "--flows", str(flows), "--tdf", "2000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        seen = ""
        while "ready" not in seen and time.monotonic() < deadline:
            seen += proc.stdout.readline()
        assert "ready" in seen, seen
        # the flows are running once leaf0 forwards data towards a spine (readiness, not a sleep)
        leaf0 = running(load(topo), str(topo)).nodes["leaf0"].address  # on the run's block
        while node_stats(topo, leaf0)["tx_packets"] < 100:
            assert time.monotonic() < deadline + 60, "the flows never started"
        down = subprocess.run(
            [*CLI, "link", str(topo), "leaf0", "spine0", "down"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert down.returncode == 0, down.stderr
        assert "is down" in down.stdout
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    assert out.count("ok, verified") == 6


def test_faults_change_at_run_time_and_switch_metrics_are_served(tmp_path: Path) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    topo = write_topology(tmp_path / "t.toml", single_switch(3), transport={"qp_timeout": 8})
    flows = write_flows(tmp_path / "f.toml", [("h0", "h2", 24 << 20)])
    proc = subprocess.Popen(
        [*CLI, "up", str(topo), "--clock", "wall", "--flows", str(flows), "--tdf", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = ""
        while "ready" not in seen:  # pytest's timeout ends a run that never gets there
            line = proc.stdout.readline()
            if not line:  # it exited: say why, not what a later step trips over
                assert proc.stderr is not None
                raise AssertionError(f"up exited before ready:\n{seen}{proc.stderr.read()}")
            seen += line
        lossy = subprocess.run(
            [*CLI, "link", str(topo), "h0", "sw0", "--loss", "0.02"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert lossy.returncode == 0, lossy.stderr
        assert "loss 0.02" in lossy.stdout
        sw0 = running(load(topo), str(topo)).nodes["sw0"].address  # the run's block
        body = urllib.request.urlopen(f"http://{sw0}:9100/metrics", timeout=10).read()
        names = {
            s.name for fam in text_string_to_metric_families(body.decode()) for s in fam.samples
        }
        for name in (
            "rocev2_switch_tx_packets_total",
            "rocev2_switch_pfc_tx_frames_total",
            "rocev2_switch_ecn_marked_packets_total",
            "rocev2_switch_queue_bytes",
            "rocev2_switch_paused_seconds_total",
            "rocev2_switch_buffer_bytes",
            "rocev2_switch_pfc_watchdog_storms_detected_total",
            "rocev2_emulation_tdf",
            "rocev2_emulated_seconds_total",
        ):
            assert name in names, name
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)  # reaped, its pipes closed, whatever happened above
    assert proc.returncode == 0, out + err
    assert "ok, verified" in out
    assert fabric_line(out, "retransmitted packets") > 0  # the loss set at run time bit


def test_a_switch_drops_frames_from_anyone_but_its_link_peers(tmp_path: Path) -> None:
    import socket
    import time as clock

    from rocev2_emu.wire.ethernet import LINK_UDP_PORT, encode_vxlan
    from rocev2_emu.wire.pfc import encode_pfc

    topo = write_topology(tmp_path / "t.toml", single_switch(2))
    two = load(topo)  # on a free block of 127/8: another fabric may run on 127.10
    block = first_free(two, list(two.nodes))
    assert block is not None
    sw0 = two.nodes["sw0"].address
    node = subprocess.Popen(
        [*CLI, "node", str(topo), "sw0", "--no-metrics"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, ENV: str(block)},
    )
    try:
        assert node.stdout is not None
        ready = node.stdout.readline()
        assert ready.startswith("READY sw0 metrics=off "), ready  # --no-metrics: none served
        # an XOFF for port 0's VNI (link 0: h0's), from an address that is not h0's
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.77", 0))
            s.sendto(encode_vxlan(1, encode_pfc(bytes(6), {3: 0xFFFF})), (sw0, LINK_UDP_PORT))
        deadline = clock.monotonic() + 30  # the switch reads it at its next wake-up
        while True:
            stats = node_stats(topo, sw0)
            if stats["drops"].get("not_from_peer") or clock.monotonic() > deadline:
                break
        assert stats["drops"].get("not_from_peer") == 1, stats
        assert stats["pfc_rx"] == 0  # the forged pause was not honoured
    finally:
        node.terminate()
        node.wait(30)
        if node.stdout is not None:
            node.stdout.close()
        auth.run_file(str(topo)).unlink(missing_ok=True)  # the secret the node made
