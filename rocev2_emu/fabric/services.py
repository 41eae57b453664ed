"""Host services by name: what layers above the fabric add to every host process.

The fabric never imports the packages that build on it.  Instead they register here: a
service is a factory that, given the topology, the host's verbs context, its name and its
Prometheus registry, returns a handler for one more command of the host agent.  The
collectives register ``collective`` this way (:mod:`collectives.plugin`); the CLI loads every
installed plugin (the ``rocev2_emu.plugins`` entry point group) before it runs a command, so a
host started by ``rocev2-emu node`` serves them too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from rocev2_emu.topology.model import Topology
    from rocev2_emu.verbs.api import Context

PLUGIN_GROUP = "rocev2_emu.plugins"

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
ServiceFactory = Callable[["Topology", "Context", str, "CollectorRegistry"], Handler]

HOST_SERVICES: dict[str, ServiceFactory] = {}


def host_service(command: str) -> Callable[[ServiceFactory], ServiceFactory]:
    """Register a factory for the host agent's ``command``."""

    def register(factory: ServiceFactory) -> ServiceFactory:
        HOST_SERVICES[command] = factory
        return factory

    return register


def load_plugins() -> list[str]:
    """Call every installed ``rocev2_emu.plugins`` entry point once; the names loaded."""
    loaded = []
    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()()
        loaded.append(ep.name)
    return loaded
