"""pcap capture of what an endpoint sends and receives.

Writes the classic libpcap format with nanosecond timestamps (magic 0xa1b23c4d, version 2.4,
LINKTYPE_ETHERNET = 1), one record per Ethernet frame (the VXLAN header is stripped, as a port
mirror would see the wire).  Timestamps are *emulated* time, so a capture of a time-dilated run
shows the datacenter's microseconds, not the wall clock's.  Wireshark and tshark decode the
frames with their own RoCE (``infiniband``) and PFC dissectors.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Final

PCAP_MAGIC_NS: Final = 0xA1B23C4D
LINKTYPE_ETHERNET: Final = 1
# magic(32) | major(16) | minor(16) | thiszone(32) | sigfigs(32) | snaplen(32) | linktype(32)
PCAP_GLOBAL: Final = struct.Struct("<IHHiIII")
# ts_sec(32) | ts_nsec(32) | incl_len(32) | orig_len(32)
PCAP_RECORD: Final = struct.Struct("<IIII")
SNAPLEN: Final = 65535


class PcapWriter:
    """Append Ethernet frames with emulated timestamps to a pcap file."""

    def __init__(self, path: str | Path, *, epoch: float = 0.0) -> None:
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._epoch = epoch
        self._file.write(PCAP_GLOBAL.pack(PCAP_MAGIC_NS, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))
        self.frames = 0

    def write(self, now: float, frame: bytes | bytearray | memoryview, length: int = -1) -> None:
        """Record ``frame`` (Ethernet, no FCS) at emulated time ``now`` seconds; ``length``: its
        length on the wire when the frame is shorter (a timing-only run's headers), which
        pcap keeps as the original length - Wireshark shows it as a capture cut short."""
        ns = round((now + self._epoch) * 1e9)
        sec, nsec = divmod(max(ns, 0), 1_000_000_000)
        n = max(len(frame), length)
        incl = min(len(frame), SNAPLEN)
        self._file.write(PCAP_RECORD.pack(sec, nsec, incl, n))
        self._file.write(memoryview(frame)[:incl])
        self.frames += 1

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_pcap(path: str | Path) -> list[tuple[float, bytes]]:
    """Read back (timestamp seconds, frame) pairs from a file written by :class:`PcapWriter`."""
    data = Path(path).read_bytes()
    magic, _maj, _min, _tz, _sig, _snap, linktype = PCAP_GLOBAL.unpack_from(data, 0)
    if magic != PCAP_MAGIC_NS or linktype != LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: not a nanosecond Ethernet pcap (magic 0x{magic:08x})")
    out = []
    pos = PCAP_GLOBAL.size
    while pos + PCAP_RECORD.size <= len(data):
        sec, nsec, incl, _orig = PCAP_RECORD.unpack_from(data, pos)
        pos += PCAP_RECORD.size
        out.append((sec + nsec / 1e9, data[pos : pos + incl]))
        pos += incl
    return out
