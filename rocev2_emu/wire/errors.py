"""The one exception type the codecs raise for bytes from the network.

Following h11 and trio's ``_untrusted`` convention: every decoder of untrusted bytes raises
exactly :class:`MalformedFrame`, whose message names the field and the values; drivers count the
drop by ``reason`` and carry on.
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
