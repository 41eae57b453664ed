"""A process's end of the coordinator's connection, for tests: it keeps what it was sent."""

from __future__ import annotations


class Outbox:
    """Records every message sent to it, in order; a send never waits."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send(self, msg: dict[str, object]) -> bool:
        self.sent.append(msg)
        return False
