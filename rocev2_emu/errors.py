"""Exception types shared by the codecs, the transport core and the verbs API.

Following h11: decoders of untrusted bytes raise exactly one type, :class:`MalformedFrame`, whose
message names the field and the values; verbs errors split into :class:`LocalVerbsError` (the
caller misused the API: a missing attribute, a post on a RESET QP, an SGE outside its MR) and
:class:`RemoteVerbsError` (the peer or the network failed us: retries exhausted, a dead peer).
"""

from __future__ import annotations


class MalformedFrame(ValueError):
    """Bytes from the network that are not a frame we accept.

    ``reason`` is a short machine-readable drop reason (``"truncated"``, ``"ipv4_checksum"``,
    ``"icrc"``, ...) that drivers use as a counter label; the message is for humans.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class VerbsError(Exception):
    """Base class of errors raised by the verbs-like API."""


class LocalVerbsError(VerbsError):
    """The caller misused the API (wrong state, missing attribute, bad SGE, ...)."""


class RemoteVerbsError(VerbsError):
    """A remote or network failure surfaced to the caller (dead peer, deadline passed, ...)."""
