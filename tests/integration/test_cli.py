"""The perftest commands as users run them: two processes, perftest's output, a pcap of the
run decoded by tshark, and Prometheus metrics scraped while it runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from rocev2_emu.control import auth
from rocev2_emu.fabric.blocks import ENV, first_free
from rocev2_emu.tools.perftest import wait_until_listening
from rocev2_emu.topology.file import load
from rocev2_emu.verbs.api import Context, DeviceConfig
from rocev2_emu.wire.ethernet import LINK_UDP_PORT
from tests.conftest import require_tool
from tests.integration.test_processes import free_port

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "rocev2_emu"]


def serve_and_ask(
    server_argv: list[str], client_argv: list[str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """A perftest server started, its client run once it listens: (client, server), each with
    its output (the server's stdout from after its "Waiting for client" line)."""
    # the with block closes the server's pipes and reaps it however the test ends
    with subprocess.Popen(
        server_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as server:
        try:
            wait_until_listening(server)
            client = subprocess.run(client_argv, capture_output=True, text=True, timeout=timeout)
            out, err = server.communicate(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
    return client, subprocess.CompletedProcess(server_argv, server.returncode, out, err)


def run_pair(
    test: str, *flags: str, client_flags: tuple[str, ...] = (), top: tuple[str, ...] = ()
) -> tuple[str, str]:
    """``top``: flags before the command (``--no-batch-io``)."""
    port = str(free_port())
    common = [*flags, "-p", port, "--tdf", "20", "--connect-timeout", "30"]
    client, server = serve_and_ask(
        [*CLI, *top, test, *common, "--nic-addr", "127.0.0.41"],
        [*CLI, *top, test, "127.0.0.1", *common, *client_flags, "--nic-addr", "127.0.0.42"],
    )
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, server.stderr
    return client.stdout, server.stdout


@pytest.mark.parametrize("test", ["write-bw", "read-bw", "send-bw"])
def test_bandwidth_tests_print_perftest_tables(test: str) -> None:
    client, server = run_pair(test, "-s", "8192", "-n", "200")
    for out in (client, server):
        assert re.search(
            r"local address: LID 0000 QPN 0x[0-9a-f]+ PSN 0x[0-9a-f]{6} "
            r"RKey 0x[0-9a-f]{8} VAddr 0x[0-9a-f]{16}",
            out,
        )
        assert "remote address: LID 0000 QPN" in out
        assert "TDF 20" in out
    row = re.search(r"^ 8192\s+200\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", client, re.M)
    assert row is not None, client
    peak, avg, mpps = map(float, row.groups())
    assert mpps > 0
    assert 0 < avg <= peak
    assert avg < 100e9 / 8 / 2**20  # never faster than the 100 Gbit/s link it emulates


def test_write_lat_and_report_gbits_and_all_sizes() -> None:
    client, _ = run_pair("write-lat", "-n", "50")
    assert "t_typical[usec]" in client
    assert re.search(r"^ 2\s+50\s+[\d.]+", client, re.M)
    client, _ = run_pair("write-bw", "-a", "-n", "4", "--report_gbits", "--rate", "0")
    assert "BW average[Gb/sec]" in client
    sizes = [int(m) for m in re.findall(r"^ (\d+)\s+4\s", client, re.M)]
    assert sizes == [1 << k for k in range(1, 24)]


def test_write_lat_in_virtual_time_wakes_the_side_polling_its_memory() -> None:
    """write-lat spins on registered memory, woken by each received batch: the event engine
    calls the NIC's driver after a service only when the core has news, and a task waiting
    for received frames is such news (without it the poll never wakes: a timeout)."""
    run = subprocess.run(
        [*CLI, "write-lat", "--virtual", "-n", "20"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    row = re.search(r"^ 2\s+20\s+([\d.]+)", run.stdout, re.M)
    assert row is not None, run.stdout
    assert float(row.group(1)) > 0


def test_a_live_capture_on_loopback_decodes_the_emulated_roce_traffic() -> None:
    # what the docs tell users to run: tshark on lo, told that the emulator's port is VXLAN, and
    # the emulator told to send one frame per datagram (batched sends are coalesced on lo)
    tshark = require_tool("tshark", "apt-get install tshark")
    capture = subprocess.Popen(
        [
            tshark,
            "-i",
            "lo",
            "-f",
            f"udp port {LINK_UDP_PORT} and host 127.0.0.41",
            "-d",
            f"udp.port=={LINK_UDP_PORT},vxlan",
            "-a",
            "duration:120",
            "-l",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    opcodes: list[str] = []
    decoded = threading.Event()

    def read() -> None:
        assert capture.stdout is not None
        for line in capture.stdout:
            opcodes.append(line.strip())
            # 20 writes of 10000 B at MTU 4096: first (6), middle (7) and last (8) each time,
            # and the ACKs (17) coming back
            if all(opcodes.count(op) >= 20 for op in ("6", "7", "8")) and "17" in opcodes:
                decoded.set()

    reader = threading.Thread(target=read, daemon=True)
    try:
        assert capture.stderr is not None
        for line in capture.stderr:  # ready once it says it is capturing
            if "Capturing on" in line:
                break
        reader.start()
        run_pair("write-bw", "-s", "10000", "-n", "20", "-m", "4096", top=("--no-batch-io",))
        assert decoded.wait(timeout=60), opcodes
    finally:
        capture.send_signal(signal.SIGINT)
        capture.wait(timeout=60)
        if reader.is_alive():
            reader.join(timeout=60)
        for stream in (capture.stdout, capture.stderr):
            if stream is not None:
                stream.close()


def test_send_bw_all_sizes_as_the_readme_shows_it() -> None:
    # every size from 2 B to 8 MiB over the same receive queue: a receive posted for one size
    # must hold the next (it failed at 4 B with LOC_LEN_ERR / REM_INV_REQ_ERR)
    client, server = run_pair("send-bw", "-a", "-n", "4", "--rate", "0")
    for out in (client, server):
        sizes = [int(m) for m in re.findall(r"^ (\d+)\s+\d+\s", out, re.M)]
        assert sizes == [1 << k for k in range(1, 24)], out


def test_a_perftest_capture_is_decoded_by_tshark(tmp_path: Path) -> None:
    tshark = require_tool("tshark", "apt-get install tshark")
    pcap = tmp_path / "client.pcap"
    run_pair(
        "write-bw", "-s", "10000", "-n", "20", "-m", "4096", client_flags=("--pcap", str(pcap))
    )
    out = subprocess.run(
        [tshark, "-r", str(pcap), "-T", "fields", "-e", "infiniband.bth.opcode"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    # 20 writes of 10000 B at MTU 4096: first/middle/last each time, and the ACKs received
    assert out.count("6") == 20 and out.count("7") == 20 and out.count("8") == 20
    assert "17" in out


async def test_metrics_are_served_in_prometheus_format() -> None:
    from rocev2_emu.nic.metrics import nic_registry
    from rocev2_emu.runtime.metrics import serve

    port = free_port()
    async with Context.open(DeviceConfig(bind="127.0.0.45")) as ctx:
        ctx.core.counters.packet_seq_err = 3
        ctx.core.counters.rx_drops["icrc"] = 2
        serve(nic_registry(ctx.driver, "n1"), port, addr="127.0.0.45")
        url = f"http://127.0.0.45:{port}/metrics"
        body = await trio.to_thread.run_sync(
            lambda: urllib.request.urlopen(url, timeout=10).read().decode()
        )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }
    assert samples["rocev2_nic_packet_seq_err_total", (("node", "n1"),)] == 3
    assert samples["rocev2_nic_rx_dropped_packets_total", (("node", "n1"), ("reason", "icrc"))] == 2
    assert samples["rocev2_emulation_tdf", (("node", "n1"),)] == 1.0
    for name in (
        "out_of_sequence",
        "local_ack_timeout_err",
        "duplicate_request",
        "retransmitted_packets",
        "tx_bytes",
        "rx_packets",
    ):
        assert ("rocev2_nic_" + name + "_total", (("node", "n1"),)) in samples


def test_stop_ends_a_running_node(tmp_path: Path) -> None:
    topo = tmp_path / "one.toml"
    topo.write_text(
        subprocess.run(
            [*CLI, "topology", "single-switch", "--hosts", "1"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    one = load(topo)  # on a free block of 127/8, as a run says it (a fabric may run on 127.10)
    env = {**os.environ, ENV: str(first_free(one, list(one.nodes)))}
    node = subprocess.Popen(
        [*CLI, "node", str(topo), "h0", "--no-metrics"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert node.stdout is not None and node.stdout.readline().startswith("READY h0")
        out = subprocess.run(
            [*CLI, "stop", str(topo), "h0"], capture_output=True, text=True, timeout=30, env=env
        )
        assert out.returncode == 0 and f"(pid {node.pid}) is stopping" in out.stdout
        assert node.wait(10) != 0  # ended by SIGTERM, as docker stop would
        gone = subprocess.run(
            [*CLI, "stop", str(topo), "nosuch"], capture_output=True, text=True, timeout=30, env=env
        )
        assert gone.returncode == 1 and "no node named 'nosuch'" in gone.stderr
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(10)
        if node.stdout is not None:
            node.stdout.close()
        auth.run_file(str(topo)).unlink(missing_ok=True)  # the secret the node made


def _exact_pair(test: str, *flags: str) -> tuple[str, str]:
    """Both sides of a pair on the exact clock: (client's output, server's)."""
    common = [*flags, "-p", str(free_port()), "--clock", "exact", "--connect-timeout", "60"]
    client, server = serve_and_ask([*CLI, test, *common], [*CLI, test, "127.0.0.1", *common], 300)
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, server.stderr
    return client.stdout, server.stdout


def _without_clock(text: str) -> list[str]:
    """The lines but the header's clock, the server's banner (the rest of it: the test has
    read up to its middle line) and the virtual pair's heading."""
    skip = (" Emulation ", "*", "# ")
    return [line for line in text.splitlines() if line and not line.startswith(skip)]


@pytest.mark.parametrize(
    ("test", "flags"),
    [
        ("write-bw", ("-n", "600", "--loss", "0.002")),
        ("read-bw", ("-s", "8192", "-n", "300")),
        ("write-lat", ("-n", "100", "--delay-us", "2")),
    ],
)
def test_a_pair_on_the_exact_clock_prints_the_virtual_pairs_figures(
    test: str, flags: tuple[str, ...]
) -> None:
    """Two processes on the exact clock, beside two CPU burners: the client's output line for
    line the virtual pair's (only the header's clock differs), the server's too."""
    from tests.integration.test_exact import cpu_burners

    virtual = subprocess.run(
        [*CLI, test, "--virtual", *flags], capture_output=True, text=True, timeout=300
    )
    assert virtual.returncode == 0, virtual.stderr
    server_part, client_part = virtual.stdout.split("# the client\n")
    with cpu_burners():
        client, server = _exact_pair(test, *flags)
    assert "clock exact" in client and "clock virtual" in client_part
    assert _without_clock(client) == _without_clock(client_part)
    assert _without_clock(server) == _without_clock(server_part)
    assert re.search(r"^ (65536|8192|2)\s+\d+\s+[\d.]+", client, re.M), client


def test_a_pair_on_the_exact_clock_with_different_links_is_refused_by_the_server() -> None:
    exact = ["-p", str(free_port()), "--clock", "exact", "-n", "10"]
    client, server = serve_and_ask(
        [*CLI, "write-bw", *exact], [*CLI, "write-bw", "127.0.0.1", *exact, "--loss", "0.1"]
    )
    assert server.returncode == 1 and "the client's link is" in server.stderr, server.stderr
    assert client.returncode == 1 and "the server ended the pair" in client.stderr
