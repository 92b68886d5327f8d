"""Takeovers across nodes: a source resumed on another node closes its old connection
here at once (`conflict`, 4409), as a resume on this node does (server/registry.py).

The node that admits a resume announces it through the store (server/sockets/stream.py); every
node watches the announcements for as long as it runs. While the store is unreachable
none arrive: the old connection is then superseded at its next final, when the store
refuses its append (SourceSuperseded), as before there were announcements.
"""

from __future__ import annotations

import asyncio
import logging

from server.registry import SessionRegistry
from store.api import Store
from store.errors import StoreError

logger = logging.getLogger(__name__)

RETRY_S = 1.0  # between tries to watch again after the store connection broke


async def watch_takeovers(
    store: Store, registry: SessionRegistry, retry_s: float = RETRY_S
) -> None:
    """Supersede this node's connections of every source another node resumed. Runs
    until cancelled."""
    failing = False
    while True:
        try:
            async with store.takeovers.watch() as takeovers:
                if failing:
                    logger.info("watching takeovers again")
                failing = False
                async for meeting_id, session_id in takeovers:
                    registry.supersede(meeting_id, session_id)
        except StoreError as exc:
            if not failing:
                logger.warning(
                    "takeovers unheard until the store answers (old connections close at "
                    "their next final meanwhile): %s",
                    exc,
                )
            failing = True
        await asyncio.sleep(retry_s)
