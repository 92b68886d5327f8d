"""The set of live sessions: admission against a bound, and draining on shutdown.

This is the only server-wide view of sessions. It holds references to actors, never
per-connection settings; each actor owns its own state.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Iterator

from session.actor import SessionActor

logger = logging.getLogger(__name__)


class RegistryState(enum.Enum):
    OPEN = "open"
    DRAINING = "draining"


class AdmissionRefused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SessionRegistry:
    def __init__(self, max_sessions: int) -> None:
        self._max_sessions = max_sessions
        self._sessions: set[SessionActor] = set()
        self._empty = asyncio.Event()
        self._empty.set()
        self._waiting = 0  # accepted sockets not yet sessions (configuring themselves)
        self.draining = asyncio.Event()  # set once the drain begins
        self.state = RegistryState.OPEN

    def __len__(self) -> int:
        return len(self._sessions)

    def sessions(self) -> list[SessionActor]:
        return list(self._sessions)

    @property
    def meetings(self) -> int:
        return len({s.meeting_id for s in self._sessions})

    def check_room(self) -> None:
        """Raise AdmissionRefused if a new session would not be admitted now."""
        if self.state is RegistryState.DRAINING:
            raise AdmissionRefused("server is shutting down")
        if len(self._sessions) + self._waiting >= self._max_sessions:
            raise AdmissionRefused(
                f"server is at capacity ({self._max_sessions} streams); retry later"
            )

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A socket accepted before its session starts (a realtime session configures
        itself by messages first): it must find room now, and holds a place meanwhile."""
        self.check_room()
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1

    def admit(self, actor: SessionActor) -> None:
        """Admit `actor`. A resumed source takes over: the connection this node still
        serves for it (half-open, or not yet timed out) is superseded now, closed 4409."""
        self.check_room()
        for old in self._sessions:
            if old.session_id == actor.session_id and old.meeting_id == actor.meeting_id:
                logger.info("source %s resumed: superseding its old connection", old.session_id)
                old.supersede()
        self._sessions.add(actor)
        self._empty.clear()

    def release(self, actor: SessionActor) -> None:
        self._sessions.discard(actor)
        if not self._sessions:
            self._empty.set()

    async def drain(self, timeout: float) -> bool:
        """Refuse new sessions, ask every session to finish, wait up to `timeout`."""
        self.state = RegistryState.DRAINING
        self.draining.set()
        for actor in list(self._sessions):
            actor.request_shutdown()
        try:
            await asyncio.wait_for(self._empty.wait(), timeout)
        except TimeoutError:
            logger.warning(
                "%d sessions still open after %.1f s drain", len(self._sessions), timeout
            )
            return False
        return True
