"""A PyTorch rank's side of the fabric: its host's NIC and its communicator, in a trio thread.

The training script's thread calls torch.distributed; the emulated host lives beside it in one
background thread running ``trio.run``: the host node (:func:`rocev2_emu.fabric.nodes.host_node`:
the NIC on the host's address, its ``/metrics`` and control port, as a node process has) and a
:class:`~collectives.comm.communicator.Communicator` connected to every other rank through the
launcher's rendezvous store.  Operations reach that thread as coroutines on one queue and run
one after another in the order they were issued, as NCCL runs a communicator's operations on one
stream; each completes a ``torch.futures.Future`` (its value, or the operation's
:class:`~collectives.comm.communicator.CollectiveError`).

What the rank needs comes from the launcher (:mod:`collectives.launcher`) in its environment:
``ROCEV2_TOPOLOGY``, ``ROCEV2_TDF``, ``ROCEV2_EPOCH``, ``ROCEV2_STORE`` (host:port),
``ROCEV2_JOB`` and the fabric's secret; rank r is the topology's r-th host.

When the script closes the group on the wall clock, the NIC keeps answering until every rank has
closed (a barrier in the rendezvous store, at most :data:`WALL_CLOSE_SECONDS`): a rank whose last
operation is over may still owe a peer the ACK of that peer's last write, or a resend's answer, as
a real NIC answers until its QPs are destroyed after the job's last barrier.

On the exact clock (``launch --clock exact``: ``ROCEV2_CLOCK=exact`` and ``ROCEV2_SYNC``, the
coordinator's host:port; ``ROCEV2_JOIN_TIMEOUT``: wall seconds to wait for that coordinator to
listen, ``launch --host``'s ranks starting before the first host's) the thread is a process of
the exact run instead
(:func:`rocev2_emu.fabric.exact_node.joined_nodes`: the host on its own event engine, windows from
the launcher's coordinator, the rendezvous store the coordinator's) and the training script is
its application: while the script has no operation queued the engine is *paused*
(:meth:`~rocev2_emu.runtime.exact.ExactEngine.pause`): nothing runs there and the fabric waits,
so an operation starts at the emulated instant the one before it ended (the first: when the
communicator was made), however long the script computed in wall time.  Every run of the same
script then gives the same emulated figures, loaded machine or not.  When the script closes the
group, the host keeps answering until every rank has closed and the launcher ends the run.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from prometheus_client import CollectorRegistry

from collectives.comm.communicator import Communicator, HostGroup, RankPlace
from collectives.comm.metrics import HostCollectiveMetrics, StepMetrics
from collectives.comm.store import Store, StoreTimeout, TcpStore, exact_store
from collectives.jobs.places import comm_options, places_for
from rocev2_emu.fabric import blocks
from rocev2_emu.fabric.agent import host_stats
from rocev2_emu.fabric.control import control
from rocev2_emu.fabric.exact_node import JoinOptions, joined_nodes, run_process
from rocev2_emu.fabric.nodes import NodeOptions, host_node
from rocev2_emu.fabric.report import merge_stats
from rocev2_emu.fabric.supervisor import first_exception
from rocev2_emu.topology.file import load
from rocev2_emu.topology.model import NodeKind, Topology
from rocev2_emu.topology.processes import process_groups
from rocev2_emu.verbs import Context

ENV_TOPOLOGY = "ROCEV2_TOPOLOGY"
ENV_TDF = "ROCEV2_TDF"
ENV_EPOCH = "ROCEV2_EPOCH"
ENV_STORE = "ROCEV2_STORE"
ENV_JOB = "ROCEV2_JOB"
ENV_CLOCK = "ROCEV2_CLOCK"  # "exact": the rank is a process of an exact run
ENV_SYNC = "ROCEV2_SYNC"  # host:port of the exact run's coordinator
ENV_JOIN_TIMEOUT = "ROCEV2_JOIN_TIMEOUT"  # wall seconds to wait for it to listen (default 0)
# wall seconds the rank's /metrics stays served after it closed (default 0): a short job's last
# steps still reach a scraper (the compose training testbed: three of Prometheus' 2 s scrapes)
ENV_METRICS_LINGER = "ROCEV2_METRICS_LINGER"
EXACT_CLOSE_SECONDS = 600.0  # wall seconds close() waits for the other ranks to close too
WALL_CLOSE_SECONDS = 300.0  # the same on the wall clock: a dilated resend takes TDF x its time
ENV_PARAMS = ("ROCEV2_SLOTS", "ROCEV2_SLOT_BYTES", "ROCEV2_QPS_PER_CONNECTION")

Run = Callable[[Communicator], Awaitable[Any]]


class Pausable(Protocol):
    """An exact run's engine, as the rank's thread uses it."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class BackendError(RuntimeError):
    """The rank could not join the fabric (its environment, topology or rendezvous)."""


@dataclass(slots=True)
class RankEnv:
    """Where rank ``rank`` of ``world`` runs, read from the launcher's environment."""

    topo: Topology
    host: str
    rank: int
    world: int
    tdf: float
    epoch: float
    store: tuple[str, int]
    job: str
    params: dict[str, Any] = field(default_factory=dict)
    sync: tuple[str, int] | None = None  # the exact run's coordinator (None: the wall clock)
    join_timeout: float = 0.0  # wall seconds to wait for the coordinator to listen
    metrics_linger: float = 0.0  # wall seconds /metrics stays served after close

    @classmethod
    def from_environ(cls, rank: int, world: int) -> RankEnv:
        env = os.environ
        path = env.get(ENV_TOPOLOGY)
        exact = env.get(ENV_CLOCK) == "exact"
        store = env.get(ENV_SYNC if exact else ENV_STORE)
        if not path or not store:
            needed = (ENV_TOPOLOGY, ENV_SYNC if exact else ENV_STORE)
            missing = [n for n in needed if not env.get(n)]
            raise BackendError(
                f"rocev2 backend: {', '.join(missing)} not set; start the ranks with "
                "`rocev2-emu launch TOPOLOGY -- python SCRIPT`"
            )
        topo = blocks.running(load(path), path)  # (the launcher's run's block of 127/8)
        if world > len(topo.hosts):
            raise BackendError(
                f"rocev2 backend: world size {world}, but {path} has {len(topo.hosts)} hosts "
                "(one rank per host)"
            )
        host, _, port = store.rpartition(":")
        try:
            address = (host, int(port))
            tdf = float(env.get(ENV_TDF) or topo.tdf)
            epoch = float(env.get(ENV_EPOCH) or time.monotonic())
            params = {
                name.removeprefix("ROCEV2_").lower(): int(env[name])
                for name in ENV_PARAMS
                if env.get(name)
            }
            join_timeout = float(env.get(ENV_JOIN_TIMEOUT) or 0.0)
            linger = float(env.get(ENV_METRICS_LINGER) or 0.0)
            if not 0.0 <= linger <= 600.0:
                raise ValueError(f"{ENV_METRICS_LINGER}={linger:g}: 0 to 600 wall seconds")
        except ValueError as exc:
            raise BackendError(f"rocev2 backend: bad launcher environment: {exc}") from exc
        job = env.get(ENV_JOB, "torch")
        host_name = topo.hosts[rank].name
        if exact:
            return cls(
                topo,
                host_name,
                rank,
                world,
                1.0,
                0.0,
                address,
                job,
                params,
                address,
                join_timeout,
                linger,
            )
        return cls(
            topo, host_name, rank, world, tdf, epoch, address, job, params, metrics_linger=linger
        )

    def places(self) -> list[RankPlace]:
        """The first ``world`` hosts, one rank each, in topology order."""
        first: dict[str, RankPlace] = {}
        for p in places_for(self.topo):
            first.setdefault(p.host, p)
        hosts = list(first.values())[: self.world]
        return [RankPlace(i, p.host, p.leaf, 0, p.pod) for i, p in enumerate(hosts)]


@dataclass(slots=True)
class OpRecord:
    """One finished operation: emulated start and duration, and its wall-clock span."""

    op: str
    seq: int
    nbytes: int
    start: float
    seconds: float
    wall_start: float
    wall_end: float


class FabricWorker:
    """The trio thread of one rank: start it, submit operations, read what they took."""

    def __init__(self, env: RankEnv, timeout: float) -> None:
        self.env = env
        self.timeout = timeout  # wall seconds to join the fabric
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._send: trio.MemorySendChannel[tuple[str, Run, Any]] | None = None
        self._pending: set[Any] = set()
        self._lock = threading.Lock()
        self.records: list[OpRecord] = []
        self.step_metrics: StepMetrics | None = None
        self._ctx: Context | None = None
        self._thread = threading.Thread(
            target=self._thread_main, name=f"rocev2-rank{env.rank}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(self.timeout):
            raise BackendError(
                f"rocev2 backend: rank {self.env.rank} ({self.env.host}) did not join the "
                f"fabric within {self.timeout:g} s"
            )
        if self._error is not None:
            raise BackendError(
                f"rocev2 backend: rank {self.env.rank} ({self.env.host}) could not join the "
                f"fabric: {type(self._error).__name__}: {self._error}"
            ) from self._error

    def submit(self, name: str, run: Run, future: Any) -> None:
        """Queue ``run`` (from any thread); ``future`` gets its value or its error."""
        with self._lock:
            if self._error is not None or self._token is None:
                future.set_exception(RuntimeError(f"rocev2 backend: {name}: {self._dead()}"))
                return
            self._pending.add(future)
            assert self._send is not None
            self._token.run_sync_soon(self._send.send_nowait, (name, run, future))

    def take_records(self) -> list[OpRecord]:
        with self._lock:
            out, self.records = self.records, []
        return out

    def counters(self) -> dict[str, Any]:
        """The fabric's counters now: this rank's NIC and every switch (blocks, from the
        torch thread: at most 10 wall seconds per switch; asked from this thread, so that the
        deadlines are real seconds on the exact clock too, where the switches answer at the
        emulated instant their processes have reached)."""
        token, ctx = self._token, self._ctx
        if token is None or ctx is None:
            raise RuntimeError(f"rocev2 backend: {self._dead()}")
        own = trio.from_thread.run_sync(host_stats, ctx, trio_token=token)
        switches: dict[str, Any] = trio.run(self._switch_counters)
        return merge_stats({self.env.host: own, **switches})

    async def _switch_counters(self) -> dict[str, Any]:
        stats = {}
        for node in self.env.topo.nodes.values():
            if node.kind is NodeKind.SWITCH:
                with trio.move_on_after(10):
                    stats[node.name] = await control(node.address, {"cmd": "stats"})
        return stats

    def close(self, timeout: float | None = None) -> None:
        """Stop taking operations, let the queued ones finish, close the NIC once every rank
        has closed, end the thread (at most ``timeout`` wall seconds; by default
        :data:`WALL_CLOSE_SECONDS`, on the exact clock :data:`EXACT_CLOSE_SECONDS`; an abort
        gives less): before the interpreter shuts down, so no torch object is touched by a
        thread that outlives it."""
        with self._lock:
            if self._token is not None and self._send is not None and self._error is None:
                with contextlib.suppress(trio.RunFinishedError):  # it has just ended
                    self._token.run_sync_soon(self._send.close)
        if timeout is None:  # the NIC answers until all have closed
            timeout = WALL_CLOSE_SECONDS if self.env.sync is None else EXACT_CLOSE_SECONDS
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self.env.metrics_linger > 0:  # /metrics is served by a thread of its own, on
            time.sleep(self.env.metrics_linger)  # after the run: its last values, unchanged

    def _dead(self) -> str:
        return f"the rank's fabric thread has stopped ({self._error or 'closed'})"

    # -- the trio thread --------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            if self.env.sync is None:
                trio.run(self._main)
            else:
                run_process(self._main_joined)
        except BaseException as exc:
            self._error = first_exception(exc)  # the cause, not trio's group around it
        finally:
            with self._lock:
                if self._error is None:
                    self._error = RuntimeError("closed")
                pending, self._pending = self._pending, set()
            for fut in pending:
                if not fut.done():
                    fut.set_exception(RuntimeError(f"rocev2 backend: {self._dead()}"))
            self._ready.set()

    async def _main(self) -> None:
        env = self.env
        opts = NodeOptions(tdf=env.tdf, epoch=env.epoch)
        async with host_node(env.topo, env.host, opts) as (ctx, registry):
            store = await TcpStore.connect(*env.store)
            abort_store = await TcpStore.connect(*env.store)
            await self._serve(ctx, registry, store, abort_store, None)
            with contextlib.suppress(StoreTimeout):  # a rank that failed does not hold the others
                await store.arrive(f"{env.job}/closed", env.world, WALL_CLOSE_SECONDS)

    async def _main_joined(self) -> None:
        """The host as a process of the exact run (see the module), until the run ends."""
        env = self.env
        assert env.sync is not None
        groups = process_groups(env.topo)
        join = JoinOptions(join_timeout=env.join_timeout)
        async with joined_nodes(env.topo, groups, [env.host], env.sync, True, join) as process:
            ctx = process.contexts[env.host]
            registry = process.registries[env.host]
            store = exact_store(env.topo.nodes[env.host].index, ctx.clock)
            await self._serve(ctx, registry, store, None, process.engine)
            process.engine.finished()
            await trio.sleep_forever()  # the NIC answers the others until the run ends

    async def _serve(
        self,
        ctx: Context,
        registry: CollectorRegistry,
        store: Store,
        abort_store: Store | None,
        engine: Pausable | None,
    ) -> None:
        """The rank's communicator, then the script's operations in order until it closes;
        ``engine``: the exact run's, paused while no operation is queued."""
        env = self.env
        self._ctx = ctx
        self.step_metrics = StepMetrics(registry, env.rank)
        metrics = HostCollectiveMetrics(registry).rank(env.rank)
        options = comm_options(env.topo, {"job_id": env.job, **env.params})
        send, receive = trio.open_memory_channel[tuple[str, Run, Any]](math.inf)
        async with trio.open_nursery() as nursery:
            comm = await Communicator.create(
                ctx,
                store,
                env.places(),
                env.rank,
                HostGroup(1),
                nursery,
                options,
                metrics=metrics,
                abort_store=abort_store,
            )
            with self._lock:
                self._send = send
                self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            async with receive:
                while True:
                    if engine is not None:
                        engine.pause()  # the script decides, in wall time
                    try:
                        name, run, future = await receive.receive()
                    except trio.EndOfChannel:
                        break
                    finally:
                        if engine is not None:
                            engine.resume()  # its operation starts at this instant
                    await self._run_one(comm, name, run, future)
            comm.close()
            nursery.cancel_scope.cancel()

    async def _run_one(self, comm: Communicator, name: str, run: Run, future: Any) -> None:
        start, wall = comm.ctx.now(), time.monotonic()
        try:
            value = await run(comm)
        except Exception as exc:
            error: Exception = RuntimeError(str(exc)) if not isinstance(exc, RuntimeError) else exc
            with self._lock:
                self._pending.discard(future)
            future.set_exception(error)
            return
        last = comm.last
        with self._lock:
            self._pending.discard(future)
            self.records.append(
                OpRecord(
                    name,
                    int(last.get("seq", comm.seq)),
                    int(last.get("bytes", 0)),
                    start,
                    comm.ctx.now() - start,
                    wall,
                    time.monotonic(),
                )
            )
        future.set_result(value)
