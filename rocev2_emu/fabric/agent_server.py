"""A host agent's peers and its control port between processes: :class:`RemotePeer` (a
:class:`~rocev2_emu.fabric.agent.FlowPeer` in another process, asked over TCP with msgpack),
the flow requests a host's control port takes (checked by
:mod:`rocev2_emu.control.requests`), and :class:`AgentServer`, which serves them.  A server
holds at most its connection limit of clients; one ``open_flows`` request at most
:data:`MAX_OPEN_FLOWS` flows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import numpy.random  # loaded lazily by numpy otherwise: in the first flow's set-up
import trio

from rocev2_emu.control import auth
from rocev2_emu.control.requests import Table, serve_table
from rocev2_emu.fabric.agent import (
    CONTROL_PORT,
    FlowPeer,
    FlowResult,
    FlowSpec,
    HostAgent,
    data_digest,
    host_stats,
)
from rocev2_emu.runtime.link import faults_from_request
from rocev2_emu.runtime.sync import holding_clock
from rocev2_emu.transport.errors import RemoteVerbsError
from rocev2_emu.verbs.oob import OobChannel, OobError, QPInfo, connection_limit, serve_requests


def for_node(name: str, request: dict[str, Any]) -> dict[str, Any]:
    """``request`` for node ``name`` as its process's ``for_nodes`` (a node at an address its
    process's other nodes share: a swarm stack's worker)."""
    return {"cmd": "for_nodes", "names": [name], "request": request}


def node_reply(reply: Any) -> Any:
    """The node's own reply inside the reply to :func:`for_node` (an error reply as it is)."""
    if isinstance(reply, dict) and isinstance(reply.get("replies"), list):
        return reply["replies"][0]
    return reply


class RemotePeer:
    """A FlowPeer in another process, reached through its AgentServer: one connection per
    request, closed after its answer, so an incast of a thousand senders holds no thousand
    connections to its sink (a control server admits 256 at once)."""

    def __init__(self, host: str, port: int = CONTROL_PORT, node: str | None = None) -> None:
        """``node``: the peer's name, where its address is its process's, shared with other
        nodes (a swarm stack's worker): asked through that process's ``for_nodes``."""
        self.host, self.port, self.node = host, port, node

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.node is not None:
            request = for_node(self.node, request)
        with holding_clock():
            chan = await OobChannel.connect(self.host, self.port, timeout=30, secret=auth.current())
            try:
                await chan.send(request)
                reply: dict[str, Any] = await chan.recv()
            finally:
                await chan.aclose()
        return node_reply(reply) if self.node is not None else reply

    async def accept_flow(self, spec: FlowSpec, sender: QPInfo) -> QPInfo:
        reply = await self._ask({"cmd": "accept_flow", "spec": asdict(spec), "qp": asdict(sender)})
        return QPInfo.from_wire(reply["qp"])

    async def digest(self, flow_id: int) -> str:
        return str((await self._ask({"cmd": "digest", "id": flow_id}))["sha256"])

    async def holds(self, flow_id: int, data: np.ndarray) -> bool:
        """Its digest of what arrived against the digest of ``data``."""
        return await self.digest(flow_id) == data_digest(data)


# -- the control requests (rocev2_emu.control.requests decodes and checks them) --------------
@dataclass(frozen=True, slots=True)
class AcceptFlow:
    """Be the destination of flow ``spec`` (FlowSpec's fields) from the QP ``qp`` (QPInfo's)."""

    spec: dict[str, Any]
    qp: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Digest:
    """The SHA-256 of what flow ``id`` wrote here."""

    id: int


@dataclass(frozen=True, slots=True)
class RunFlows:
    """Run this host's ``flows`` from emulated ``t0``; ``peers``: host -> [address, port]."""

    flows: list[Any]
    peers: dict[str, Any]
    t0: float

    def __post_init__(self) -> None:
        for name, addr in self.peers.items():
            if not (isinstance(addr, list | tuple) and len(addr) == 2):
                raise ValueError(f"peers.{name}: {addr!r} is not [address, port]")


MAX_OPEN_FLOWS: Final = 256  # flows one open_flows request sets up


@dataclass(frozen=True, slots=True)
class OpenFlows:
    """Set ``flows`` up one after another, in their order, each ``{"spec": FlowSpec's fields,
    "dst": its destination's address}`` (and ``"node": True`` where that address is shared:
    the destination is asked by name) from a host of the process asked (the exact mode,
    before the clock starts: :func:`open_flows_on`)."""

    flows: list[Any]

    def __post_init__(self) -> None:
        if not 0 < len(self.flows) <= MAX_OPEN_FLOWS:
            raise ValueError(f"flows: 1 to {MAX_OPEN_FLOWS} at once")
        for i, item in enumerate(self.flows):
            if not (isinstance(item, dict) and isinstance(item.get("dst"), str)):
                raise ValueError(f"flows[{i}]: {item!r:.80} is not {{spec, dst}}")


async def open_flows_on(agents: dict[str, HostAgent], req: OpenFlows) -> dict[str, Any]:
    """``req``'s flows opened one after another from ``agents`` (the hosts of this process),
    each NIC drawing its QPNs in their order as the one-at-a-time requests did; a
    destination among ``agents`` is called directly, another through its control port."""
    specs = [request_spec(item["spec"], f"flows[{i}].spec") for i, item in enumerate(req.flows)]
    for i, spec in enumerate(specs):
        if spec.src not in agents:
            raise ValueError(f"flows[{i}]: {spec.src!r:.40} is not a host of this process")
    for spec, item in zip(specs, req.flows, strict=True):
        local = agents.get(spec.dst)
        by_name = spec.dst if item.get("node") is True else None
        peer: FlowPeer = local if local is not None else RemotePeer(item["dst"], node=by_name)
        try:
            await agents[spec.src].open_flow(spec, peer)
        except (OobError, RemoteVerbsError) as exc:
            raise ValueError(f"flow {spec.id}: {exc}") from exc
    return {"opened": len(specs)}


@dataclass(frozen=True, slots=True)
class StartFlows:
    """Run the opened flows from emulated ``t0``, in the background; ``verify`` False: do not
    ask each flow's destination for its digest (an out-of-band wait that would hold the
    clock inside the run) - the job asks ``digests`` of each destination afterwards."""

    t0: float
    verify: bool = True


@dataclass(frozen=True, slots=True)
class Digests:
    """The SHA-256 of what each flow of ``ids`` wrote here (null: no such flow arrived)."""

    ids: list[Any]

    def __post_init__(self) -> None:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.ids):
            raise ValueError("ids: flow ids are integers")


@dataclass(frozen=True, slots=True)
class FlowResults:
    """The started flows' results, once they are done."""


@dataclass(frozen=True, slots=True)
class HostStats:
    """The host's counters: its share of the fabric summary."""


@dataclass(frozen=True, slots=True)
class SetNicFaults:
    """The faults of the host's link (LinkFaults' fields, as numbers)."""

    faults: dict[str, Any]


def request_spec(d: Any, where: str) -> FlowSpec:
    """A flow spec from a request's field ``where`` (ValueError naming it when it is not one)."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: {d!r:.80} is not a flow")
    try:
        return FlowSpec.from_dict(d)
    except KeyError as exc:
        raise ValueError(f"{where}.{exc.args[0]}: missing") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


class AgentServer:
    """Serves an agent's calls over TCP: accept_flow, digest, run_flows (a job of this host), and
    for a job that sets every flow up before it starts them (:class:`~rocev2_emu.fabric.flows.
    FlowsJob`): open_flows (this host's; an exact run's process opens its hosts' flows:
    :func:`open_flows_on`), start_flows (they run in the background) and flow_results (waits
    for them)."""

    def __init__(
        self,
        agent: HostAgent,
        handlers: Table | None = None,
        secret: bytes | None = None,
    ) -> None:
        self.agent = agent
        self.handlers = handlers or {}  # more rows (the host services, a node's stop and map)
        self.secret = secret  # what clients must prove (None: this process's fabric secret)
        self._jobs: trio.Nursery | None = None  # where started flows run
        self._results: list[FlowResult] | None = None
        self._done = trio.Event()

    async def serve(
        self,
        host: str,
        port: int = CONTROL_PORT,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.secret = self.secret or auth.current()  # no secret, no server
        listeners = await trio.open_tcp_listeners(port, host=host)
        async with trio.open_nursery() as jobs:
            self._jobs = jobs
            task_status.started()
            await trio.serve_listeners(connection_limit(self._handle), listeners)

    async def keep_jobs(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Where started flows run, for a server whose connections are served elsewhere (the
        exact mode serves them on the wall clock, :class:`~rocev2_emu.runtime.exact.WallServer`)."""
        async with trio.open_nursery() as jobs:
            self._jobs = jobs
            task_status.started()
            await trio.sleep_forever()

    async def _handle(self, stream: trio.SocketStream) -> None:
        secret = self.secret or auth.current()
        await serve_requests(stream, self.dispatch, timeout=3600.0, secret=secret)

    async def _run_started(self, t0: float, verify: bool) -> None:
        assert self._results is not None
        try:
            self._results.extend(await self.agent.run_open_flows(t0, verify))
        finally:
            self._done.set()

    async def dispatch(self, msg: Any) -> dict[str, Any]:
        """The answer to one request (the rows given to the server take precedence over the
        agent's own table)."""
        return await serve_table({**self.table, **self.handlers}, msg)

    @property
    def table(self) -> Table:
        """The agent's commands: request type and handler for each."""
        return {
            "accept_flow": (AcceptFlow, self._accept_flow),
            "open_flows": (OpenFlows, self._open_flows),
            "digest": (Digest, self._digest),
            "digests": (Digests, self._digests),
            "run_flows": (RunFlows, self._run_flows),
            "start_flows": (StartFlows, self._start_flows),
            "flow_results": (FlowResults, self._flow_results),
            "stats": (HostStats, self._stats),
            "set_faults": (SetNicFaults, self._set_faults),
        }

    async def _open_flows(self, req: OpenFlows) -> dict[str, Any]:
        return await open_flows_on({self.agent.name: self.agent}, req)

    async def _accept_flow(self, req: AcceptFlow) -> dict[str, Any]:
        spec = request_spec(req.spec, "spec")
        try:
            info = await self.agent.accept_flow(spec, QPInfo.from_wire(req.qp))
        except (OobError, RemoteVerbsError) as exc:
            raise ValueError(str(exc)) from exc
        return {"qp": asdict(info)}

    async def _digest(self, req: Digest) -> dict[str, Any]:
        try:
            return {"sha256": await self.agent.digest(req.id)}
        except KeyError:
            raise ValueError(f"id {req.id}: no flow of that id arrived here") from None

    async def _digests(self, req: Digests) -> dict[str, Any]:
        return {"sha256": self.agent.digests(req.ids)}

    async def _run_flows(self, req: RunFlows) -> dict[str, Any]:
        specs = [request_spec(d, f"flows[{i}]") for i, d in enumerate(req.flows)]
        peers: dict[str, FlowPeer] = {
            name: RemotePeer(str(addr[0]), int(addr[1])) for name, addr in req.peers.items()
        }
        results = await self.agent.run_flows(specs, peers, req.t0)
        return {"results": [asdict(r) for r in results]}

    async def _start_flows(self, req: StartFlows) -> dict[str, Any]:
        if self._jobs is None or self._results is not None or self._done.is_set():
            raise ValueError("flows already started")
        self._results = []
        self._jobs.start_soon(self._run_started, req.t0, req.verify)
        return {"ok": True}

    async def _flow_results(self, _: FlowResults) -> dict[str, Any]:
        if self._results is None:
            raise ValueError("no flows were started")
        await self._done.wait()
        return {"results": [asdict(r) for r in self._results]}

    async def _stats(self, _: HostStats) -> dict[str, Any]:
        return host_stats(self.agent.ctx)

    async def _set_faults(self, req: SetNicFaults) -> dict[str, Any]:
        self.agent.ctx.driver.set_faults(faults_from_request(req.faults))
        return {"ok": True}
