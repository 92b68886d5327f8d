"""bench/chaos's own client: it must reach its verdict whatever the faults did."""

from __future__ import annotations

import asyncio
from typing import cast

import orjson
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from bench.chaos import Socket, Stream, drain_stale
from bench.processes import ServerProcess


async def test_drain_reads_a_half_open_socket_whose_reader_is_in_recv() -> None:
    """A socket that went half-open while its own reader was still in `recv` (its client
    was waiting for the last finals) is drained without websockets' ConcurrencyError: the
    drain stops that reader, then reads what the server sent up to its close."""
    release = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        await ws.send(orjson.dumps({"type": "session.started"}).decode())
        await release.wait()
        await ws.send(orjson.dumps({"type": "error", "code": "conflict"}).decode())
        await ws.close(4409, "resumed elsewhere")

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        ws = await connect(f"ws://127.0.0.1:{port}", ping_interval=None)
        stream = Stream(0, cast(ServerProcess, None), b"", speed=1.0)
        sock = Socket(ws, resumed=False)
        stream.sockets.append(sock)
        stream.current = sock
        sock.reader = asyncio.create_task(stream.receive(sock))
        async with asyncio.timeout(10):
            while not sock.messages:  # noqa: ASYNC110 - the reader has no event to wait on
                await asyncio.sleep(0.01)
        stream.go_half_open()  # the reader stays in recv, reading paused
        release.set()
        await drain_stale([stream])
    assert [m["type"] for m in sock.messages] == ["session.started", "error"]
    assert sock.close_code == 4409


async def test_a_connection_closed_before_the_first_send_is_resumed_again() -> None:
    """A socket that closes between its `session.started` and the client's first send
    (the `resend` of a resumed stream: the server was killed then) counts as a refused
    connection and the stream resumes again, instead of the harness crashing on the
    send (seed 7 did, at a server kill)."""
    connections = 0

    async def handler(ws: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        started = {"type": "session.started", "resume_token": "t", "resume_from": 0.0}
        if connections == 1:  # offers a context to re-send, then is gone
            await ws.send(orjson.dumps({**started, "send_from": 0.0}).decode())
            await ws.close(1012, "going away")
            return
        await ws.send(orjson.dumps(started).decode())
        async for raw in ws:
            if orjson.loads(raw).get("type") == "stop":
                ended = {"type": "session.ended", "reason": "stop"}
                await ws.send(orjson.dumps(ended).decode())
                await ws.close(1000)
                return

    class Local:
        ws_url = ""

    async with serve(handler, "127.0.0.1", 0) as server:
        endpoint = Local()
        endpoint.ws_url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        stream = Stream(0, endpoint, b"", speed=1.0)
        await asyncio.wait_for(stream.run(), 30)
    assert stream.ended is not None
    assert connections >= 2
