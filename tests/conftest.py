"""Shared test helpers: real external tools are required in CI and skipped locally; a fabric
secret for tests that run control servers in this process."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocev2_emu.control import auth


@pytest.fixture
def fabric_secret() -> Iterator[bytes]:
    """A fresh fabric secret for this process's control servers and clients, forgotten after."""
    secret = auth.new()
    auth.use(secret)
    try:
        yield secret
    finally:
        auth.use(None)


def require_tool(name: str, install: str) -> str:
    """Path of ``name``; fail under CI=true (it must be there), skip elsewhere."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed ({install})"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; .ci/run installs it", pytrace=False)
        pytest.skip(message)
    return path


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    """``path`` is a PNG image of a plot: the signature, an IHDR chunk with a real size, and
    more than a blank canvas's bytes (matplotlib is the ``plot`` extra, in the test install)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path}: not a PNG"
    assert data[12:16] == b"IHDR", f"{path}: no IHDR chunk"
    width, height = struct.unpack("!II", data[16:24])
    assert width >= 400 and height >= 200, (path, width, height)
    assert len(data) > 20_000, f"{path}: {len(data)} bytes, an empty figure?"
