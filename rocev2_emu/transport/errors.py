"""Errors of the transport core and the verbs API built on it, split as h11 splits them.

:class:`LocalVerbsError`: the caller misused the API (a missing attribute, a post on a RESET
QP, an SGE outside its MR).  :class:`RemoteVerbsError`: the peer or the network failed us
(retries exhausted, a dead peer, a passed deadline).  :mod:`rocev2_emu.verbs` re-exports both.
"""

from __future__ import annotations


class VerbsError(Exception):
    """Base class of errors raised by the verbs-like API."""


class LocalVerbsError(VerbsError):
    """The caller misused the API (wrong state, missing attribute, bad SGE, ...)."""


class RemoteVerbsError(VerbsError):
    """A remote or network failure surfaced to the caller (dead peer, deadline passed, ...)."""
