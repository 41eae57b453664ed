"""Collectives over the emulated fabric: ring and hierarchical all-reduce, reduce-scatter,
all-gather, broadcast, all-to-all, reduce and barrier on numpy arrays, through the verbs API only.

In layers, each importing only those below it (an import-linter contract in pyproject.toml):

* :mod:`collectives.comm` - the library a training script calls: the rendezvous store, the
  links (RDMA WRITE with immediate, shared memory), ring schedules, placement, the session and
  the :class:`~collectives.comm.communicator.Communicator`, the reduction ops, the metrics.
* :mod:`collectives.jobs` - running a job's ranks: the job registry, the ranks of a host and
  virtual-time runs (:mod:`~collectives.jobs.job`), the launcher's side with processes
  (:mod:`~collectives.jobs.launch`).
* :mod:`collectives.bench` - the nccl-tests-style benchmark, the correctness checks, and the
  virtual-time speed benchmark.
* :mod:`collectives.scenarios` and :mod:`collectives.pytorch` - the four collective scenarios
  with their checks; the ``rocev2`` torch.distributed backend.
* :mod:`collectives.cli`, :mod:`collectives.launcher` and :mod:`collectives.plugin` - the
  command line (bench kinds, the demo, ``launch``) and the entry point that registers it all.

The host side never imports this package: :mod:`collectives.plugin` registers it through the
``rocev2_emu.plugins`` entry point.
"""

from rocev2_emu import cores as _cores  # first: compiled or pure, before the ring operation loads

del _cores
