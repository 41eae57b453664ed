"""Every control server survives what a careless or hostile client sends: resets, garbage,
wrong types, out-of-range values (issue: hardening), and serves only clients that prove the
fabric secret.  Each server runs for real on loopback in a thread of its own; the client is a
plain socket that answers the challenge itself (HMAC-SHA256, as :mod:`rocev2_emu.control.auth`
documents).  After every bad request a good probe must still be answered."""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectives.comm.store import StoreServer
from rocev2_emu.control import auth
from rocev2_emu.control.channel import DROPPED
from rocev2_emu.fabric.agent import HostAgent
from rocev2_emu.fabric.agent_server import AgentServer
from rocev2_emu.fabric.nodes import switch_driver
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.memory_ports import MemoryNetwork
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.verbs.api import Context, DeviceConfig
from switch.node import serve_control

pytestmark = pytest.mark.integration
LEN = struct.Struct("!I")

Serve = Callable[[trio.SocketStream], Awaitable[None]]
SECRET = bytes(range(32))


@pytest.fixture(autouse=True, scope="module")
def module_secret() -> Iterator[None]:
    auth.use(SECRET)  # what this process's servers demand
    yield
    auth.use(None)


def serve_in_thread(make: Callable[[], AbstractAsyncContextManager[Serve]]) -> Iterator[int]:
    """Run ``make()``'s handler on a loopback port in a trio loop of its own thread."""
    ready = threading.Event()
    port: list[int] = []
    token: list[trio.lowlevel.TrioToken] = []
    scope: list[trio.CancelScope] = []

    async def main() -> None:
        with trio.CancelScope() as cancel:
            scope.append(cancel)
            token.append(trio.lowlevel.current_trio_token())
            async with make() as handler:
                listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
                port.append(listeners[0].socket.getsockname()[1])
                ready.set()
                await trio.serve_listeners(handler, listeners)

    errors: list[BaseException] = []

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # the server died: the test must see it
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30) and not errors, errors
    try:
        yield port[0]
    finally:
        trio.from_thread.run_sync(scope[0].cancel, trio_token=token[0])
        thread.join(30)
    assert not errors, errors  # the server never died


def request(port: int, payload: bytes, *, secret: bytes | None = SECRET) -> Any:
    """``payload`` on a fresh connection after proving ``secret`` (None: sent as the answer to
    the challenge, proving nothing), and the reply (None: the server hung up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        if secret is not None:
            prove(s, secret)
        else:
            assert "challenge" in receive(s)
        s.sendall(payload)
        return receive(s)


def receive(s: socket.socket) -> Any:
    head = _read(s, 4)
    if head is None:
        return None  # the server closed the connection: allowed for garbage
    body = _read(s, LEN.unpack(head)[0])
    return None if body is None else msgpack.unpackb(body, raw=False)


def prove(s: socket.socket, secret: bytes) -> Any:
    """Answer the server's challenge with an HMAC under ``secret``; the server's verdict."""
    challenge = receive(s)
    assert challenge["auth"] == "hmac-sha256" and len(challenge["challenge"]) == 32, challenge
    label = b"rocev2-emu control v1\0"
    mac = hmac.new(secret, label + challenge["challenge"], hashlib.sha256).digest()
    s.sendall(frame({"proof": mac}))
    verdict = receive(s)
    if secret == SECRET:
        assert verdict == {"ok": True}, verdict
    return verdict


def _read(s: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def frame(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return LEN.pack(len(data)) + data


def reset(port: int, payload: bytes, *, authenticated: bool = True) -> None:
    """Send ``payload`` (after the proof, or as the answer to the challenge) and reset the
    connection (RST) before any reply."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if authenticated:
        prove(s, SECRET)
    s.sendall(payload)
    s.close()


# -- the servers ---------------------------------------------------------------------------


@asynccontextmanager
async def store_handler() -> AsyncIterator[Serve]:
    yield StoreServer()._handle


@asynccontextmanager
async def switch_handler() -> AsyncIterator[Serve]:
    topo = parse(tomllib.loads(single_switch(2)), "two.toml")
    net = MemoryNetwork()
    driver = switch_driver(topo, "sw0", net.port(("127.10.0.10", 1)), DilatedClock(1.0))
    yield partial(serve_control, driver=driver)


@asynccontextmanager
async def agent_handler() -> AsyncIterator[Serve]:
    net = MemoryNetwork()
    config = DeviceConfig(bind="127.0.0.90", link_peer=("127.0.0.91", 1))
    async with Context.open(config, port=net.port(("127.0.0.90", 1), ("127.0.0.91", 1))) as ctx:
        yield AgentServer(HostAgent(ctx, "h0"))._handle


SERVERS: dict[
    str, tuple[Callable[[], AbstractAsyncContextManager[Serve]], Any, Callable[[Any], bool]]
] = {
    "store": (store_handler, {"op": "add", "key": "probe", "amount": 1}, lambda r: "value" in r),
    "switch": (switch_handler, {"cmd": "stats"}, lambda r: "pfc_tx" in r),
    "agent": (agent_handler, {"cmd": "stats"}, lambda r: "nic_drops" in r),
}


@pytest.fixture(params=list(SERVERS), scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    make, _, _ = SERVERS[request.param]
    for port in serve_in_thread(make):
        yield request.param, port


def probe(name: str, port: int) -> None:
    _, good, ok = SERVERS[name]
    answer = request(port, frame(good))
    assert isinstance(answer, dict) and ok(answer), answer


BAD_REQUESTS: dict[str, list[Any]] = {
    "store": [
        {"op": "add", "key": "k", "amount": "x"},
        {"op": "add", "key": "k", "amount": None},
        {"op": "add", "key": "big", "amount": 1},  # past int64 (set up below): refused
        {"op": "get", "key": "k", "timeout": "abc"},
        {"op": "get", "key": "k", "timeout": -1},
        {"op": "get", "key": "k", "timeout": float("nan")},
        {"op": "get", "key": "k", "timeout": [1]},
        {"op": "set", "key": ""},
        {"op": "frobnicate", "key": "k"},
    ],
    "switch": [
        {"cmd": "set_link"},
        {"cmd": "set_link", "port": 99, "up": False},
        {"cmd": "set_link", "port": "x", "up": False},
        {"cmd": "set_routes", "routes": 5},
        {"cmd": "set_faults", "port": 0, "faults": {"loss": "x"}},
        {"cmd": "set_faults", "port": 0, "faults": {"delay": float("inf")}},
    ],
    "agent": [
        {
            "cmd": "accept_flow",
            "spec": {"id": 1, "src": "a", "dst": "h0", "size": 10**13},
            "qp": {"qpn": 1, "psn": 1, "gid": "10.0.0.1", "udp_host": "127.0.0.1", "udp_port": 1},
        },
        {
            "cmd": "accept_flow",
            "spec": {"id": 1, "src": "a", "dst": "h0", "size": 10, "dscp": 99},
            "qp": {"qpn": 1, "psn": 1, "gid": "10.0.0.1", "udp_host": "127.0.0.1", "udp_port": 1},
        },
        {
            "cmd": "accept_flow",
            "spec": {"id": 1, "src": "a", "dst": "h0", "size": 10},
            "qp": {"qpn": 1 << 30, "psn": 1, "gid": "10.0.0.1", "udp_host": "h", "udp_port": 1},
        },
        {
            "cmd": "accept_flow",
            "spec": {"id": 2, "src": "a", "dst": "h0", "size": 10},
            "qp": {"qpn": 5, "psn": 1, "gid": "not-an-ip", "udp_host": "h", "udp_port": 1},
        },
        {"cmd": "run_flows", "flows": [], "peers": 5, "t0": 0},
        {"cmd": "set_faults", "faults": {"loss": 2}},
        {"cmd": "digest", "id": 12345},
        {"cmd": "digests", "ids": ["12345"]},
        {"cmd": "digests", "ids": [True]},
        {"cmd": "digests", "ids": 12345},
    ],
}


@pytest.mark.parametrize("server", ["agent"], indirect=True)
def test_digests_of_flows_that_never_arrived_are_null(server: tuple[str, int]) -> None:
    """What an exact flows job checks each flow against: no digest, never a made-up one."""
    _, port = server
    assert request(port, frame({"cmd": "digests", "ids": [7, 12345]})) == {"sha256": [None, None]}
    assert request(port, frame({"cmd": "digests", "ids": []})) == {"sha256": []}


def test_bad_requests_get_an_error_and_the_server_goes_on(server: tuple[str, int]) -> None:
    name, port = server
    if name == "store":  # a counter at the top of int64
        assert request(port, frame({"op": "add", "key": "big", "amount": (1 << 63) - 1}))
    for bad in BAD_REQUESTS[name]:
        answer = request(port, frame(bad))
        assert isinstance(answer, dict) and ("error" in answer), (bad, answer)
        probe(name, port)


def test_resets_garbage_and_huge_lengths_never_end_the_server(server: tuple[str, int]) -> None:
    name, port = server
    reset(port, b"", authenticated=False)  # before the challenge is answered
    reset(port, LEN.pack(100) + b"half an answer", authenticated=False)
    reset(port, b"")
    reset(port, LEN.pack(100) + b"half a message")
    reset(port, frame({"cmd": "stats", "op": "get", "key": "k", "timeout": 30}))  # reply to no one
    assert request(port, LEN.pack(1 << 30) + b"junk") is None  # too long: the server hangs up
    assert request(port, LEN.pack(3) + b"\xc1\xc1\xc1") is None  # not msgpack
    probe(name, port)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = ["cmd", "op", "key", "amount", "timeout", "port", "up", "routes", "faults", "spec", "qp"]
COMMANDS = [
    "stats",
    "set_link",
    "set_faults",
    "set_routes",
    "accept_flow",
    "digest",
    "digests",
    "run_flows",
]
requests_like = st.dictionaries(st.sampled_from(KEYS), msgpack_values, max_size=5).map(
    lambda d: d
) | st.builds(
    lambda cmd, op, rest: {"cmd": cmd, "op": op, **rest},
    st.sampled_from(COMMANDS),
    st.sampled_from(["set", "add", "get"]),
    st.dictionaries(st.sampled_from(KEYS[2:]), msgpack_values, max_size=4),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=msgpack_values | requests_like)
def test_any_msgpack_is_answered_or_closed_and_the_server_still_serves(
    server: tuple[str, int], message: Any
) -> None:
    name, port = server
    if isinstance(message, dict) and message.get("cmd") == "stop":
        return  # a real command: it would end the process, as it should
    answer = request(port, frame(message))
    assert answer is None or isinstance(answer, dict)
    probe(name, port)


def dropped(reason: str) -> float:
    return float(DROPPED.labels(reason=reason)._value.get())


@pytest.mark.parametrize(
    "answer",
    [
        {"op": "set", "key": "unproven", "value": 1},  # a request instead of a proof
        {"cmd": "stop"},
        {"proof": b"\0" * 32},
        {"proof": "not bytes"},
        [1, 2],
        None,
    ],
)
def test_a_client_that_does_not_prove_the_secret_is_refused_before_any_request(
    server: tuple[str, int], answer: Any
) -> None:
    name, port = server
    before = dropped("auth_failed")
    refused = request(port, frame(answer), secret=None)
    assert refused == {"error": "authentication failed: not this fabric's secret"}
    assert dropped("auth_failed") == before + 1
    probe(name, port)
    if name == "store":  # and what it asked for did not happen
        assert request(port, frame({"op": "get", "key": "unproven", "timeout": 0})) == {
            "timeout": "rendezvous key 'unproven' did not appear within 0 s"
        }


def test_another_fabrics_secret_is_refused(server: tuple[str, int]) -> None:
    name, port = server
    before = dropped("auth_failed")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        verdict = prove(s, bytes(32))
        assert verdict == {"error": "authentication failed: not this fabric's secret"}
        assert receive(s) is None  # and the server hung up
    assert dropped("auth_failed") == before + 1
    probe(name, port)


def test_every_challenge_is_fresh(server: tuple[str, int]) -> None:
    """A recorded answer is worth nothing on the next connection."""
    _, port = server
    seen = set()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            seen.add(receive(s)["challenge"])
    assert len(seen) == 3
