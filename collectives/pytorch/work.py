"""What the ``rocev2`` process group returns for each operation: a ``torch.distributed.Work``
over the future its fabric thread completes."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import torch.distributed as dist


class FabricWork(dist.Work):  # type: ignore[misc]
    """An operation in flight: ``wait()`` blocks until it is done and raises its error;
    ``get_future()`` is the ``torch.futures.Future`` DDP's comm hooks chain on.

    Every operation has its own deadline in the fabric thread (emulated, scaled with its
    size), so ``wait()`` returns or raises; ``wait(timeout)`` and the group's timeout
    (``init_process_group(timeout=...)``) bound it in wall time too."""

    def __init__(self, future: Any, op: str, timeout: float) -> None:
        super().__init__()
        self._future = future
        self._op = op
        self._timeout = timeout
        self._done = threading.Event()
        future.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        limit = timeout.total_seconds() if timeout else self._timeout
        if not self._done.wait(limit if limit > 0 else None):
            raise RuntimeError(
                f"rocev2 backend: {self._op} did not finish within {limit:g} s (wall)"
            )
        self._future.wait()  # done: its value, or its error raised
        return True

    def is_completed(self) -> bool:
        return bool(self._future.done())

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True

    def exception(self) -> BaseException | None:
        if not self._future.done():
            return None
        try:
            self._future.value()
        except Exception as exc:
            return exc
        return None

    def get_future(self) -> Any:
        return self._future

    def result(self) -> Any:
        return self._future.wait()
