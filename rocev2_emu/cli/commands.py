"""The registry of ``rocev2-emu`` commands: each command group's module registers its own.

A :class:`Command` names a subcommand, its one-line help, how to add its arguments and how to
run it.  :mod:`rocev2_emu.cli` builds the parser from :data:`COMMANDS` in registration order,
so a plugin (:mod:`rocev2_emu.fabric.services`) adds commands the same way the built-in groups
do.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


COMMANDS: dict[str, Command] = {}


def register(command: Command) -> Command:
    COMMANDS[command.name] = command
    return command
