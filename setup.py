"""Builds the protocol cores with mypyc (pyproject.toml: ``[tool.rocev2-emu] compiled-cores``).

The cores stay the typed Python they are; where mypyc, a C compiler and Python's headers are
present, installing the package compiles them into one C extension group (the library
``rocev2_emu._cores__mypyc`` and a small module beside each source).  The build writes
``rocev2_emu/_cores.json``: each compiled module with the SHA-256 of the source it was built
from, which :mod:`rocev2_emu.cores` checks at import so that an edited ``.py`` is never shadowed
by a stale compiled module.  Where compiling is impossible, or ``ROCEV2_EMU_PURE=1`` is set, the
same modules install as Python (the pure build) and the build says why in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
GROUP = "rocev2_emu._cores"  # the shared library is rocev2_emu/_cores__mypyc.*.so
MANIFEST = "rocev2_emu/_cores.json"


def _say(message: str) -> None:
    print(f"rocev2-emu build: {message}", file=sys.stderr)


def _cores() -> list[str]:
    with open(HERE / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["rocev2-emu"]["compiled-cores"])


def _manifest(sources: list[str], mypy_version: str) -> dict[str, Any]:
    return {
        "compiler": f"mypyc {mypy_version}",
        "python": sys.implementation.cache_tag,
        "modules": {
            src[:-3].replace("/", "."): hashlib.sha256((HERE / src).read_bytes()).hexdigest()
            for src in sources
        },
    }


class BuildCores(build_ext):
    """build_ext that falls back to the pure build when the C compiler fails, and writes the
    manifest of what it compiled next to the modules (in place for an editable install)."""

    manifest: dict[str, Any] | None = None

    def run(self) -> None:
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers: the pure build still works
            _say(f"compiling the cores failed ({exc}); installing them as Python (pure)")
            self.extensions = []
            return
        if self.manifest is not None:
            target = Path(self.get_ext_fullpath(GROUP + "__mypyc")).parent / Path(MANIFEST).name
            target.write_text(json.dumps(self.manifest, indent=1, sort_keys=True) + "\n")
            _say(f"compiled {len(self.manifest['modules'])} core modules; wrote {target}")

    def get_outputs(self) -> list[str]:
        outputs: list[str] = super().get_outputs()
        if self.extensions and self.manifest is not None:
            lib = Path(self.get_ext_fullpath(GROUP + "__mypyc")).parent
            outputs.append(str(lib / Path(MANIFEST).name))
        return outputs


def _extensions() -> list[Any]:
    """The mypyc extensions, or none (the pure build) with the reason said."""
    stale = HERE / MANIFEST
    if stale.exists():
        stale.unlink()  # a manifest describes one build; a new build writes its own
    if os.environ.get("ROCEV2_EMU_PURE") == "1":
        _say("ROCEV2_EMU_PURE=1: installing the cores as Python (pure)")
        return []
    try:
        import mypy.version
        from mypyc.build import mypycify
    except ImportError as exc:
        _say(f"mypyc is not available ({exc}); installing the cores as Python (pure)")
        return []
    sources = _cores()
    try:
        extensions = mypycify(
            sources, opt_level="3", debug_level="0", group_name=GROUP, strip_asserts=False
        )
    except (Exception, SystemExit) as exc:  # mypyc reports type errors by exiting
        _say(f"mypyc could not translate the cores ({exc!r}); installing them as Python (pure)")
        return []
    BuildCores.manifest = _manifest(sources, mypy.version.__version__)
    return list(extensions)


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildCores})
