"""Node processes forked from the launcher, made before they are needed.

A fresh interpreter per node process spends 0.45-0.7 s of CPU importing trio, numpy,
prometheus_client and this package before it does anything, and a run of the shipped
leaf-spine starts 14 of them on two cores.  The launcher (``up``, ``demo``, ``bench``,
``scenario``) has imported all of that already; so, before its event loop starts, it forks one
blank child per node process (:class:`Blanks`).  Each blank waits on a pipe for the command
line and environment it is to run as; given them, it runs ``python -m rocev2_emu ARGV``
in-process (:func:`runpy.run_module`, as ``-m`` does, its modules imported already) and exits
with its code: the program a new interpreter would run, started in milliseconds.
:class:`ForkedProcess` is the parent's handle: the part of :class:`trio.Process` the
supervisor uses (the output pipes as streams, the exit awaited and signals sent through a
pidfd, so a reused pid is never hit).

What a blank keeps from its parent, and why that is safe: the imported modules (the point);
the hash seed (nothing here depends on it); the state of the global random generators (nothing
here draws from them: every stream is seeded per node and link); the command line ``ps``
shows, the launcher's - its name (``/proc/PID/comm``: what ``top``, ``pgrep`` and ``ps -o
comm`` show) is set to its nodes' instead.  What it does not keep: the environment (replaced by
the one sent), the standard streams (fd 1 and 2 become its pipes, with new
``sys.stdout``/``sys.stderr`` over them), the root logger's handlers, SIGINT and SIGTERM
handlers (back to Python's defaults), the parent ends of the other blanks' pipes (closed, so
each blank sees the end of its own command).  Other descriptors the parent had open stay open,
as they would not across exec(2); the launcher has none that matter before its loop starts.

POSIX fork(2), Linux's pidfd_open(2) and pidfd_send_signal(2).  Without them :class:`Blanks`
makes none, and the supervisor starts ``python -m rocev2_emu`` processes as before.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import runpy
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NoReturn, Protocol

import msgpack
import trio
import trio.abc

__all__ = ["PROGRAM", "Blanks", "ForkedProcess", "NodeProcess"]

PROGRAM = "rocev2_emu"  # what a blank runs, as ``python -m rocev2_emu`` would


class NodeProcess(Protocol):
    """What the supervisor uses of a node process: :class:`trio.Process` or
    :class:`ForkedProcess`."""

    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    async def wait(self) -> int: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


@dataclass(slots=True)
class _Blank:
    pid: int
    pidfd: int
    command: int  # the write end of its command pipe
    out: int  # the read ends of its stdout and stderr
    err: int

    def fds(self) -> tuple[int, int, int, int]:
        return self.pidfd, self.command, self.out, self.err


class Blanks:
    """``count`` blank children forked now (none where fork or pidfd is missing);
    :meth:`start` gives one its command line, :meth:`close` ends the unused."""

    def __init__(self, count: int) -> None:
        self._free: list[_Blank] = []
        if not hasattr(os, "pidfd_open") or count <= 0:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # the children's collectors leave what is here alone (fewer copied pages)
        try:
            for _ in range(count):
                self._free.append(self._fork())
        except BaseException:
            self.close()
            raise
        finally:
            gc.unfreeze()

    def _fork(self) -> _Blank:
        command_r, command_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        others = [fd for blank in self._free for fd in blank.fds()]
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child (runs to os._exit)
            _blank(command_r, out_w, err_w, [command_w, out_r, err_r, *others])
        os.close(command_r)
        os.close(out_w)
        os.close(err_w)
        return _Blank(pid, os.pidfd_open(pid), command_w, out_r, err_r)

    def __len__(self) -> int:
        return len(self._free)

    def start(self, argv: list[str], env: dict[str, str], title: str) -> ForkedProcess | None:
        """A blank running ``rocev2-emu ARGV`` in environment ``env``, named ``title`` (its
        first 15 characters: what ``top`` and ``pgrep`` show); None if none is left."""
        if not self._free:
            return None
        blank = self._free.pop(0)
        command = memoryview(msgpack.packb([argv, env, title]))
        try:
            while command:  # blocking: the blank reads as it comes (a pipe holds 64 KiB)
                command = command[os.write(blank.command, command) :]
        finally:
            os.close(blank.command)
        return ForkedProcess(blank)

    def close(self) -> None:
        """End the blanks nobody took (each sees its command pipe close, and exits)."""
        free, self._free = self._free, []
        for blank in free:
            for fd in (blank.command, blank.out, blank.err):
                os.close(fd)
        for blank in free:
            os.waitpid(blank.pid, 0)
            os.close(blank.pidfd)

    def __enter__(self) -> Blanks:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ForkedProcess:
    """A started blank, as the supervisor sees a node process."""

    def __init__(self, blank: _Blank) -> None:
        self.pid = blank.pid
        self._pidfd = blank.pidfd
        self.stdout: trio.abc.ReceiveStream | None = trio.lowlevel.FdStream(blank.out)
        self.stderr: trio.abc.ReceiveStream | None = trio.lowlevel.FdStream(blank.err)
        self.returncode: int | None = None
        self._waiting = trio.Lock()

    def poll(self) -> int | None:
        """Its exit code (negative: the signal that ended it), or None while it runs."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    async def wait(self) -> int:
        async with self._waiting:  # one waiter on the pidfd at a time, as trio requires
            while (code := self.poll()) is None:
                await trio.lowlevel.wait_readable(self._pidfd)
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1
            return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not yet reaped: its pidfd still names it
            signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _blank(command: int, out: int, err: int, close: list[int]) -> NoReturn:
    """A forked child: wait for a command line, run it, exit with its code (never returns)."""
    code = 1
    try:
        for fd in close:
            os.close(fd)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        # new streams over the new fds, buffered as a fresh interpreter's are on pipes (the
        # parent's may be a test runner's capture objects over other descriptors)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False)
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True
        )
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        chunks = []
        while chunk := os.read(command, 65536):
            chunks.append(chunk)
        os.close(command)
        if not chunks:  # not needed after all
            _exit(0)
        argv, env, title = msgpack.unpackb(b"".join(chunks))
        with contextlib.suppress(OSError):  # its name: a node, not the launcher's "python3"
            Path("/proc/self/comm").write_text(title[:15])
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [PROGRAM, *argv]  # run_module puts the module's path first, as -m does
        logging.root.handlers.clear()  # the command configures its own, on the new stderr
        runpy.run_module(PROGRAM, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    _exit(code)


def _exit(code: int) -> NoReturn:
    """Leave the child now: never unwind into the parent's frames, nor run its exit hooks."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
