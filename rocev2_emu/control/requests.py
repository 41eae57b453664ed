"""Control requests as types: each command a small frozen dataclass, decoded and checked in one
place, and each server one table from command to (request type, handler).

A control message (:mod:`rocev2_emu.control.channel` carries them, msgpack maps) is
``{"cmd": NAME, field: value, ...}``.  :func:`decode` builds the command's dataclass from it:
every field present (or defaulted) and of its annotated type - ``int`` (not a bool), ``float``
(an int is taken), ``bool``, ``str``, ``list``, ``dict`` or ``Any``, each maybe ``| None`` -
unknown fields refused, then
the class's own ``__post_init__`` checks.  A failure is a :class:`RequestError` naming the
command and the field.  :func:`serve_table` answers a message from a :data:`Table`: an unknown
command, a bad field or a handler's ValueError become ``{"error": ...}`` replies, never an
exception in the server (DEVELOPERS.md: no process dies from what a client sends).

The tables are listed in docs/architecture.md ("Control requests"), which a test keeps equal
to the code (:func:`describe`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

R = TypeVar("R")
Handler = Callable[[Any], Awaitable[dict[str, Any]]]
Table = dict[str, tuple[type[Any], Handler]]  # command -> (request dataclass, handler)

_CHECKS: dict[Any, Callable[[Any], bool]] = {
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    bool: lambda v: isinstance(v, bool),
    str: lambda v: isinstance(v, str),
    list: lambda v: isinstance(v, list | tuple),
    dict: lambda v: isinstance(v, dict),
    Any: lambda v: True,
}


@dataclasses.dataclass(frozen=True, slots=True)
class NoFields:
    """The request of a command that takes no field (``stop``, ``map``, ``engine``)."""


class RequestError(ValueError):
    """A control request that cannot be served as sent; the message names the field."""


def _kind(annotation: Any) -> tuple[Any, bool]:
    """The type a field's value is checked against, and whether None is allowed."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    if optional:
        (annotation,) = [a for a in args if a is not type(None)]
    origin = typing.get_origin(annotation)
    return (origin if origin in (list, dict) else annotation), optional


def decode(cls: type[R], cmd: str, msg: dict[str, Any]) -> R:
    """The request ``cls`` from the message ``msg`` of command ``cmd`` (RequestError: what is
    wrong, naming the field)."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    unknown = sorted(set(msg) - {"cmd"} - {f.name for f in fields})
    if unknown:
        raise RequestError(f"{cmd}: unknown field(s) {', '.join(map(str, unknown))}")
    values: dict[str, Any] = {}
    for f in fields:
        if f.name not in msg:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RequestError(f"{cmd}.{f.name}: missing")
            continue
        value, (kind, optional) = msg[f.name], _kind(hints[f.name])
        if value is None and optional:
            values[f.name] = None
            continue
        if not _CHECKS[kind](value):
            want = getattr(kind, "__name__", str(kind))
            raise RequestError(f"{cmd}.{f.name}: {value!r} is not {want}")
        values[f.name] = float(value) if kind is float else value
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise RequestError(f"{cmd}: {exc}") from None


async def serve_table(table: Table, msg: Any) -> dict[str, Any]:
    """The reply to ``msg`` from ``table``: the handler's, or ``{"error": ...}``."""
    cmd = msg.get("cmd") if isinstance(msg, dict) else None
    if not isinstance(cmd, str) or cmd not in table:
        known = ", ".join(sorted(table))
        return {"error": f"unknown command {cmd!r} (known: {known})"}
    cls, handler = table[cmd]
    try:
        return await handler(decode(cls, cmd, msg))
    except ValueError as exc:  # RequestError, and a handler's own refusal of a value
        return {"error": f"{cmd}: {exc}" if not isinstance(exc, RequestError) else str(exc)}


def describe(table: Table) -> list[str]:
    """One line per command: ``name(field: type, field: type = default)``, sorted."""
    lines = []
    for cmd in sorted(table):
        cls = table[cmd][0]
        hints = typing.get_type_hints(cls)
        parts = []
        for f in dataclasses.fields(cls):
            kind, optional = _kind(hints[f.name])
            text = f"{f.name}: {getattr(kind, '__name__', 'any')}" + (" | None" if optional else "")
            if f.default is not dataclasses.MISSING:
                text += f" = {f.default!r}"
            parts.append(text)
        lines.append(f"{cmd}({', '.join(parts)})")
    return lines
