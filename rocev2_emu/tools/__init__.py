"""User tools over the verbs API: perftest (ib_write_bw and friends) and the datagram
benchmarks of ``rocev2-emu bench``."""
