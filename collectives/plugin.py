"""How the collectives plug into the host side, which never imports them.

``rocev2_emu`` loads the ``rocev2_emu.plugins`` entry points (pyproject.toml names
:func:`register`) before it runs a command.  Registering adds: the host agent's
``collective`` command (:mod:`rocev2_emu.fabric.services`), the ``bench`` kinds all-reduce,
all-gather, reduce-scatter and broadcast and the all-reduce demo (:mod:`collectives.cli`), and
the ``straggler``, ``ecmp-entropy``, ``admission`` and ``spine-failure`` scenarios
(:mod:`collectives.straggler`, :mod:`collectives.entropy`, :mod:`collectives.admission`,
:mod:`collectives.spine_failure`) and ``launch``
(:mod:`collectives.launcher`).
"""

from __future__ import annotations

from collectives import admission, cli, entropy, launcher, spine_failure, straggler
from collectives.job import collective_handler
from rocev2_emu.fabric.services import host_service


def register() -> None:
    host_service("collective")(collective_handler)
    cli.register()
    straggler.register()
    entropy.register()
    admission.register()
    spine_failure.register()
    launcher.register()
