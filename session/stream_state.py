"""A live stream's states, what it counts, and what it needs of its socket."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol


class Connection(Protocol):
    """What the actor needs of a WebSocket (Starlette's satisfies it)."""

    async def receive(self) -> Any: ...
    async def send_text(self, data: str) -> None: ...
    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


class SessionState(enum.Enum):
    CONNECTING = "connecting"
    STREAMING = "streaming"
    DRAINING = "draining"  # no more audio; finishing finals
    CLOSED = "closed"


TRANSITIONS = {
    SessionState.CONNECTING: {SessionState.STREAMING, SessionState.CLOSED},
    SessionState.STREAMING: {SessionState.DRAINING, SessionState.CLOSED},
    SessionState.DRAINING: {SessionState.CLOSED},
    SessionState.CLOSED: set(),
}


@dataclass(frozen=True, slots=True)
class SessionTotals:
    audio_samples: int = 0
    utterances: int = 0
    finals: int = 0
    partials: int = 0
    partials_dropped: int = 0
    empty_finals: int = 0  # utterances the hallucination guard judged not to be speech
