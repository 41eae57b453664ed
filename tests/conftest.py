"""Shared test helpers: real external tools are required in CI and skipped locally."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str, install: str) -> str:
    """Path of ``name``; fail under CI=true (it must be there), skip elsewhere."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed ({install})"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; .ci/run installs it", pytrace=False)
        pytest.skip(message)
    return path
