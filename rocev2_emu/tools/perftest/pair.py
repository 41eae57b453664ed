"""A perftest pair on the event engine: the two NICs of ``write-bw`` (and the other tests) as the
two hosts of a one-link fabric, in emulated time - as two processes of an exact run
(``--clock exact``: the server's process also serves the run's coordinator, on the out-of-band
address and port, where the client finds it) or both in one process (``--virtual``).

The link is the pair's: ``--rate``, ``--delay-us`` (1 µs unless given: the exact run's lookahead,
a link between processes must take time), ``--loss`` drawn from ``--seed``.  The out-of-band
exchange - the client's parameters, the QPs, the barriers between sizes - goes through the
fabric's rendezvous store (:class:`~rocev2_emu.fabric.rendezvous.StoreChannel`: 2 µs of emulated
time each way), never a wall-clock wait, so the exact pair prints what the virtual pair prints,
figure for figure, however loaded the machine is (only the header's ``clock`` differs).  The
virtual pair prints the server's lines, then the client's.

The exact pair's two nodes bind the block of 127/8 its out-of-band port names (127.B with
B = 11 + port % 240, both sides knowing the port): never the default 127.10, where a fabric
may run, and another block for each pair beside it (its port is its own while it listens).
"""

from __future__ import annotations

import contextvars
import io
import sys
import threading
from copy import copy
from functools import partial
from typing import TextIO

import trio

from rocev2_emu.control import auth
from rocev2_emu.control.channel import ControlError
from rocev2_emu.fabric import blocks
from rocev2_emu.fabric.exact_node import joined_nodes, run_process
from rocev2_emu.fabric.options import Clock
from rocev2_emu.fabric.rendezvous import StoreChannel, VirtualStore, exact_store
from rocev2_emu.fabric.supervisor import first_exception
from rocev2_emu.fabric.virtual import run_virtual_time, virtual_fabric
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.sync_messages import SyncError
from rocev2_emu.tools.perftest.options import TITLES, PerftestError, PerftestOptions
from rocev2_emu.tools.perftest.report import waiting_for_client
from rocev2_emu.tools.perftest.session import converse
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.model import Topology
from rocev2_emu.topology.processes import process_groups

SERVER, CLIENT = "server", "client"
CHANNEL = "perftest"


def pair_topology(opts: PerftestOptions) -> Topology:
    """The pair's fabric: the two hosts and their link (see the module)."""
    if not opts.rate_gbps > 0:
        raise PerftestError("a pair on the event engine needs a link rate (--rate > 0)")
    if not opts.delay_us > 0:
        raise PerftestError("a pair on the event engine needs a link delay (--delay-us > 0)")
    data = {
        "fabric": {"name": "perftest-pair", "tdf": 1.0, "seed": opts.faults.seed},
        "host": [{"name": SERVER}, {"name": CLIENT}],
        "link": [
            {
                "a": SERVER,
                "b": CLIENT,
                "rate_gbps": opts.rate_gbps,
                "delay_us": opts.delay_us,
                "loss": opts.faults.loss,
            }
        ],
    }
    path = auth.run_dir() / f"perftest-pair-{opts.oob_port}.toml"  # names the pair's secret
    return blocks.relocate(parse(data, str(path)), pair_block(opts.oob_port))


def pair_block(port: int) -> int:
    """The block of 127/8 the pair on out-of-band ``port`` binds (never the default one)."""
    return blocks.FIRST + 1 + port % (blocks.LAST - blocks.FIRST)


def _check(opts: PerftestOptions) -> None:
    if opts.test not in TITLES:
        raise PerftestError(f"unknown test {opts.test!r}; choose from {sorted(TITLES)}")


def run_pair(opts: PerftestOptions) -> int:
    """The pair on the event engine at the options' clock: both sides in this process in
    virtual time, or this side of an exact run (the server's process serves its coordinator)."""
    _check(opts)
    if opts.clock is Clock.VIRTUAL:
        return _both_sides(opts)
    if opts.clock is Clock.EXACT:
        return _one_side(opts)
    raise PerftestError(f"a pair on the event engine runs virtual or exact, not {opts.clock.value}")


# -- both sides in one process (virtual time) ------------------------------------------------------
_OUT: contextvars.ContextVar[TextIO | None] = contextvars.ContextVar("perftest_out", default=None)


class _TaskOutput(io.TextIOBase):
    """stdout for two sides in one trio run: each task writes where its context says."""

    def __init__(self, default: TextIO) -> None:
        self.default = default

    def write(self, text: str) -> int:
        return (_OUT.get() or self.default).write(text)

    def flush(self) -> None:
        (_OUT.get() or self.default).flush()


def _both_sides(opts: PerftestOptions) -> int:
    """Both sides in this process, in virtual time; the server's output, then the client's."""
    topo = pair_topology(opts)
    server, client = copy(opts), copy(opts)
    server.server, client.server = None, "virtual"
    server.clock = client.clock = Clock.VIRTUAL
    outputs = {SERVER: io.StringIO(), CLIENT: io.StringIO()}
    stdout = sys.stdout
    sys.stdout = _TaskOutput(stdout)
    try:
        run_virtual_time(topo.seed, _both_sides_main, topo, server, client, outputs)
    finally:
        sys.stdout = stdout
    print(f"# perftest pair in virtual time ({TITLES[opts.test]}): the server")
    print(outputs[SERVER].getvalue(), end="")
    print("# the client")
    print(outputs[CLIENT].getvalue(), end="", flush=True)
    return 0


async def _both_sides_main(
    topo: Topology,
    server: PerftestOptions,
    client: PerftestOptions,
    outputs: dict[str, io.StringIO],
) -> None:
    async with virtual_fabric(topo) as (_, agents), trio.open_nursery() as nursery:
        clock = agents[SERVER].ctx.clock
        store = VirtualStore(clock)
        nursery.start_soon(store.run)
        async with trio.open_nursery() as sides:
            for me, peer, opts in ((SERVER, CLIENT, server), (CLIENT, SERVER, client)):
                ctx = agents[me].ctx
                chan = StoreChannel(
                    store.client(topo.nodes[me].index, ctx.clock), CHANNEL, me, peer
                )
                _OUT.set(outputs[me])  # the side's task copies this context
                sides.start_soon(converse, ctx, chan, opts, "-")
            _OUT.set(None)
        nursery.cancel_scope.cancel()


# -- one side in each process (the exact clock) ----------------------------------------------------
def _one_side(opts: PerftestOptions) -> int:
    """One side of the exact pair in this process (the server also runs the coordinator)."""
    topo = pair_topology(opts)
    sync = (opts.server or opts.oob_addr, opts.oob_port)
    coordinator: _CoordinatorThread | None = None
    if opts.is_server:
        secret, _ = auth.load_or_create(topo.path)
        auth.use(secret)
        coordinator = _CoordinatorThread(topo, (opts.oob_addr, opts.oob_port), secret, opts)
        coordinator.start()
        waiting_for_client()
    else:
        auth.use_fabric(topo.path)
    try:
        run_process(partial(_one_side_main, topo, opts, sync))
    except BaseException as exc:
        if coordinator is not None:
            coordinator.join()  # its own error says more than a closed connection
            if coordinator.error is not None:
                raise PerftestError(f"the pair stopped: {coordinator.error}") from None
        first = first_exception(exc)
        if isinstance(first, PerftestError):
            raise first from None
        if isinstance(first, SyncError | ControlError):
            if opts.is_server:
                raise PerftestError(f"the pair stopped: {first}") from None
            raise PerftestError(
                f"the server ended the pair ({first}); its output says why"
            ) from None
        raise
    finally:
        if coordinator is not None:
            coordinator.join()
    return 0


async def _one_side_main(topo: Topology, opts: PerftestOptions, sync: tuple[str, int]) -> None:
    me, peer = (SERVER, CLIENT) if opts.is_server else (CLIENT, SERVER)
    groups = process_groups(topo)
    async with joined_nodes(topo, groups, [me], sync, False) as process:
        ctx = process.contexts[me]
        chan = StoreChannel(exact_store(topo.nodes[me].index, ctx.clock), CHANNEL, me, peer)
        try:
            await converse(ctx, chan, opts, "-")
        finally:
            process.engine.finished()  # the NIC answers until the other side is done too
        sys.stdout.flush()
        await trio.sleep_forever()


class _CoordinatorThread:
    """The exact pair's coordinator, on the wall clock in a thread of the server's process: it
    listens on the out-of-band address, starts the clock once both sides are in, and ends the
    run once both are done and the link is quiet."""

    def __init__(
        self, topo: Topology, where: tuple[str, int], secret: bytes, opts: PerftestOptions
    ) -> None:
        self.coordinator = Coordinator([SERVER, CLIENT], topo.links[0].delay, secret)
        self.where = where
        self.timeout = opts.connect_timeout
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="perftest-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self.error is not None:
            raise PerftestError(f"the pair's coordinator cannot listen: {self.error}")

    def join(self) -> None:
        self._thread.join(timeout=10.0)

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as exc:  # the main thread reports it
            self.error = first_exception(exc)
        finally:
            self._ready.set()

    async def _run(self) -> None:
        c = self.coordinator
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(c.serve, *self.where))
            self._ready.set()
            with trio.move_on_after(self.timeout) as waiting:
                await c.connected.wait()
            if waiting.cancelled_caught:
                raise SyncError(f"no client joined within {self.timeout:g} s")
            c.release()
            await c.apps_done([SERVER, CLIENT])
            await c.quiet.wait()
            await c.finish()
            nursery.cancel_scope.cancel()
