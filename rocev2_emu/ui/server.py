"""The live map's web server: an ASGI app (starlette) served by hypercorn on trio, beside the
fabric in the same trio run, or over a recording for ``rocev2-emu view``.

Why these: starlette is a small, well-kept ASGI toolkit whose streaming responses make
server-sent events a generator; hypercorn serves ASGI on trio itself, so the server, the
sampler and the fabric's supervisor share one event loop and one clock; server-sent events
need nothing on the page but the browser's ``EventSource``.  The page is one HTML file with
inline SVG and script: no build step, no library, no network.

Routes: ``/`` the page; ``/layout`` the topology in tiers; ``/events`` (live) a sample every
half second as server-sent events; ``/recording`` (replay) every sample of the file;
``POST /action`` (live) a link down or up, its loss, or a host stopped - with the token printed
at start when the server listens beyond loopback.  Every action joins the samples (and the
recording) as an event.

A recording (``--record FILE``) is JSON lines: the layout first, then one sample per line.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import secrets
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import trio

from rocev2_emu.fabric.control import ControlPool, control, set_link_faults, set_links
from rocev2_emu.topology.model import NodeKind, Topology, TopologyError
from rocev2_emu.ui.sampler import Sampler, layout

PERIOD = 0.5  # wall seconds between samples
SPREAD = 0.8  # the share of a period over which the nodes are asked, one after another
HISTORY = 7200  # samples kept for a page that joins late (an hour)


def page() -> str:
    return resources.files("rocev2_emu.ui").joinpath("page.html").read_text(encoding="utf-8")


def parse_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        ipaddress.ip_address(host or "127.0.0.1")
        return host or "127.0.0.1", int(port)
    except ValueError as exc:
        raise ValueError(f"--ui {text!r}: ADDRESS:PORT, e.g. 127.0.0.1:8080") from exc


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


class Live:
    """Samples of a running fabric, for every page that listens, and the actions they ask."""

    def __init__(self, topo: Topology, record: TextIO | None = None) -> None:
        self.topo = topo
        self.pool = ControlPool()  # a connection per node kept open: the nodes' cost is a request
        self.sampler = Sampler(topo, ask=self.pool.ask)
        self.layout = layout(topo)
        self.samples: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.changed = trio.Event()
        self.record = record
        if record is not None:
            record.write(json.dumps({"layout": self.layout}) + "\n")

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self.pool.aclose()

    async def _run(self) -> None:
        while True:
            tick = trio.current_time() + PERIOD
            sample = await self.sampler.sample(spread=PERIOD * SPREAD)
            sample["events"], self.events = self.events, []
            self.samples = [*self.samples[-HISTORY + 1 :], sample]
            if self.record is not None:
                self.record.write(json.dumps(sample) + "\n")
                self.record.flush()
            self.changed.set()
            self.changed = trio.Event()
            await trio.sleep_until(tick)

    async def act(self, req: dict[str, Any]) -> str:
        """A steering action: ``{"do": "down" | "up" | "loss" | "stop", ...}``."""
        do = req.get("do")
        if do in ("down", "up", "loss"):
            a, b = str(req.get("a")), str(req.get("b"))
            if do == "loss":
                loss = float(req.get("loss", 0.0))
                if not 0.0 <= loss <= 1.0:
                    raise ValueError(f"loss {loss}: a probability")
                done = await set_link_faults(self.topo, a, b, {"loss": loss})
            else:
                done = await set_links(self.topo, [(a, b)], up=do == "up")
        elif do == "stop":
            name = str(req.get("node"))
            node = self.topo.nodes.get(name)
            if node is None or node.kind is not NodeKind.HOST:
                raise ValueError(f"stop {name!r}: no host of that name")
            await control(node.address, {"cmd": "stop"})
            done = f"host {name} stopped"
        else:
            raise ValueError(f"action {do!r}: down, up, loss or stop")
        self.events.append({"action": done})
        return done


def app(live: Live | None, recording: list[dict[str, Any]] | None, token: str | None) -> Any:
    """The ASGI app: live (``live``) or a replay (``recording``: layout, then samples)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def index(_: Request) -> Response:
        return HTMLResponse(page())

    async def get_layout(_: Request) -> Response:
        body = dict(live.layout if live else recording[0]["layout"])  # type: ignore[index]
        body["mode"] = "live" if live else "replay"
        body["token_needed"] = token is not None
        return JSONResponse(body)

    async def events(_: Request) -> Response:
        if live is None:
            return JSONResponse({"error": "a replay has no live events"}, status_code=404)

        async def stream() -> Any:
            for s in live.samples[-1:]:  # the latest at once, then each new one
                yield f"data: {json.dumps(s)}\n\n"
            while True:
                await live.changed.wait()
                yield f"data: {json.dumps(live.samples[-1])}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def get_recording(_: Request) -> Response:
        if recording is None:
            return JSONResponse({"error": "a live fabric has no recording here"}, status_code=404)
        return JSONResponse(recording[1:])

    async def action(request: Request) -> Response:
        if live is None:
            return JSONResponse({"error": "a replay cannot be steered"}, status_code=400)
        if token is not None and request.headers.get("x-token") != token:
            return JSONResponse({"error": "token required (printed at start)"}, status_code=403)
        try:
            req = await request.json()
            if not isinstance(req, dict):
                raise ValueError("an action is a JSON object")
            return JSONResponse({"ok": await live.act(req)})
        except (ValueError, TopologyError, OSError, RuntimeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/layout", get_layout),
            Route("/events", events),
            Route("/recording", get_recording),
            Route("/action", action, methods=["POST"]),
        ]
    )


async def serve(
    asgi: Any, addr: tuple[str, int], *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"{addr[0]}:{addr[1]}"]
    config.accesslog = None
    config.errorlog = None
    await hypercorn_serve(asgi, config, task_status=task_status)


async def serve_live(
    topo: Topology,
    addr: tuple[str, int],
    record: str | None = None,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """The live map of a running fabric, until cancelled (``up --ui``)."""
    token = None if is_loopback(addr[0]) else secrets.token_urlsafe(16)
    # the recording is written a line per half second: a blocking write is what it costs
    with open(record, "w", encoding="utf-8") if record else contextlib.nullcontext() as out:  # noqa: ASYNC230
        live = Live(topo, out)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run)
            await nursery.start(serve, app(live, None, token), addr)
            where = f"http://{addr[0]}:{addr[1]}/"
            print(f"# the fabric's map: {where}" + (f" (steering token {token})" if token else ""))
            task_status.started()
            await trio.sleep_forever()


def load_recording(path: str) -> list[dict[str, Any]]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a recording: {exc}") from exc
    if not rows or "layout" not in rows[0]:
        raise ValueError(f"{path}: not a recording (no layout first)")
    return rows


async def serve_replay(path: str, addr: tuple[str, int]) -> None:
    """``rocev2-emu view FILE``: the page over a recording, with its timeline."""
    recording = load_recording(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, app(None, recording, None), addr)
        print(
            f"# {path}: {len(recording) - 1} samples; the replay: http://{addr[0]}:{addr[1]}/",
            flush=True,
        )
