"""The guard of the compiled cores (rocev2_emu/cores.py): what it decides from the build's
manifest, and that the pure build loads sources even beside a compiled module."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import sys
from pathlib import Path

import pytest

from rocev2_emu import cores


def _tree(tmp_path: Path, source: bytes, *, digest: str | None = None) -> Path:
    """A package ``pkg`` with one module, compiled (an extension beside it) per a manifest."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_bytes(source)
    (pkg / ("mod" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not really")
    manifest = pkg / "_cores.json"
    manifest.write_text(
        json.dumps(
            {
                "compiler": "mypyc 9.9",
                "python": sys.implementation.cache_tag,
                "modules": {"pkg.mod": digest or hashlib.sha256(source).hexdigest()},
            }
        )
    )
    return manifest


def test_a_manifest_that_matches_its_sources_means_compiled(tmp_path: Path) -> None:
    assert cores.decide(_tree(tmp_path, b"x = 1\n"), {}) == ("compiled", "mypyc 9.9")


def test_an_edited_source_falls_back_to_pure_and_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _tree(tmp_path, b"x = 2\n", digest=hashlib.sha256(b"x = 1\n").hexdigest())
    build, why = cores.decide(manifest, {})
    assert build == "pure" and why == "pkg/mod.py changed since it was compiled"
    err = capsys.readouterr().err
    assert "mod.py changed since the cores were compiled" in err and "pip install -e ." in err


def test_the_environment_no_manifest_or_another_python_mean_pure(tmp_path: Path) -> None:
    manifest = _tree(tmp_path, b"x = 1\n")
    assert cores.decide(manifest, {cores.PURE_ENV: "1"}) == ("pure", "ROCEV2_EMU_PURE=1")
    data = json.loads(manifest.read_text())
    data["python"] = "cpython-299"
    manifest.write_text(json.dumps(data))
    assert cores.decide(manifest, {})[1].startswith("compiled for cpython-299")
    manifest.write_text("{not json")
    assert cores.decide(manifest, {})[0] == "pure"
    manifest.unlink()
    assert cores.decide(manifest, {})[1].startswith("not compiled at install")


def test_a_missing_extension_means_pure(tmp_path: Path) -> None:
    manifest = _tree(tmp_path, b"x = 1\n")
    (manifest.parent / ("mod" + importlib.machinery.EXTENSION_SUFFIXES[0])).unlink()
    assert cores.decide(manifest, {}) == ("pure", "the compiled pkg.mod is missing")


def test_the_pure_finder_loads_the_source_beside_an_extension(tmp_path: Path) -> None:
    manifest = _tree(tmp_path, b"x = 1\n")
    spec = cores.SourceFirst.find_spec("rocev2_emu.mod", [str(manifest.parent)])
    assert spec is not None and spec.origin == str(manifest.parent / "mod.py")
    assert cores.SourceFirst.find_spec("numpy.mod", [str(manifest.parent)]) is None
