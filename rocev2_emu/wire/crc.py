"""CRC-32 (IEEE 802.3 polynomial, as zlib computes it) for the RoCEv2 ICRC.

The ICRC is computed over every byte of every packet on both ends, so it is the largest single
cost of the data path.  ISA-L's SIMD implementation (the ``isal`` package, Intel ISA-L bindings
maintained by the pycompression project) is about 8x faster than zlib's on 4 KiB; it is a
dependency, and zlib is the fallback on platforms without an isal wheel.  Both give identical
results (the check value of "123456789" is 0xcbf43926).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final


def _platform() -> tuple[Callable[..., int], str]:
    try:
        from isal.isal_zlib import crc32 as isal_crc32

        return isal_crc32, "isal"
    except ImportError:  # pragma: no cover - depends on the platform's wheels
        from zlib import crc32 as zlib_crc32

        return zlib_crc32, "zlib"


# Final: a compiled module that calls crc32 (every frame built or checked) reads a C static,
# not the importing module's globals dict
_CHOSEN: Final = _platform()
crc32: Final[Callable[..., int]] = _CHOSEN[0]
IMPLEMENTATION: Final = _CHOSEN[1]
