"""The fabric's map in a real browser: ``rocev2-emu up --ui`` over processes under an incast,
loaded in Debian's headless Chromium (through its chromedriver); then the recording of that run
checked, and the same incast recorded in virtual time and replayed by ``rocev2-emu view``, its
timeline checked at two points against the file.

Under CI=true a missing Chromium, chromedriver or ui extra fails these tests (.ci/run installs
them); elsewhere they skip saying what to install.  The screenshot of the page under the
incast is written to .ci/artifacts/ui-incast.png.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocev2_emu.topology.generate import single_switch
from tests.conftest import require_tool

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".ci" / "artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _needs_ui() -> None:
    try:
        import hypercorn  # noqa: F401
        import selenium  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc.name} missing: pip install -e '.[test,ui]'", pytrace=False)
        pytest.skip(f"{exc.name} missing: pip install -e '.[test,ui]'")


@pytest.fixture
def browser() -> Iterator[Any]:
    _needs_ui()
    chromium = require_tool("chromium", "Debian's chromium")
    driver_path = require_tool("chromedriver", "Debian's chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,800",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, script: str, timeout: float = 60.0) -> Any:
    """Poll ``script`` in the page until it returns something true (the page is live)."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        assert time.monotonic() < deadline, f"the page never satisfied: {script}"
        time.sleep(0.2)


def _start(cmd: list[str], ready: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if ready in line:
            return proc
    proc.kill()
    raise AssertionError(f"{cmd[3]} did not say {ready!r}: {''.join(seen)[-2000:]}")


def _replay(browser: Any, recording: Path) -> subprocess.Popen[str]:
    """``rocev2-emu view`` of ``recording``, loaded in the browser and ready; the viewer's
    process, for the caller to stop."""
    port = _free_port()
    view = _start(
        [sys.executable, "-m", "rocev2_emu", "view", str(recording), "--ui", f"127.0.0.1:{port}"],
        "the replay:",
    )
    try:
        browser.get(f"http://127.0.0.1:{port}/")
        _wait(browser, "return document.body.dataset.ready === 'replay';")
    except BaseException:
        _stop(view)
        raise
    return view


def _show(browser: Any, index: int) -> None:
    """Move the replay's timeline to sample ``index``."""
    browser.execute_script(
        "const s = document.getElementById('timeline'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input'));",
        index,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_the_map_shows_the_incast_live_and_replays_a_virtual_run(
    browser: Any, tmp_path: Path
) -> None:
    topo = tmp_path / "incast.toml"
    topo.write_text(single_switch(4, tdf=1000) + "\n[buffer]\nsize_bytes = 1048576\n")
    flows = tmp_path / "flows.toml"
    flows.write_text(
        "".join(f'[[flow]]\nsrc = "h{i}"\ndst = "h3"\nsize = {64 << 20}\n\n' for i in range(3))
    )
    record = tmp_path / "incast.jsonl"
    port = _free_port()
    up = [sys.executable, "-m", "rocev2_emu", "up", str(topo), "--flows", str(flows)]
    live = [*up, "--clock", "wall"]  # dilated: the map sees the incast while it runs
    proc = _start(
        [*live, "--ui", f"127.0.0.1:{port}", "--record", str(record)], "# the fabric's map:"
    )
    try:
        browser.get(f"http://127.0.0.1:{port}/")
        # the link into h3 carries the incast at near line rate (sw0 -> h3 is its "ba"), and
        # the senders' NICs are held by the switch's XOFF
        load = _wait(
            browser,
            "const l = document.getElementById('link-h3-sw0');"
            "return l && parseFloat(l.dataset.bautil) > 0.5 && parseFloat(l.dataset.bautil);",
        )
        paused = _wait(
            browser, "return parseInt(document.getElementById('paused-count').textContent);"
        )
        pfc = _wait(
            browser, "return parseInt(document.getElementById('total-pfc_tx').textContent);"
        )
        assert load > 0.5 and paused >= 1 and pfc > 0
        # a sender's tooltip names its QP and the rate DCQCN holds it at
        title = _wait(
            browser,
            "const g = document.getElementById('node-h0');"
            "return g.dataset.qps > 0 && g.querySelector('title').textContent;",
        )
        assert "(DCQCN)" in title and "Gbit/s" in title
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "ui-incast.png"))
        out, _ = proc.communicate(timeout=300)  # the flows end, then the fabric stops
        assert proc.returncode == 0, out[-2000:]
    finally:
        _stop(proc)

    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert "layout" in rows[0] and len(rows) > 4  # the live run's recording
    assert any(lk["ab_paused"] for row in rows[1:] for lk in row["links"])

    # the same incast in virtual time, recorded every 10 us, replayed with its timeline
    virtual = tmp_path / "virtual.jsonl"
    run = subprocess.run(
        [*up, "--virtual", "--record", str(virtual)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    samples = [json.loads(line) for line in virtual.read_text().splitlines()][1:]
    assert len(samples) > 100
    view = _replay(browser, virtual)
    try:
        for index in (1, len(samples) // 2):
            _show(browser, index)
            want = samples[index]
            got = browser.execute_script(
                "return [document.getElementById('t').textContent,"
                "document.getElementById('total-pfc_tx').textContent,"
                "document.getElementById('link-h3-sw0').dataset.bautil];"
            )
            h3 = next(lk for lk in want["links"] if lk["a"] == "h3")
            assert got[0] == f"{want['t']:.6f}"
            assert int(got[1]) == want["totals"]["pfc_tx"]
            assert float(got[2]) == pytest.approx(h3["ba_util"])
        # mid-run, the replay shows what the live map showed: the link full, senders paused
        assert float(got[2]) > 0.85  # DCQCN keeps it a little below line rate
        paused = browser.execute_script(
            "return parseInt(document.getElementById('paused-count').textContent);"
        )
        assert paused == sum(lk["ab_paused"] + lk["ba_paused"] for lk in want["links"]) > 0
    finally:
        _stop(view)


def test_a_virtual_scenario_records_each_run_beside_its_json(tmp_path: Path) -> None:
    from rocev2_emu.cli import main

    args = ["scenario", "incast", "--virtual", "--out", str(tmp_path), "--senders", "4"]
    assert main([*args, "--size", str(1 << 20), "--settings", "pfc"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "incast-pfc.jsonl").read_text().splitlines()]
    assert [n["name"] for n in rows[0]["layout"]["nodes"] if n["kind"] == "switch"] == ["sw0"]
    samples = rows[1:]
    assert len(samples) > 10 and samples[-1]["totals"]["pfc_tx"] > 0
    assert any(lk["ab_paused"] for s in samples for lk in s["links"])  # senders held by PFC
    assert (tmp_path / "incast.json").exists()


def test_the_replay_draws_each_server_coloured_by_its_fabric(browser: Any, tmp_path: Path) -> None:
    """Ring all-reduces on two servers of four accelerators, a NIC each, recorded in virtual
    time and replayed: a box per server around its four hosts, whose colour and
    tooltip follow the recording's server fabric at the sample shown."""
    import tomllib

    import collectives.scenarios.straggler  # noqa: F401  (registers the iterations job)
    from collectives.jobs.launch import run_recorded
    from rocev2_emu.experiments.harness import Mode
    from rocev2_emu.topology.file import parse
    from rocev2_emu.topology.generate import Servers
    from rocev2_emu.ui.record import recorder

    topo = parse(tomllib.loads(single_switch(2, servers=Servers(4, "nvlink", True))), "s.toml")
    path = tmp_path / "servers.jsonl"
    mode = Mode(record=lambda t, s, registry=None: recorder(t, str(path), registry=registry))
    params = {"iters": 2, "bytes": 4 << 20, "timeout": 0.5}
    results, _ = run_recorded(topo, "iterations", params, "servers", mode)
    assert all(isinstance(v, list) for v in results.values()), results
    samples = [json.loads(line) for line in path.read_text().splitlines()][1:]
    busiest = max(range(len(samples)), key=lambda i: samples[i]["servers"]["s0"]["util"])
    view = _replay(browser, path)
    try:
        _show(browser, busiest)
        got = browser.execute_script(
            "const b = document.getElementById('server-s0'), r = b.getBoundingClientRect();"
            "const h = ['h0', 'h3'].map(n => document.querySelector(`#node-${n} circle`)"
            "  .getBoundingClientRect());"
            "return [b.dataset.util, b.querySelector('title').textContent,"
            "  r.left <= h[0].left && h[1].right <= r.right,"
            "  document.getElementById('server-busiest').textContent];"
        )
        want = samples[busiest]["servers"]["s0"]
        assert float(got[0]) == pytest.approx(want["util"]) and want["util"] > 0.2
        assert "nvlink" in got[1] and f"{round(100 * want['util'])}% busy" in got[1]
        assert got[2] is True  # the box holds the server's hosts
        assert got[3].startswith("s") and "%" in got[3]
        browser.save_screenshot(str(ARTIFACTS / "ui-servers.png"))
    finally:
        _stop(view)
