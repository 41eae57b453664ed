"""Shared test helpers: real external tools are required in CI and skipped locally; a fabric
secret for tests that run control servers in this process."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from rocev2_emu.runtime import auth


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
