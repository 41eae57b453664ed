"""The rank processes of ``rocev2-emu launch`` (:mod:`collectives.launcher`):
:class:`RankLauncher` starts one process per rank with torchrun's environment and where the
fabric is, prefixes each line it prints with ``[rankN]:``, and ends the job at the first rank
that fails (an abort every other rank's collective raises on, :data:`GRACE` seconds for them
to exit, then a kill).  It holds one process and two pipe tasks per rank.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

import trio

from collectives.comm.store import StoreServer
from rocev2_emu.fabric.control import control
from rocev2_emu.fabric.exact import Coordinator, SyncError, quiet_stats, sync_label
from rocev2_emu.fabric.report import merge_stats
from rocev2_emu.topology.model import NodeKind, Topology
from rocev2_emu.verbs import FABRIC_SECRET_ENV, fabric_secret

GRACE = 30.0  # wall seconds the other ranks get to exit after the first failure
MASTER_PORT = 29500  # launch --host: torch's own store (MASTER_PORT), on the first host too
RENDEZVOUS_SECONDS = 300.0  # launch --host: how long the ranks wait for each other


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RankLauncher:
    """The job of ``rocev2-emu launch``: one process per rank, over running switches."""

    def __init__(
        self,
        command: list[str],
        ranks: int | None = None,
        compute_ms: float = 0.0,
        env: dict[str, str] | None = None,
        out: TextIO | None = None,
        err: TextIO | None = None,
        per_host: int = 1,
    ) -> None:
        self.command = command
        self.ranks = ranks
        self.per_host = per_host  # ranks (NICs) per server of the original topology
        self.compute_ms = compute_ms
        self.extra_env = env or {}
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.job = f"torch-{secrets.token_hex(4)}"
        self.server = StoreServer("127.0.0.1", 0)
        self.failed: tuple[int, int] | None = None  # (rank, exit code) of the first failure
        self.procs: dict[int, trio.Process] = {}
        self.fabric: dict[str, Any] = {}
        self.topo: Topology | None = None
        self.coordinator: Coordinator | None = None  # the exact clock's (None: the wall clock)
        self._over = False  # the exact run has ended: its ranks may exit

    def hosts(self, topo: Topology) -> list[str]:
        n = len(topo.hosts) if self.ranks is None else self.ranks
        if not 1 <= n <= len(topo.hosts):
            raise ValueError(f"--ranks {n}: from 1 to the topology's {len(topo.hosts)} hosts")
        return [h.name for h in topo.hosts[:n]]

    def rank_env(
        self,
        topo: Topology,
        tdf: float,
        epoch: float,
        rank: int,
        store: int,
        master: int,
        where: str = "127.0.0.1",
    ) -> dict[str, str]:
        """Rank ``rank``'s environment; ``where``: the address of the rendezvous store
        (port ``store``) and of torch's own (``master``)."""
        world = len(self.hosts(topo))
        env = {
            **os.environ,
            **self.extra_env,
            FABRIC_SECRET_ENV: fabric_secret().hex(),
            "ROCEV2_TOPOLOGY": str(Path(topo.path).resolve()),
            "ROCEV2_TDF": repr(tdf),
            "ROCEV2_EPOCH": repr(epoch),
            "ROCEV2_STORE": f"{where}:{store}",
            "ROCEV2_JOB": self.job,
            "ROCEV2_COMPUTE_MS": repr(self.compute_ms),
            "ROCEV2_HOST": topo.hosts[rank].name,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % self.per_host),
            "LOCAL_WORLD_SIZE": str(self.per_host),
            "GROUP_RANK": str(rank // self.per_host),
            "GROUP_WORLD_SIZE": str(-(-world // self.per_host)),
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": where,
            "MASTER_PORT": str(master),
            "TORCHELASTIC_RUN_ID": self.job,
            "PYTHONUNBUFFERED": "1",
        }
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    async def run(self, topo: Topology, tdf: float, epoch: float) -> int:
        """The ranks (see the module), on the exact clock with a :attr:`coordinator` (which
        keeps the store, starts the clock once every rank has joined and reads the fabric
        once their applications are done), else on the wall clock dilated by ``tdf`` from
        ``epoch`` (a store served here; the switches' counters once the ranks are gone): their
        exit code."""
        self.topo = topo
        hosts = self.hosts(topo)
        master = free_port()
        coordinator = self.coordinator
        if coordinator is not None:
            tdf, epoch = 1.0, 0.0  # emulated time is the engines'
        async with trio.open_nursery() as nursery:
            store = 0 if coordinator is not None else await nursery.start(self.server.serve)
            async with trio.open_nursery() as ranks:
                for rank in range(len(hosts)):
                    env = self.rank_env(topo, tdf, epoch, rank, store, master)
                    if coordinator is not None:
                        assert coordinator.address is not None
                        env.pop("ROCEV2_STORE")  # the coordinator keeps the store
                        sync = sync_label(coordinator.address)
                        env.update({"ROCEV2_CLOCK": "exact", "ROCEV2_SYNC": sync})
                    proc = await self.spawn(rank, env, ranks)
                    self.procs[rank] = proc
                    ranks.start_soon(self._watch, rank, proc, ranks)
                if coordinator is not None:
                    await self._synchronised(topo, coordinator, hosts)
            if coordinator is None:
                self.fabric = await self._stats(topo, hosts)
            nursery.cancel_scope.cancel()
        return 0 if self.failed is None else exit_code(self.failed[1])

    async def _synchronised(
        self, topo: Topology, coordinator: Coordinator, hosts: list[str]
    ) -> None:
        """The exact run of the started ranks: the clock released once all have joined, the
        fabric's counters read once their applications are done, the run ended."""
        with trio.move_on_after(RENDEZVOUS_SECONDS) as joining:
            await coordinator.connected.wait()
        if joining.cancelled_caught:
            raise SyncError(
                f"the ranks did not all join the exact run within {RENDEZVOUS_SECONDS:g} s "
                '(does the program call dist.init_process_group("rocev2")?)'
            )
        coordinator.release()  # every rank is in: the clock starts
        await coordinator.apps_done(hosts)
        self.fabric = await quiet_stats(topo, coordinator)
        self._over = True

    async def spawn(self, rank: int, env: dict[str, str], nursery: trio.Nursery) -> trio.Process:
        """Rank ``rank``'s process running the command, its output streamed with the rank's
        prefix by tasks of ``nursery``."""
        proc = await trio.lowlevel.open_process(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        nursery.start_soon(self._stream, proc.stdout, f"[rank{rank}]:", self.out)
        nursery.start_soon(self._stream, proc.stderr, f"[rank{rank}]:", self.err)
        return proc

    async def _stream(self, stream: Any, prefix: str, to: TextIO) -> None:
        buf = b""
        async for chunk in stream:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                print(prefix, line.decode(errors="replace"), file=to, flush=True)
        if buf:
            print(prefix, buf.decode(errors="replace"), file=to, flush=True)

    async def _watch(self, rank: int, proc: trio.Process, ranks: trio.Nursery) -> None:
        """Rank ``rank`` until its process exits.  On the exact clock one that exits before
        the run has ended stops the job, named (the others could only wait for it); on the
        wall clock a failing one posts the job's abort, and the others are killed if they
        have not exited after a grace period."""
        try:
            code = await proc.wait()
        finally:
            with trio.CancelScope(shield=True):
                await self.kill(proc)
        assert self.topo is not None
        who = f"rank {rank} ({self.topo.hosts[rank].name}) exited with code {code}"
        if self.coordinator is not None:
            if code != 0 and self.failed is None:
                self.failed = (rank, code)
            if not self._over:
                raise SyncError(f"{who} before the exact run ended")
            return
        if code == 0 or self.failed is not None:
            return
        self.failed = (rank, code)
        print(f"rocev2-emu launch: {who}; stopping the job", file=self.err, flush=True)
        await self.server.store.set(f"{self.job}/abort", who)
        ranks.start_soon(self._kill_after_grace)

    async def _kill_after_grace(self) -> None:
        await trio.sleep(GRACE)
        for rank, proc in self.procs.items():
            if proc.returncode is None:
                print(f"rocev2-emu launch: killing rank {rank}", file=self.err, flush=True)
                proc.kill()

    @staticmethod
    async def kill(proc: trio.Process) -> None:
        if proc.returncode is not None:
            return
        proc.terminate()
        with trio.move_on_after(5):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    async def _stats(self, topo: Topology, hosts: list[str]) -> dict[str, Any]:
        """The switches' counters (the ranks' hosts are gone with their processes)."""
        stats = {}
        for node in topo.nodes.values():
            if node.kind is NodeKind.SWITCH:
                with trio.move_on_after(10):
                    stats[node.name] = await control(node.address, {"cmd": "stats"})
        return merge_stats(stats)

    async def node_died(self, name: str, code: int) -> bool:
        """A switch died: the fabric is broken; the ranks' collectives fail."""
        await self.server.store.set(f"{self.job}/abort", f"switch {name} died with code {code}")
        return False


def exit_code(code: int) -> int:
    """A process's return code as a shell reports it: 128 + N for signal N."""
    return 128 - code if code < 0 else code
