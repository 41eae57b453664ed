"""Collectives over the emulated fabric: ring and hierarchical all-reduce, reduce-scatter,
all-gather, broadcast, reduce and barrier on numpy arrays, through the verbs API only.

A rendezvous store (:mod:`~collectives.store`), slot/credit links over RDMA WRITE with
immediate and shared memory (:mod:`~collectives.links`), ring schedules (:mod:`~collectives.ring`),
the :class:`~collectives.communicator.Communicator`, jobs and how they run (:mod:`~collectives.job`,
:mod:`~collectives.launch`), the nccl-tests-style benchmark and the straggler scenario.  The host
side never imports this package: :mod:`collectives.plugin` registers it through the
``rocev2_emu.plugins`` entry point.
"""
