"""One listener's bounded queue of a meeting's events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from store.api import SUBSCRIBER_QUEUE
from store.errors import StoreError, SubscriberLagged


class Listener:
    """One listener's bounded queue. A full queue drops the listener, never the publisher."""

    def __init__(self, maxsize: int = SUBSCRIBER_QUEUE) -> None:
        self._queue: asyncio.Queue[bytes | StoreError] = asyncio.Queue(maxsize)
        self.dropped = False

    def offer(self, event: bytes) -> bool:
        """Queue one event; False once the listener is dropped (now or before)."""
        if self.dropped:
            return False
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.drop(SubscriberLagged("listener fell too far behind and was dropped"))
            return False
        return True

    def drop(self, error: StoreError) -> None:
        """Discard what is queued and make the iterator raise `error` next."""
        if self.dropped:
            return
        self.dropped = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(error)

    async def events(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._queue.get()
            if isinstance(item, StoreError):
                raise item
            yield item
