"""How a listener's two tasks (the one that watches the client, the one that forwards the
meeting's events) end together."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any, cast

from starlette.websockets import WebSocket, WebSocketDisconnect

from server.auth.keys import ANONYMOUS
from server.auth.ownership import OwnerCheck
from server.sockets.listeners import _serve_listener
from server.state import AppState
from store.memory import MemoryStore


async def test_a_client_that_leaves_while_an_event_is_sent_leaves_no_unretrieved_error() -> None:
    """The client's close arrives in the same turn of the loop as the send of an event
    to it fails: both tasks end with WebSocketDisconnect. Both errors are taken, so
    asyncio logs no `Task exception was never retrieved` with a traceback (the server's
    log had one per such listener: bench/fuzz_sessions.py)."""
    store = MemoryStore()
    meeting = "m1"

    class Leaving:
        """The socket of a client that closed while an event was being published."""

        async def receive(self) -> dict[str, Any]:
            await store.publish(meeting, b'{"type": "transcript.partial", "text": "hi"}')
            return {"type": "websocket.disconnect", "code": 1000}

        async def send_text(self, data: str) -> None:
            raise WebSocketDisconnect(1006)

    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:
        state = SimpleNamespace(
            store=store,
            settings=SimpleNamespace(streams=SimpleNamespace(listener_send_timeout_s=1)),
        )
        owner = OwnerCheck(store, meeting, ANONYMOUS)
        error = await _serve_listener(
            cast(WebSocket, Leaving()), cast(AppState, state), meeting, 0, owner
        )
        gc.collect()  # a task's unretrieved exception is reported when it is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert isinstance(error, WebSocketDisconnect)
    assert unretrieved == []
