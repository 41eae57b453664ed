"""Which build of the protocol cores this process runs: ``compiled`` (mypyc) or ``pure``.

The cores (pyproject.toml, ``[tool.rocev2-emu] compiled-cores``: wire, transport, cc, the NIC
core, the switch pipeline, the event engine's heap, the collectives' ring operation and links) are
compiled by ``setup.py`` at install where a C compiler exists; the build leaves
``_cores.json`` beside this file naming each compiled module and the SHA-256 of the source it
came from.  On the first import of ``rocev2_emu``, ``switch`` or ``collectives`` this module
decides, once, for the whole process:

* ``ROCEV2_EMU_PURE=1``, no manifest (nothing was compiled), a manifest for another Python, or a
  compiled module whose library is missing: the pure build, silently (it is what was asked for,
  or all there is).
* a source that differs from what was compiled (an edited ``.py``): the pure build, with one
  line on stderr naming the file and how to recompile (``pip install -e .``).  All or nothing:
  compiled modules call each other natively, so one stale module sends every one back to Python.

"Pure" is enforced, not hoped for: a finder placed first on ``sys.meta_path`` loads every
module of the three packages from its ``.py``, so an extension module left on disk by an earlier
build is never imported.  ``rocev2-emu --version`` prints the outcome (``cores: compiled`` or
``cores: pure``) and why.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Final

PURE_ENV: Final = "ROCEV2_EMU_PURE"
MANIFEST: Final = Path(__file__).with_name("_cores.json")
_PACKAGES: Final = ("rocev2_emu", "switch", "collectives")


class SourceFirst(importlib.machinery.PathFinder):
    """Finds the modules of this project's packages as ``.py`` files only."""

    @classmethod
    def find_spec(
        cls,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in _PACKAGES or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def decide(manifest_path: Path, environ: Mapping[str, str]) -> tuple[str, str]:
    """(``compiled`` or ``pure``, why), from the environment and the build's manifest (the
    package directory is the manifest's)."""
    if environ.get(PURE_ENV) == "1":
        return "pure", f"{PURE_ENV}=1"
    try:
        manifest = json.loads(manifest_path.read_text())
        modules: dict[str, str] = manifest["modules"]
        compiler = str(manifest["compiler"])
        python = manifest["python"]
    except FileNotFoundError:
        return "pure", "not compiled at install (no C compiler, or mypyc absent)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return "pure", f"unreadable build manifest {manifest_path}: {exc}"
    if python != sys.implementation.cache_tag:
        return "pure", f"compiled for {python}, this is {sys.implementation.cache_tag}"
    root = manifest_path.parent.parent
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name, digest in sorted(modules.items()):
        source = root.joinpath(*name.split(".")).with_suffix(".py")
        try:
            now = hashlib.sha256(source.read_bytes()).hexdigest()
        except OSError:
            return "pure", f"{source} is missing"
        if now != digest:
            _warn_stale(source)
            return "pure", f"{source.relative_to(root)} changed since it was compiled"
        if not source.with_suffix(suffix).exists():
            return "pure", f"the compiled {name} is missing"
    return "compiled", compiler


def _warn_stale(source: Path) -> None:
    sys.stderr.write(
        f"rocev2-emu: {source} changed since the cores were compiled; running the pure-Python "
        "cores (slower). Recompile with: pip install -e .  (or set ROCEV2_EMU_PURE=1 to "
        "silence this)\n"
    )


BUILD, WHY = decide(MANIFEST, os.environ)
if BUILD == "pure" and not any(f is SourceFirst for f in sys.meta_path):
    sys.meta_path.insert(0, SourceFirst)


def describe() -> str:
    """One line for ``--version``: ``cores: compiled (mypyc 2.4.1)`` or ``cores: pure (...)``."""
    return f"cores: {BUILD} ({WHY})"
