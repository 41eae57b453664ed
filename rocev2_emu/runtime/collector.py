"""The garbage collector's settings while an event engine runs a fabric.

A run allocates a few objects per frame-hop (events, frames, tuples) that reference counting
frees at once, and its setup leaves hundreds of thousands of long-lived objects (cores, queues,
tables, the ranks' buffers).  With CPython's default thresholds (700 allocations per young
collection) the cyclic collector then runs thousands of times per run and its full collections
walk every long-lived object: perf on ``bench virtual --cases b`` put ``gc_collect_main``,
``visit_decref`` and ``visit_reachable`` at 7 % of the process.  :func:`engine_collector`
freezes what exists when a run starts (the imported modules, the topology: ``gc.freeze``, never
walked again) and collects less often while the run goes, then puts both back (tests and
experiments run many fabrics in one process).

It freezes without collecting first: a full collection of a freshly imported process walks
every module's objects for 17-35 ms, 5-8 % of ``bench virtual --cases a``, to free garbage
that a frozen generation merely keeps until the run ends (``gc.unfreeze`` hands it back to the
oldest generation, collected as before) - the same trade CPython's documentation of
``gc.freeze`` makes for a process about to fork.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

RUN_THRESHOLDS: Final = (50_000, 20, 100)


@contextmanager
def engine_collector() -> Iterator[None]:
    """Within the block: what exists now frozen, the collector's thresholds raised."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*RUN_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
