"""What the Redis store holds while Redis cannot be reached.

Finals (and new sources of meetings this node already serves) go into a bounded
in-process buffer with a provisional `seq`, taken from the last `seq` this node knows
(`SeqCache`); one background task replays the buffer in order once Redis answers. The
replay script keeps the provisional `seq` unless Redis already holds a higher one (another
node wrote the meeting meanwhile): the final is then re-sequenced after it, so the log
stays gap-free and duplicate-free. docs/store.md spells out the trade-off.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from store.cancel import cancel_and_wait
from store.errors import StoreOverloaded, StoreUnavailable
from store.records import FinalRecord, NewFinal, SourceState
from store.redis.link import UNREACHABLE, Link, log_crash

logger = logging.getLogger(__name__)

SEQ_CACHE = 100_000  # meetings whose last seq this node remembers (LRU)


@dataclass(frozen=True, slots=True)
class PendingFinal:
    meeting_id: str
    record: FinalRecord  # carries the provisional seq the caller was given
    source: SourceState
    now: float


@dataclass(frozen=True, slots=True)
class PendingSource:
    meeting_id: str
    state: SourceState
    digest: str
    config: bytes
    now: float


Pending = PendingFinal | PendingSource


class SeqCache:
    """The last `seq` this node knows of each meeting (LRU), and the meetings whose last
    append was cut short: for those, Redis may hold a seq we never heard of."""

    def __init__(self) -> None:
        self._seqs: OrderedDict[str, int] = OrderedDict()
        self._uncertain: set[str] = set()

    def remember(self, meeting_id: str, seq: int, *, replaces: bool = False) -> None:
        """Note a seq given in the meeting. `replaces`: it is Redis' last seq, read under
        the meeting's lock with nothing of it buffered, so it replaces what we had (a
        meeting id reused after expiry starts again at 1)."""
        if seq > self._seqs.get(meeting_id, -1) or replaces:
            self._seqs[meeting_id] = seq
        self._uncertain.discard(meeting_id)  # any seq from Redis settles the doubt
        self._seqs.move_to_end(meeting_id)
        if len(self._seqs) > SEQ_CACHE:
            self._seqs.popitem(last=False)

    def doubt(self, meeting_id: str) -> None:
        self._uncertain.add(meeting_id)

    def known(self, meeting_id: str) -> int | None:
        """The meeting's last seq if this node knows it for sure, else None."""
        if meeting_id in self._uncertain:
            return None
        return self._seqs.get(meeting_id)

    def last(self, meeting_id: str) -> int | None:
        """The last seq remembered, sure or not (None if none)."""
        return self._seqs.get(meeting_id)


class WriteBuffer:
    """Writes waiting for Redis, replayed in order by one task through the store's
    `apply_source` and `apply_final` (each returns the seq Redis holds after it); and the
    seqs this node knows, from which it gives provisional ones."""

    def __init__(
        self,
        limit: int,
        link: Link,
        retry_delays: tuple[float, float],
        *,
        apply_source: Callable[[PendingSource], Awaitable[int]],
        apply_final: Callable[[PendingFinal], Awaitable[int]],
    ) -> None:
        if limit < 2:
            raise ValueError("buffer_limit must be >= 2")
        self.limit = limit
        self.seqs = SeqCache()
        self.resequenced = 0  # buffered finals whose provisional seq had to change
        self._link = link
        self._retry_delays = retry_delays
        self._apply_source = apply_source
        self._apply_final = apply_final
        self._items: deque[Pending] = deque()
        self._per_meeting: dict[str, int] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self._flusher: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def meetings(self) -> int:
        """Meetings with writes still waiting."""
        return len(self._per_meeting)

    def count(self, meeting_id: str) -> int:
        """Writes of the meeting still waiting."""
        return self._per_meeting.get(meeting_id, 0)

    def check_admission(self) -> None:
        """New and resumed sessions get half the buffer, so live ones keep room."""
        if len(self._items) >= self.limit // 2:
            raise StoreOverloaded(
                f"store write buffer holds {len(self._items)} of {self.limit} writes "
                f"while redis is unreachable ({self._link.last_error}): not admitting new "
                "sessions"
            )

    def check_room(self) -> None:
        if len(self._items) >= self.limit:
            raise StoreOverloaded(
                f"store write buffer is full ({self.limit} writes) while redis is "
                f"unreachable ({self._link.last_error}): this final was not logged"
            )

    def remember(self, meeting_id: str, seq: int, *, stored: bool = False) -> None:
        """Note a seq given in the meeting. `stored`: it is Redis' last seq, read under the
        meeting's lock; it replaces what we had if nothing of the meeting is buffered."""
        self.seqs.remember(meeting_id, seq, replaces=stored and not self.count(meeting_id))

    def provisional(
        self, meeting_id: str, final: NewFinal, source: SourceState, now: float
    ) -> FinalRecord:
        """Buffer a final under the next seq this node knows for sure, or refuse it."""
        self.check_room()
        last = self.seqs.known(meeting_id)
        if last is None:
            raise StoreUnavailable(
                f"redis unreachable ({self._link.last_error}) and the last seq of meeting "
                f"{meeting_id!r} is not known for sure on this node"
            )
        record = FinalRecord.from_new(last + 1, final)
        self.remember(meeting_id, record.seq)
        self.enqueue(PendingFinal(meeting_id, record, source, now))
        return record

    def degraded(self) -> str | None:
        """Why the store is degraded while writes wait (for /readyz), None when none do."""
        buffered = len(self._items)
        if buffered >= self.limit // 2:
            return (
                f"write buffer at {buffered} of {self.limit}: refusing new sessions; "
                f"redis: {self._link.last_error or 'catching up'}"
            )
        if buffered:
            link = self._link
            state = f"unreachable ({link.last_error})" if link.failing else "catching up"
            return f"redis {state}: {buffered} writes buffered, replaying in order"
        return None

    def enqueue(self, pending: Pending) -> None:
        self._items.append(pending)
        self._per_meeting[pending.meeting_id] = self.count(pending.meeting_id) + 1
        self._drained.clear()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name="parley-store-flush"
            )
            self._flusher.add_done_callback(log_crash)

    async def wait_drained(self, meeting_id: str, within_s: float) -> None:
        """Reads of a meeting wait until its buffered writes are in Redis."""
        if not self.count(meeting_id):
            return
        try:
            await asyncio.wait_for(self._drained.wait(), within_s)
        except TimeoutError:
            raise StoreUnavailable(
                f"redis unreachable ({self._link.last_error}): {self.count(meeting_id)} "
                "writes of this meeting are still buffered"
            ) from None

    async def flushed(self, within_s: float) -> bool:
        """Wait until the buffer is empty; False if it is not within `within_s`."""
        try:
            await asyncio.wait_for(self._drained.wait(), within_s)
        except TimeoutError:
            return False
        return True

    async def _flush(self) -> None:
        """Replay the buffer in order until it is empty, backing off while Redis is away."""
        low, high = self._retry_delays
        delay = low
        while self._items:
            pending = self._items[0]
            try:
                await self._write(pending)
            except UNREACHABLE as exc:
                self._link.note_failure(exc)
            except RedisError:
                # e.g. OOM or a script error: keep the write, say why, try again later
                logger.exception("replaying a buffered write failed; will retry")
                self._link.note_error("replay failed (see log)")
            else:
                self._link.note_success()
                self._items.popleft()
                count = self._per_meeting[pending.meeting_id] - 1
                if count:
                    self._per_meeting[pending.meeting_id] = count
                else:
                    del self._per_meeting[pending.meeting_id]
                delay = low
                continue
            await asyncio.sleep(delay)
            delay = min(high, delay * 2)
        self._drained.set()

    async def _write(self, pending: Pending) -> None:
        if isinstance(pending, PendingSource):
            self.remember(pending.meeting_id, await self._apply_source(pending))
            return
        record = pending.record
        value = await self._apply_final(pending)
        if value != record.seq:
            self.resequenced += 1
            logger.warning(
                "buffered final %s of meeting %s logged as seq %d, not provisional seq %d "
                "(another node wrote the meeting while redis was unreachable)",
                record.utterance_id,
                pending.meeting_id,
                value,
                record.seq,
            )
        self.remember(pending.meeting_id, value)

    async def stop(self) -> None:
        """Stop replaying (what is left is lost)."""
        if self._flusher is not None:
            await cancel_and_wait([self._flusher])  # a plain cancel may be dropped
