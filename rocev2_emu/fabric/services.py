"""Host services by name: what layers above the fabric add to every host process.

The fabric never imports the packages that build on it.  Instead they register here: a
service is one more command of the host agent, with its request type (a frozen dataclass,
decoded and checked by :mod:`rocev2_emu.control.requests`) and a factory that, given the
topology, the host's verbs context, its name and its Prometheus registry, returns the handler
of that typed request.  The
collectives register ``collective`` this way (:mod:`collectives.plugin`); the CLI loads every
installed plugin (the ``rocev2_emu.plugins`` entry point group) before it runs a command, so a
host started by ``rocev2-emu node`` serves them too.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from rocev2_emu.control.requests import Handler, Table

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from rocev2_emu.topology.model import Topology
    from rocev2_emu.verbs.api import Context

PLUGIN_GROUP = "rocev2_emu.plugins"

ServiceFactory = Callable[["Topology", "Context", str, "CollectorRegistry"], Handler]

HOST_SERVICES: dict[str, tuple[type[Any], ServiceFactory]] = {}


def host_service(command: str, request: type[Any]) -> Callable[[ServiceFactory], ServiceFactory]:
    """Register the host agent's ``command``: its ``request`` type and the handler's factory."""

    def register(factory: ServiceFactory) -> ServiceFactory:
        HOST_SERVICES[command] = (request, factory)
        return factory

    return register


def host_services(topo: Topology, ctx: Context, name: str, registry: CollectorRegistry) -> Table:
    """The registered services of host ``name``, as rows of its agent's table."""
    return {
        cmd: (request, make(topo, ctx, name, registry))
        for cmd, (request, make) in HOST_SERVICES.items()
    }


def load_plugins() -> list[str]:
    """Call every installed ``rocev2_emu.plugins`` entry point once; the names loaded."""
    loaded = []
    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()()
        loaded.append(ep.name)
    return loaded
