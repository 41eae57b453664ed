"""``rocev2-emu launch TOPOLOGY -- COMMAND...``: a program on every host of a fabric, as torchrun
starts one.

The fabric's switches run as node processes (:func:`rocev2_emu.fabric.supervisor.run_processes`
with ``only`` the switches); each host is the process of one rank, running ``COMMAND`` with
torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RUN_ID``; ``OMP_NUM_THREADS=1`` unless set, as torchrun does for several ranks)
and where the fabric is (``ROCEV2_TOPOLOGY``, ``ROCEV2_TDF``, ``ROCEV2_EPOCH``,
``ROCEV2_STORE``, ``ROCEV2_JOB``, ``ROCEV2_COMPUTE_MS``, the fabric's secret, and on the
exact clock ``ROCEV2_CLOCK`` and ``ROCEV2_SYNC``), which the
``rocev2`` torch backend (:mod:`collectives.pytorch`) reads: rank r becomes host r of the
topology.  The launcher serves the rendezvous store the ranks connect through.

Every line a rank prints comes out with torchrun's ``[rankN]:`` prefix.  The first rank to fail
ends the job: the launcher posts an abort naming it, so every other rank's collective in flight
raises at once (as torch's watchdog would, naming rank, operation and sequence), waits
:data:`~collectives.jobs.ranks.GRACE` seconds for the others to exit, kills what is left,
and exits with that rank's code (128 + N for a signal N).  Ctrl-C stops every process.  The
fabric's counters are printed at the end.

``--host NAME`` runs only that host's rank, over switches already running (the compose
testbed's training service, a container per host): :func:`run_one_rank`.  With ``--clock
exact`` (:func:`run_one_rank_exact`) the first host's launcher serves the run's coordinator on
its address, port :data:`SYNC_PORT`, which the other nodes (``rocev2-emu node ... --clock exact
--sync ADDR:PORT``) and every rank join; it ends the run once every rank has closed its group
and prints the fabric's counters - the same emulated figures as ``launch --clock exact``.

``--clock exact``: the switches (and any host without a rank) are node processes of an exact
run (:func:`rocev2_emu.fabric.supervisor.run_on_processes`) and each rank's process is one too (its
fabric thread: :mod:`collectives.pytorch.worker`), synchronised by a coordinator served here;
the rendezvous store is the coordinator's, in emulated time.  The clock starts once every rank
has joined; a rank's operations start at the emulated instant its previous one ended, whatever
its script did meanwhile in wall time, so every run gives the same emulated figures.  The run
ends once every rank has closed its group and the fabric is quiet; a rank that exits before
that ends the job, naming it.
"""

from __future__ import annotations

import signal
import sys
import time
from functools import partial
from typing import Any

import trio

from collectives.cli import map_task
from collectives.comm.store import StoreServer, StoreTimeout, TcpStore
from collectives.jobs.ranks import (
    MASTER_PORT,
    RENDEZVOUS_SECONDS,
    RankLauncher,
    exit_code,
)
from rocev2_emu.fabric.exact import Coordinator, SyncError, quiet_stats
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.fabric.supervisor import NodeDied, coordinator_for, run_on_processes, run_synced
from rocev2_emu.topology.model import Topology, refuse_split_servers
from rocev2_emu.verbs import fabric_secret

STORE_PORT = 29400  # launch --host: the rendezvous store, on the first host (torchrun's port)
SYNC_PORT = 29600  # launch --host --clock exact: the run's coordinator, on the first host


async def run_one_rank(
    job: RankLauncher, topo: Topology, host: str, tdf: float, job_id: str
) -> int:
    """``launch --host HOST``: only that host's rank, over switches already running (the
    compose testbed's training service, a container per host).  The first host's process
    serves the rendezvous store on its address (:data:`STORE_PORT`; torch's own store is
    there too, on :data:`MASTER_PORT`) until every rank has said it is done; a failing rank
    posts the job's abort, so the others raise instead of waiting out their deadlines."""
    hosts = job.hosts(topo)
    if host not in hosts:
        raise ValueError(f"--host {host}: not one of the job's hosts ({', '.join(hosts)})")
    rank, world = hosts.index(host), len(hosts)
    where = topo.nodes[hosts[0]].address
    job.job, job.topo = job_id, topo
    async with trio.open_nursery() as nursery:
        server = None
        if rank == 0:
            server = StoreServer(where, STORE_PORT)
            await nursery.start(server.serve)
        store = await TcpStore.connect(where, STORE_PORT, timeout=RENDEZVOUS_SECONDS)
        env = job.rank_env(topo, tdf, time.monotonic(), rank, STORE_PORT, MASTER_PORT, where)
        async with trio.open_nursery() as streams:
            proc = await job.spawn(rank, env, streams)
            try:
                code = await proc.wait()
            finally:
                with trio.CancelScope(shield=True):
                    await job.kill(proc)
        if code != 0:
            why = f"rank {rank} ({host}) exited with code {code}"
            print(f"rocev2-emu launch: {why}", file=job.err, flush=True)
            await store.set(f"{job_id}/abort", why)
        await store.add(f"{job_id}/done", 1)
        if server is not None:  # the store outlives every rank's use of it
            try:
                await server.store.wait_count(f"{job_id}/done", world, RENDEZVOUS_SECONDS)
            except StoreTimeout as exc:
                print(f"rocev2-emu launch: {exc}; closing the store", file=job.err, flush=True)
        await store.aclose()
        nursery.cancel_scope.cancel()
    return exit_code(code)


async def run_one_rank_exact(job: RankLauncher, topo: Topology, host: str, job_id: str) -> int:
    """``launch --host HOST --clock exact``: that host's rank as a process of an exact run.
    The first host's launcher serves the coordinator on its address (:data:`SYNC_PORT`; the
    run's rendezvous store is the coordinator's), waits up to :data:`RENDEZVOUS_SECONDS` for
    every process of the run to join (the ranks, and ``rocev2-emu node ... --clock exact
    --sync ADDR:PORT`` for each other node), starts the clock, and once every rank's
    application has finished reads the fabric's counters (:attr:`RankLauncher.fabric`) and
    ends the run; another host's launcher runs its rank, whose process waits as long for the
    coordinator to listen.  The rank's exit code; a SyncError (one line) when the run could
    not go on."""
    hosts = job.hosts(topo)
    if host not in hosts:
        raise ValueError(f"--host {host}: not one of the job's hosts ({', '.join(hosts)})")
    rank = hosts.index(host)
    where = topo.nodes[hosts[0]].address
    job.job, job.topo = job_id, topo
    env = job.rank_env(topo, 1.0, 0.0, rank, 0, MASTER_PORT, where)
    env.pop("ROCEV2_STORE")  # the coordinator keeps the store
    env.update(
        {
            "ROCEV2_CLOCK": "exact",
            "ROCEV2_SYNC": f"{where}:{SYNC_PORT}",
            "ROCEV2_JOIN_TIMEOUT": repr(RENDEZVOUS_SECONDS),
        }
    )
    if rank != 0:
        async with trio.open_nursery() as streams:
            proc = await job.spawn(rank, env, streams)
            try:
                code = await proc.wait()
            finally:
                with trio.CancelScope(shield=True):
                    await job.kill(proc)
        if code != 0:  # the coordinator stops the run: the other ranks raise
            print(f"rocev2-emu launch: rank {rank} ({host}) exited with code {code}", file=job.err)
        return exit_code(code)
    coordinator = job.coordinator
    assert coordinator is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(coordinator.serve, where, SYNC_PORT))
        async with trio.open_nursery() as ranks:
            proc = await job.spawn(rank, env, ranks)
            job.procs[rank] = proc
            ranks.start_soon(job._watch, rank, proc, ranks)
            with trio.move_on_after(RENDEZVOUS_SECONDS):
                await coordinator.connected.wait()
            if not coordinator.connected.is_set():
                missing = ", ".join(coordinator.missing())
                raise SyncError(
                    f"not joined within {RENDEZVOUS_SECONDS:g} s: {missing} (each rank: launch "
                    "--host NAME --clock exact; each other node: rocev2-emu "
                    f"node TOPOLOGY NAME --clock exact --sync {where}:{SYNC_PORT})"
                )
            coordinator.release()  # every process is in: the clock starts
            await coordinator.apps_done(hosts)
            job.fabric = await quiet_stats(topo, coordinator)
            job._over = True
        nursery.cancel_scope.cancel()
    return 0 if job.failed is None else exit_code(job.failed[1])


def per_host(data: dict[str, Any], n: int) -> dict[str, Any]:
    """The topology (as data) with every host given ``n`` NICs, one per local rank, as the
    servers of AI clusters have one NIC per accelerator: host ``hK`` becomes ``hK-0`` ...
    ``hK-(n-1)``, each linked to what ``hK`` was linked to, with the same link settings.  The
    ranks of one server then reach each other through its leaf (no NVLink is modelled)."""
    if n < 1:
        raise ValueError(f"--nproc-per-host {n}: at least 1")
    if n == 1:
        return data
    groups: dict[str, list[str]] = {}
    hosts: list[dict[str, Any]] = []
    for host in data.get("host", []):
        names = [f"{host['name']}-{i}" for i in range(n)]
        groups[host["name"]] = names
        hosts += [{**host, "name": name} for name in names]
    links: list[dict[str, Any]] = []
    for link in data.get("link", []):
        a, b = link.get("a"), link.get("b")
        if a in groups and b in groups:
            raise ValueError(f"--nproc-per-host: link {a}-{b} joins two hosts")
        if a in groups:
            links += [{**link, "a": name} for name in groups[a]]
        elif b in groups:
            links += [{**link, "b": name} for name in groups[b]]
        else:
            links.append(link)
    return {**data, "host": hosts, "link": links}


def launch(
    topo: Topology,
    path: str,
    options: RunOptions,
    command: list[str],
    *,
    ranks: int | None,
    compute_ms: float,
    ui: str | None = None,
    host: str | None = None,
    job_id: str = "torch",
    nproc_per_host: int = 1,
) -> int:
    """``rocev2-emu launch``: the switches, the ranks on the options' clock (exact or wall),
    their exit code (``ui``: the map);
    ``host``: only that host's rank, over running switches (:func:`run_one_rank`);
    ``nproc_per_host``: ``topo`` is already :func:`per_host`'s, for the ranks' environment."""
    if not command:
        raise ValueError("launch: no command; give it after --, e.g. -- python train.py")
    refuse_split_servers(topo, runner="launch (a process per rank, each its own host)")
    job = RankLauncher(command, ranks, compute_ms, per_host=nproc_per_host)
    job.hosts(topo)  # a bad --ranks fails before anything starts
    exact = options.clock is Clock.EXACT
    tdf = options.dilation(topo.tdf)
    if host is not None:
        if ui is not None:
            raise ValueError("launch --host runs one rank: serve the map where the fabric runs")
        return _one_rank(topo, job, host, options, job_id)
    hosts = job.hosts(topo)
    others = [name for name in topo.nodes if name not in hosts]
    clock = "clock: exact" if exact else f"clock: wall, TDF {tdf:g}"
    print(
        f"# rocev2-emu launch: {len(hosts)} ranks on {topo.name} ({len(others)} node "
        f"processes beside them), {clock}, job {job.job}",
        flush=True,
    )

    def make_job(coordinator: Coordinator | None) -> RankLauncher:
        job.coordinator = coordinator  # None: the wall clock's ranks
        return job

    try:
        code, synced = run_on_processes(
            topo, path, options, make_job, only=others, beside=map_task(topo, ui)
        )
    except NodeDied:
        print("rocev2-emu launch: a switch died", file=sys.stderr)
        return 1
    except SyncError as exc:
        return _stopped(topo, job, exc)
    _print_fabric(job.fabric, f"clock: exact, {synced}" if exact else clock)
    return int(code)


def _one_rank(
    topo: Topology, job: RankLauncher, host: str, options: RunOptions, job_id: str
) -> int:
    """``launch --host``: that host's rank over running switches, on the options' clock (the
    exact clock's first host also serves the coordinator and prints the fabric's counters)."""
    if options.clock is not Clock.EXACT:
        return trio.run(run_one_rank, job, topo, host, options.dilation(topo.tdf), job_id)
    if host == job.hosts(topo)[0]:  # the first host's launcher serves the coordinator
        job.coordinator = coordinator_for(topo, fabric_secret())
        print(
            f"# rocev2-emu launch: rank 0 of {len(job.hosts(topo))} on {topo.name}, clock: "
            f"exact, coordinator on {topo.nodes[host].address}:{SYNC_PORT}, job {job_id}",
            flush=True,
        )
    try:
        code = run_synced(run_one_rank_exact, job, topo, host, job_id)
    except SyncError as exc:
        return _stopped(topo, job, exc)
    if job.coordinator is not None:  # the first host's: the fabric's counters
        _print_fabric(job.fabric, f"clock: exact, {job.coordinator.summary()}")
    return int(code)


def _stopped(topo: Topology, job: RankLauncher, exc: SyncError) -> int:
    """An exact run that could not go on: one line naming the rank that ended it (when one
    did), and that rank's code (else 1)."""
    why = str(exc)
    if job.failed is None:  # the coordinator may have heard of a dead rank first
        codes = {rank: proc.returncode for rank, proc in job.procs.items()}
        died = [(rank, code) for rank, code in codes.items() if code is not None and _died(code)]
        job.failed = died[0] if died else None
    if job.failed is not None:
        rank, code = job.failed
        why = f"rank {rank} ({topo.hosts[rank].name}) exited with code {code}"
    print(f"rocev2-emu launch: {why}; the job stopped", file=sys.stderr, flush=True)
    return exit_code(job.failed[1]) if job.failed is not None else 1


def _print_fabric(f: dict[str, Any], clock: str) -> None:
    """The closing line of a launch: the fabric's counters (on the wall clock the switches',
    the ranks' hosts gone with their processes) and its clock (on the exact clock, how it was
    synchronised)."""
    drops = sum(f.get("drops", {}).values())
    work = (  # the exact clock's frame-hops; how often the wall clock's emulation fell behind
        f"{f['frame_hops']} frame-hops"
        if "frame_hops" in f
        else f"{f.get('late_wakeups', 0)} late wake-ups"
    )
    print(
        f"# fabric: {f.get('pfc_tx', 0)} pause frames sent by {len(f.get('pfc_senders', []))}, "
        f"{f.get('ecn_marked', 0)} ECN marks, {f.get('cnps_sent', 0)} CNPs, "
        f"{f.get('retransmitted', 0)} retransmissions, {drops} drops, {work}; {clock}",
        flush=True,
    )


def _died(code: int) -> bool:
    """A rank's return code says it ended on its own with an error (not stopped by us)."""
    return code != 0 and code not in (-signal.SIGTERM, -signal.SIGKILL)
