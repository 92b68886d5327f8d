"""The scheduler's queue: its requests in arrival order, and the one partial and the one
speculative final each session may have queued (sans-I/O; `engine.scheduling.scheduler` keeps the
futures' waiting, the loop and the statistics).

Rules:
- A session has at most one queued partial: a newer one replaces it (`supersede` takes
  the old one out; the scheduler fails its future with RequestSuperseded). The same holds
  for a session's speculative final; `promote` turns a queued one into a final, as if
  submitted then.
- A stopped batch's requests go back (`put_back`), unless a newer partial or speculative
  request of their session came meanwhile.
- The queue has a bound (`full`); what happens at the bound is the scheduler's: a partial
  or speculative request fails, a final or file request waits for room.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace

from engine.api import Priority, RecognitionRequest, RecognitionResult
from engine.scheduling.records import Entry

# The priorities of which a session keeps only its newest queued request.
LATEST_ONLY = (Priority.PARTIAL, Priority.SPECULATIVE)


class RequestQueue:
    """Queued requests by key, in arrival order, with each session's newest partial and
    speculative final."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._entries: dict[int, Entry] = {}
        self._latest: dict[Priority, dict[str, Entry]] = {p: {} for p in LATEST_ONLY}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    @property
    def full(self) -> bool:
        return len(self._entries) >= self.bound

    def supersede(self, request: RecognitionRequest) -> Entry | None:
        """Take out the queued request that `request` replaces: its session's partial (or
        speculative final) when `request` is one; None if there is none."""
        latest = self._latest.get(request.priority)
        previous = None if latest is None else latest.pop(request.session_id, None)
        if previous is not None:
            del self._entries[previous.key]
        return previous

    def add(
        self,
        request: RecognitionRequest,
        future: asyncio.Future[RecognitionResult],
        now: float,
        since: float,
    ) -> Entry:
        """Queue `request` (the bound is the caller's to keep)."""
        entry = Entry(request, future, now, next(self._keys), since)
        self._entries[entry.key] = entry
        latest = self._latest.get(request.priority)
        if latest is not None:
            latest[request.session_id] = entry
        return entry

    def take(self, keys: Sequence[int]) -> list[Entry]:
        """Take the requests of `keys` out to run them."""
        entries = [self._entries.pop(key) for key in keys]
        for entry in entries:
            latest = self._latest.get(entry.request.priority)
            if latest is not None and latest.get(entry.request.session_id) is entry:
                del latest[entry.request.session_id]
        return entries

    def put_back(self, entry: Entry) -> bool:
        """Queue a stopped batch's request again; False (and it stays out) if a newer
        partial or speculative request of its session is queued."""
        session = entry.request.session_id
        latest = self._latest.get(entry.request.priority)
        if latest is not None and session in latest:
            return False
        self._entries[entry.key] = entry
        if latest is not None:
            latest[session] = entry
        return True

    def cancel(self, session_id: str, only: Priority | None = None) -> list[Entry]:
        """Take out a session's queued requests (or only those of priority `only`)."""
        dropped = [
            e
            for e in self._entries.values()
            if e.request.session_id == session_id and only in (None, e.request.priority)
        ]
        for entry in dropped:
            del self._entries[entry.key]
        for priority, latest in self._latest.items():
            if only in (None, priority):
                latest.pop(session_id, None)
        return dropped

    def promote(self, request: RecognitionRequest, now: float) -> bool:
        """Make the queued SPECULATIVE `request` (the object submitted) a final, waiting
        as a final from `now`; False if it is not queued."""
        speculative = self._latest[Priority.SPECULATIVE]
        queued = speculative.get(request.session_id)
        if queued is None or queued.request is not request:
            return False
        del speculative[request.session_id]
        queued.request = replace(request, priority=Priority.FINAL)
        queued.expedited = False  # a final now, awaited only if its client flushes
        queued.since = queued.submitted_at = now
        return True

    def expedite(self, request: RecognitionRequest) -> bool:
        """Serve the queued SPECULATIVE `request` (the object submitted) as an awaited
        one; False if it is not queued."""
        queued = self._latest[Priority.SPECULATIVE].get(request.session_id)
        if queued is None or queued.request is not request:
            return False
        queued.expedited = True
        return True

    def partial_of(self, session_id: str) -> Entry | None:
        """The session's queued partial, if any."""
        return self._latest[Priority.PARTIAL].get(session_id)

    def clear(self) -> list[Entry]:
        """Take every request out."""
        entries = list(self._entries.values())
        self._entries.clear()
        for latest in self._latest.values():
            latest.clear()
        return entries
