"""How the collectives plug into the host side, which never imports them.

``rocev2_emu`` loads the ``rocev2_emu.plugins`` entry points (pyproject.toml names
:func:`register`) before it runs a command.  Registering adds: the host agent's
``collective`` command (:mod:`rocev2_emu.fabric.services`), the ``bench`` kinds all-reduce,
all-gather, reduce-scatter and broadcast and the all-reduce demo (:mod:`collectives.cli`),
the ``straggler``, ``ecmp-entropy``, ``admission`` and ``spine-failure`` scenarios
(:mod:`collectives.scenarios`) and ``launch`` (:mod:`collectives.launch_command`); importing the
modules registers their jobs (:mod:`collectives.jobs.registry`), so a node process can run any
of them by name.
"""

from __future__ import annotations

from collectives import cli, launch_command
from collectives.bench import checks, dlrm  # noqa: F401  (register their jobs)
from collectives.jobs.job import CollectiveRequest, collective_handler
from collectives.scenarios import admission, entropy, recommendation, spine_failure, straggler
from rocev2_emu.fabric.services import host_service


def register() -> None:
    host_service("collective", CollectiveRequest)(collective_handler)
    cli.register()
    straggler.register()
    entropy.register()
    admission.register()
    spine_failure.register()
    recommendation.register()
    launch_command.register()
