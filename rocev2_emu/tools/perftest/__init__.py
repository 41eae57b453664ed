"""perftest for the emulated NIC: write-bw, write-lat, send-bw and read-bw, server and client.

Behaves like linux-rdma/perftest's ib_write_bw, ib_write_lat, ib_send_bw and ib_read_bw: the
server is started without a host, the client with the server's address; the two exchange QPN,
PSN, GID, rkey and address over TCP (msgpack, :mod:`rocev2_emu.verbs.oob`), print perftest's
local/remote address lines, run the test and print perftest's table.  All figures are in
emulated time (the header states the TDF), so they describe the configured datacenter link, not
the Python process.  MB/sec means 2^20 bytes per second, as in perftest; --report_gbits gives
Gbit/s (10^9).
"""

from __future__ import annotations

from rocev2_emu.tools.perftest.options import PerftestError, PerftestOptions
from rocev2_emu.tools.perftest.report import wait_until_listening
from rocev2_emu.tools.perftest.session import run

__all__ = ["PerftestError", "PerftestOptions", "run", "wait_until_listening"]
