"""Meeting context: the finals log, its gap-free `seq`, and live event fan-out.

`Store` is the interface the sessions and routes use; `MemoryStore` is the embedded
single-node default. A Redis implementation keeps the same semantics across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from session.protocol import TranscriptFinal, Word

SUBSCRIBER_QUEUE = 256  # events buffered per listener before it is judged too slow


@dataclass(frozen=True, slots=True)
class NewFinal:
    """A final transcript before the store has given it its `seq`."""

    utterance_id: str
    session_id: str
    participant: str
    text: str
    start: float
    end: float
    language: str
    words: list[Word] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FinalRecord:
    """A final as logged: `seq` is per meeting, starts at 1, and has no gaps."""

    seq: int
    utterance_id: str
    session_id: str
    participant: str
    text: str
    start: float
    end: float
    language: str
    words: list[Word] = field(default_factory=list)

    @classmethod
    def from_new(cls, seq: int, final: NewFinal) -> FinalRecord:
        return cls(seq=seq, **asdict(final))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinalRecord:
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def message(self) -> TranscriptFinal:
        msg: TranscriptFinal = {
            "type": "transcript.final",
            "utterance_id": self.utterance_id,
            "seq": self.seq,
            "participant": self.participant,
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "language": self.language,
        }
        if self.words:
            msg["words"] = self.words
        return msg


class SubscriberLagged(Exception):
    """A listener fell more than SUBSCRIBER_QUEUE events behind and was dropped."""


class Store(Protocol):
    async def append_final(self, meeting_id: str, final: NewFinal) -> FinalRecord:
        """Give the final the meeting's next `seq` and append it to the log, atomically."""
        ...

    async def finals(self, meeting_id: str, after_seq: int = 0) -> list[FinalRecord]:
        """The meeting's finals with `seq` > after_seq, in `seq` order."""
        ...

    async def last_seq(self, meeting_id: str) -> int:
        """The highest `seq` given in the meeting so far, 0 if none."""
        ...

    async def publish(self, meeting_id: str, event: bytes) -> None:
        """Send one encoded server message to every listener of the meeting."""
        ...

    def subscribe(
        self, meeting_id: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Listen to the meeting's events from now on. The iterator raises SubscriberLagged
        if the listener falls too far behind."""
        ...

    async def ping(self) -> None:
        """Raise if the store cannot be reached."""
        ...

    async def close(self) -> None: ...


@dataclass
class _Meeting:
    finals: list[FinalRecord] = field(default_factory=list)
    listeners: set[asyncio.Queue[bytes | None]] = field(default_factory=set)


class MemoryStore:
    """In-process store for a single node. Everything is lost when the process exits."""

    def __init__(self) -> None:
        self._meetings: dict[str, _Meeting] = {}

    def _meeting(self, meeting_id: str) -> _Meeting:
        return self._meetings.setdefault(meeting_id, _Meeting())

    async def append_final(self, meeting_id: str, final: NewFinal) -> FinalRecord:
        meeting = self._meeting(meeting_id)
        record = FinalRecord.from_new(len(meeting.finals) + 1, final)
        meeting.finals.append(record)
        return record

    async def finals(self, meeting_id: str, after_seq: int = 0) -> list[FinalRecord]:
        meeting = self._meetings.get(meeting_id)
        return [] if meeting is None else meeting.finals[after_seq:]

    async def last_seq(self, meeting_id: str) -> int:
        meeting = self._meetings.get(meeting_id)
        return 0 if meeting is None else len(meeting.finals)

    async def publish(self, meeting_id: str, event: bytes) -> None:
        meeting = self._meetings.get(meeting_id)
        if meeting is None:
            return
        for queue in list(meeting.listeners):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                # Too slow: drop this listener, never block the publisher.
                meeting.listeners.discard(queue)
                _close_queue(queue)

    @contextlib.asynccontextmanager
    async def subscribe(self, meeting_id: str) -> AsyncIterator[AsyncIterator[bytes]]:
        meeting = self._meeting(meeting_id)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        meeting.listeners.add(queue)
        try:
            yield _drain(queue)
        finally:
            meeting.listeners.discard(queue)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        for meeting in self._meetings.values():
            for queue in meeting.listeners:
                _close_queue(queue)
            meeting.listeners.clear()


def _close_queue(queue: asyncio.Queue[bytes | None]) -> None:
    """Mark a listener's queue as dropped: make room for the sentinel and put it."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(None)


async def _drain(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while True:
        event = await queue.get()
        if event is None:
            raise SubscriberLagged("listener fell too far behind and was dropped")
        yield event
