"""Collectives (ring and hierarchical all-reduce) over the verbs API - not built yet.

This package is reserved by the project layout; the collectives issue fills it.  It will use
only :mod:`rocev2_emu.verbs.api` and :mod:`rocev2_emu.verbs.oob`, never the transport internals.
"""
