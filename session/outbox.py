"""Messages waiting for one client: committed messages in order, the latest partial merged.

A client that reads slowly never stalls the model, the log or the meeting's listeners.
Partials merge (only the newest waits to be sent, and it is dropped once its utterance's
final is queued); every other message is kept in order up to `limit`. One more and the
outbox OVERFLOWS: the client is judged too slow, later puts are dropped (whoever puts
never fails: a final is still logged and published), and `overflowed()` raises
SlowConsumer, which ends the stream with 1008 `slow_consumer` (the client resumes and
gets the finals it missed replayed).
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable, Mapping

from store.records import FinalRecord
from wire import build
from wire.messages import ServerMessage


class SlowConsumer(Exception):
    """The client let more than `limit` committed messages pile up."""


class OutboxState(enum.Enum):
    OPEN = "open"
    OVERFLOWED = "overflowed"  # the client is too slow: puts are dropped
    CLOSED = "closed"  # no more puts; get() drains, then returns None


class Outbox:
    def __init__(self, limit: int, on_partial_dropped: Callable[[], None] | None = None) -> None:
        self._limit = limit
        self._on_partial_dropped = on_partial_dropped
        self._items: deque[str] = deque()
        self._partial: tuple[str, str] | None = None  # (utterance_id, message)
        self._ready = asyncio.Event()
        self._overflow = asyncio.Event()
        self.state = OutboxState.OPEN
        self.partials_merged = 0
        self.dropped = 0  # committed messages dropped after the overflow

    def put(self, message: str, *, utterance_id: str | None = None) -> None:
        """Queue a committed message. A final passes its utterance_id to drop its partial.
        Past `limit` unread messages the outbox overflows and drops this and later ones."""
        self._check_not_closed()
        if self.state is OutboxState.OPEN and len(self._items) >= self._limit:
            self.state = OutboxState.OVERFLOWED
            self._overflow.set()
        if self.state is OutboxState.OVERFLOWED:
            self.dropped += 1
            return
        if utterance_id is not None and self._partial and self._partial[0] == utterance_id:
            self._partial = None
            self._dropped_partial()
        self._items.append(message)
        self._ready.set()

    def put_partial(self, utterance_id: str, message: str) -> None:
        """Queue a partial, replacing any partial not yet sent."""
        self._check_not_closed()
        if self.state is OutboxState.OVERFLOWED:
            return
        if self._partial is not None:
            self._dropped_partial()
        self._partial = (utterance_id, message)
        self._ready.set()

    async def overflowed(self) -> None:
        """Return never; raise SlowConsumer once the outbox overflows."""
        await self._overflow.wait()
        raise SlowConsumer(f"client left more than {self._limit} messages unread")

    def _dropped_partial(self) -> None:
        self.partials_merged += 1
        if self._on_partial_dropped is not None:
            self._on_partial_dropped()

    def close(self) -> None:
        self.state = OutboxState.CLOSED
        self._ready.set()

    def close_with(self, message: str) -> None:
        """Drop what the client has not taken (it resumes for the finals) and close with
        one last message (the slow consumer's `error`)."""
        self._items.clear()
        self._partial = None
        self._items.append(message)
        self.close()

    async def get(self) -> str | None:
        """The next message to send; None once closed and drained."""
        while True:
            if self._items:
                return self._items.popleft()
            if self._partial is not None:
                message = self._partial[1]
                self._partial = None
                return message
            if self.state is OutboxState.CLOSED:
                return None
            self._ready.clear()
            await self._ready.wait()

    def _check_not_closed(self) -> None:
        if self.state is OutboxState.CLOSED:
            raise RuntimeError("outbox is closed")


class OutboxDelivery:
    """The live client's share of what the committer commits: its outbox, while open."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    def final(self, record: FinalRecord, payload: str) -> None:
        if self._outbox.state is OutboxState.OPEN:
            self._outbox.put(payload, utterance_id=record.utterance_id)

    def message(self, message: ServerMessage) -> None:
        if self._outbox.state is OutboxState.OPEN:
            self._outbox.put(build.encode(message))

    def relabelled(self, speakers: Mapping[str, str]) -> None:
        return None  # the client hears of it in the `transcript.speaker` messages
