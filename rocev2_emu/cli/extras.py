"""The optional extras a flag needs, checked before a command starts anything.

``--ui`` (the fabric's map, served by starlette on hypercorn) needs the ``ui`` extra; a command
given it without the extra installed is refused in one line naming what to install, before any
node process starts (issue: a fabric of nine processes started, then died with a 40-line
traceback ending in ``No module named 'starlette'``).  The ``plot`` extra has no flag: a
scenario without matplotlib says "no plot: matplotlib absent" and goes on.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Final

EXTRAS: Final = {"ui": ("starlette", "hypercorn")}
FLAGS: Final = {"ui": "ui"}  # an argument (truthy when given) -> the extra it needs


class MissingExtra(ValueError):
    """A flag was given whose extra is not installed."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that are not installed."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def check(args: argparse.Namespace) -> None:
    """Refuse, in one line, a flag whose extra is not installed."""
    for flag, extra in FLAGS.items():
        if getattr(args, flag, None) and (absent := missing(extra)):
            raise MissingExtra(
                f"--{flag} needs the {extra} extra ({', '.join(absent)} not installed): "
                f"pip install 'rocev2-emu[{extra}]'"
            )
