"""Resume on the same node while the old connection is still open (half-open to the
server: it neither sends nor closes): the new connection takes the source over, the old
one is closed 4409 at once, and nothing the old one does touches the new one's finals."""

from __future__ import annotations

import asyncio

import orjson
from websockets.asyncio.client import connect

from server.settings import Settings
from tests.appserver import serve_app
from tests.corpus import clip
from tests.fakes import FakeRecognizer
from tests.hardclient import STOP
from tests.wsclient import BYTES_PER_SECOND, StreamResult, receive_all, stream_url

SILENCE = bytes(BYTES_PER_SECOND)  # one second: closes the utterance before it


async def send(ws: object, pcm: bytes) -> None:
    for offset in range(0, len(pcm), 3200):
        await ws.send(pcm[offset : offset + 3200])  # type: ignore[attr-defined]
        await asyncio.sleep(0.002)


async def test_resume_takes_over_an_open_connection_and_keeps_its_finals() -> None:
    """A streams one utterance (logged), then goes silent with its socket open. B resumes
    A's source and streams two utterances while a batch is held, so B's second final waits
    in the queue behind it. A is closed 4409 `conflict` right away (not at its idle
    timeout, which would cancel the source's queued requests); B gets both finals, logged,
    and ends 1000."""
    recognizer = FakeRecognizer(gated=True)

    def gated(settings: Settings) -> FakeRecognizer:
        return recognizer

    assert recognizer.gate is not None
    speech = clip("en_jfk").pcm16()
    phrase = speech[: 3 * BYTES_PER_SECOND]  # "And so my fellow Americans,"
    async with serve_app(gated, idle_timeout_s=1.5) as server:
        a = StreamResult()
        url = stream_url(server.ws_url, "takeover", participant="ana", interim_results=False)
        async with connect(url) as old:
            old_receiver = asyncio.create_task(receive_all(old, a))
            await send(old, phrase + SILENCE)
            recognizer.gate.release()  # A's one final
            await a.wait_for(lambda r: len(r.finals) == 1)
            started = a.messages[0]
            b = StreamResult()
            resume = stream_url(
                server.ws_url,
                "takeover",
                interim_results=False,
                resume_token=started["resume_token"],
                last_seq=1,
            )
            async with connect(resume) as new:
                new_receiver = asyncio.create_task(receive_all(new, b))
                await b.wait_for(lambda r: bool(r.messages))
                assert b.messages[0]["resumed"] is True
                # A is taken over now, before its idle timeout: 4409 with a `conflict` error.
                await asyncio.wait_for(old_receiver, 1.0)
                assert a.close_code == 4409, (a.close_code, a.messages[-2:])
                assert a.messages[-1]["type"] == "error" and a.messages[-1]["code"] == "conflict"

                recognizer.entered.clear()
                await send(new, speech[3 * BYTES_PER_SECOND : 8 * BYTES_PER_SECOND] + SILENCE)
                async with asyncio.timeout(5):  # B's first final held, its second queued
                    while not (recognizer.entered.is_set() and server.state.scheduler.queue_depth):  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                await asyncio.sleep(2.0)  # past A's idle timeout: nothing of A may fire now
                for _ in range(10):
                    recognizer.gate.release()
                await new.send(STOP)
                await asyncio.wait_for(new_receiver, 10)
        ended = b.messages[-1]
        assert ended["type"] == "session.ended", b.messages[-3:]
        assert b.close_code == 1000
        assert ended["finals"] == ended["utterances"] == len(b.finals) >= 2
        _, _, body = await server.request("GET", "/v1/meetings/takeover/transcript")
        logged = [f["utterance_id"] for f in orjson.loads(body)["finals"]]
        assert logged == [f["utterance_id"] for f in a.finals + b.finals]
