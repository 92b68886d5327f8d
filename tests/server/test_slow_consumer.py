"""A stream client that does not read: it is closed 1008 `slow_consumer`, whichever task
overflows its outbox, and the meeting's listeners still get every final it logged."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import orjson
from websockets.asyncio.client import connect

from bench.fake_recognizer import FakeRecognizer
from engine.api import Transcription, Utterance
from server.settings import Settings
from session.outbox import OutboxState
from store.records import NewFinal
from tests.support.appserver import AppServer, serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP
from tests.support.wsclient import StreamResult, receive_all, stream_url

WORDY = " word" * 200_000  # 1 MB per final: the sockets' buffers (4 MB) fill after a few


class WordyRecognizer(FakeRecognizer):
    def result(self, utterance: Utterance) -> Transcription:
        result = super().result(utterance)
        return dataclasses.replace(result, text=result.text + WORDY)


def wordy(settings: Settings) -> WordyRecognizer:
    return WordyRecognizer()


def small_socket(port: int) -> socket.socket:
    """A client socket with a small receive buffer: what it does not read soon pushes back."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def is_overflowed(server: AppServer) -> bool:
    """OVERFLOWED, or already CLOSED by the goodbye that follows (the stream sends no
    `stop`, so nothing else closes it; finals ready early make that quick)."""
    return any(a.outbox_state is not OutboxState.OPEN for a in server.state.registry.sessions())


async def overflowed(server: AppServer) -> None:
    while not is_overflowed(server):  # noqa: ASYNC110 - polled state, no event
        await asyncio.sleep(0.02)


async def test_a_bot_that_streams_and_never_reads_is_closed_1008() -> None:
    """The bot streams 12 utterances and reads nothing until its outbox overflows: it then
    reads an `error` `slow_consumer` and close 1008 (not 1011); a listener of the meeting
    got every final the log holds, the one queued as the outbox overflowed included."""
    speech = clip("en_jfk").pcm16() + bytes(32_000)
    async with serve_app(wordy, outbox_limit=2) as server:
        listener = StreamResult()
        async with connect(f"{server.ws_url}/v1/meetings/slow/events", max_size=None) as events:
            listening = asyncio.create_task(receive_all(events, listener))
            url = stream_url(server.ws_url, "slow", participant="bot", interim_results=False)
            sock = small_socket(server.port)
            async with connect(url, sock=sock, max_size=None, max_queue=1) as bot:
                sending = asyncio.create_task(_send(bot, speech * 3))
                await asyncio.wait_for(overflowed(server), 60)
                result = StreamResult()
                await asyncio.wait_for(receive_all(bot, result), 20)
                sending.cancel()
            assert result.close_code == 1008, (result.close_code, result.messages[-1:])
            assert result.messages[-1]["type"] == "error"
            assert result.messages[-1]["code"] == "slow_consumer"
            async with asyncio.timeout(10):  # the stream ended on the server, too
                while len(server.state.registry):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            _, _, body = await server.request("GET", "/v1/meetings/slow/transcript")
            logged = [f["utterance_id"] for f in orjson.loads(body)["finals"]]
            assert len(logged) > 3
            await listener.wait_for(lambda r: len(r.finals) >= len(logged))
            assert [f["utterance_id"] for f in listener.finals] == logged
            listening.cancel()


async def _send(ws: object, pcm: bytes) -> None:
    for offset in range(0, len(pcm), 3200):
        await ws.send(pcm[offset : offset + 3200])  # type: ignore[attr-defined]
        await asyncio.sleep(0.001)


async def test_resume_with_last_seq_0_replays_1500_finals() -> None:
    """A source with 1,500 logged finals (more than the outbox holds) resumes with
    `last_seq=0`: every final is replayed, in order, as fast as the client reads, and the
    stream goes on and ends 1000."""
    async with serve_app() as server:
        store = server.state.store
        source, token = await store.create_source("replay", "ana")
        for i in range(1500):
            final = NewFinal(
                utterance_id=f"{source.session_id}-{i}",
                session_id=source.session_id,
                participant="ana",
                text=f"final {i}",
                start=float(i),
                end=i + 0.5,
                language="en",
            )
            source = dataclasses.replace(source, acked_until=i + 0.5, next_utterance=i + 1)
            await store.append_final("replay", final, source)
        url = stream_url(server.ws_url, "replay", resume_token=token, last_seq=0)
        result = StreamResult()
        async with connect(url, max_size=None) as ws:
            receiving = asyncio.create_task(receive_all(ws, result))
            await ws.send(STOP)
            await asyncio.wait_for(receiving, 30)
        assert result.close_code == 1000, (result.close_code, result.messages[-1:])
        assert [f["seq"] for f in result.finals] == list(range(1, 1501))
        assert result.messages[0]["type"] == "session.started"
        assert result.messages[-1]["type"] == "session.ended"
