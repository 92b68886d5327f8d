"""The set of live sessions: admission against a bound, and draining on shutdown.

This is the only server-wide view of sessions. It holds references to actors, never
per-connection settings; each actor owns its own state.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
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
    def __init__(self, max_sessions: int, resume_headroom: float = 0.0) -> None:
        """`resume_headroom`: the share of `max_sessions` resumed streams may use past it."""
        self._max_sessions = max_sessions
        self._max_resumed = max_sessions + max(1, math.ceil(max_sessions * resume_headroom))
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

    def full(self) -> str | None:
        """Why a new session would be refused now (draining, or at capacity), or None."""
        if self.state is RegistryState.DRAINING:
            return "server is shutting down"
        if len(self._sessions) + self._waiting >= self._max_sessions:
            return f"server is at capacity ({self._max_sessions} streams); retry later"
        return None

    def check_room(self, *, resumed: bool = False) -> None:
        """Raise AdmissionRefused if a session would not be admitted now. The overflow
        rule: a resumed one (its node died, or its connection broke) is admitted up to
        the resume headroom past `max_sessions`, so a dead node's streams land on the
        survivors; past that it is refused too and retries through the balancer."""
        reason = self.full()
        if reason is None or (
            resumed and self.state is RegistryState.OPEN and len(self._sessions) < self._max_resumed
        ):
            return
        raise AdmissionRefused(reason)

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

    def admit(self, actor: SessionActor, *, resumed: bool = False) -> None:
        """Admit `actor`. A resumed source takes over: the connection this node still
        serves for it (half-open, or not yet timed out) is superseded now, closed 4409."""
        self.check_room(resumed=resumed)
        self.supersede(actor.meeting_id, actor.session_id, keep=actor)
        self._sessions.add(actor)
        self._empty.clear()

    def supersede(self, meeting_id: str, session_id: str, keep: SessionActor | None = None) -> int:
        """Close (4409) this node's connections of the source, but `keep`: it was resumed
        here or on another node. How many there were."""
        found = 0
        for old in self._sessions:
            if old is not keep and old.session_id == session_id and old.meeting_id == meeting_id:
                logger.info("source %s resumed: superseding its old connection", old.session_id)
                old.supersede()
                found += 1
        return found

    def start_draining(self) -> None:
        """Refuse new sessions from now on (`/readyz` says so); the sessions go on."""
        self.state = RegistryState.DRAINING
        self.draining.set()

    def release(self, actor: SessionActor) -> None:
        self._sessions.discard(actor)
        if not self._sessions:
            self._empty.set()

    async def drain(self, timeout: float) -> bool:
        """Refuse new sessions, ask every session to finish, wait up to `timeout`."""
        self.start_draining()
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
