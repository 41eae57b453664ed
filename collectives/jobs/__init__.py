"""Running collective jobs: jobs registered by name (:mod:`~collectives.jobs.registry`), a
host's ranks and virtual-time runs (:mod:`~collectives.jobs.job`), and the launcher's side on
a fabric of processes (:mod:`~collectives.jobs.launch`).  Imports only :mod:`collectives.comm`."""
