"""The tests' resumable WebSocket client sees how a connection ended."""

from __future__ import annotations

import asyncio
import contextlib

import orjson
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.support.wsclient import BYTES_PER_SECOND, ResumableStream


async def dies_after_started(ws: ServerConnection) -> None:
    """A server that starts the session, then dies: its socket closes with no close
    handshake, as when the process is killed."""
    started = {"type": "session.started", "resume_from": 0.0, "resume_token": "t"}
    await ws.send(orjson.dumps(started).decode())
    await asyncio.sleep(0.05)
    ws.transport.close()


async def test_a_connection_whose_server_dies_records_1006() -> None:
    """`run` returns or raises only after the receiver has recorded the close. A send that
    found the connection gone used to raise first and leave `close_code` unset (a CI
    failure in test_server_killed_mid_meeting_resumes_on_another, 12-04; here 19 rounds of
    40 before the fix, with frames every 0.4 ms)."""
    async with serve(dies_after_started, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        for i in range(40):
            stream = ResumableStream(
                f"ws://127.0.0.1:{port}", f"m{i}", bytes(60 * BYTES_PER_SECOND), speed=50.0
            )
            with contextlib.suppress(ConnectionClosed):
                await stream.run()
            assert stream.connections[0].close_code == 1006, i
