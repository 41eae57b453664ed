"""The ``torch.backends`` entry point: registers ``rocev2`` whenever torch is imported.

torch calls :func:`autoload` from inside ``import torch``, so this module imports nothing of
ours at import time (``import collectives.pytorch`` may be what is importing torch), and a
failure here is logged, never raised: it must not break ``import torch`` in an environment that
has the ``torch`` extra installed.  The creator loads :mod:`collectives.pytorch` on first use.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

log = logging.getLogger(__name__)


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    from collectives.pytorch import _create as create

    return create(store, rank, size, timeout)


def autoload() -> None:
    try:
        import torch.distributed as dist

        if "ROCEV2" not in dist.Backend._plugins:
            dist.Backend.register_backend("rocev2", _create, devices=["cpu"])
    except Exception as exc:  # torch's import must go on
        log.warning("rocev2 torch backend not registered: %s", exc)
