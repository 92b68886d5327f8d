"""Resume on the same node while the old connection is still open (half-open to the
server: it neither sends nor closes): the new connection takes the source over, the old
one is closed 4409 at once, and nothing the old one does touches the new one's finals."""

from __future__ import annotations

import asyncio

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.fake_recognizer import FakeRecognizer
from server.settings import Settings
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP
from tests.support.wsclient import BYTES_PER_SECOND, StreamResult, receive_all, stream_url

SILENCE = bytes(BYTES_PER_SECOND)  # one second: closes the utterance before it
KEEPALIVE = orjson.dumps({"type": "keepalive"}).decode()
IDLE_S = 3.0  # the server's idle timeout: the old connection's would fire mid-test


async def send(ws: ClientConnection, pcm: bytes) -> None:
    for offset in range(0, len(pcm), 3200):
        await ws.send(pcm[offset : offset + 3200])
        await asyncio.sleep(0.002)


async def test_resume_takes_over_an_open_connection_and_keeps_its_finals() -> None:
    """A streams one utterance (logged), then goes silent with its socket open. B resumes
    A's source and streams two more while a batch is held, so B's second final waits in
    the queue behind it; the test waits past A's idle timeout. A must be closed 4409
    `conflict` as B starts (its idle timeout ending it later cancelled the source's
    queued requests: B's), and B gets every final, logged, and ends 1000."""
    recognizer = FakeRecognizer(gated=True)

    def gated(settings: Settings) -> FakeRecognizer:
        return recognizer

    assert recognizer.gate is not None
    loop = asyncio.get_running_loop()
    speech = clip("en_jfk").pcm16()
    phrase = 3 * BYTES_PER_SECOND  # "And so my fellow Americans,"
    # Prompts off (PARLEY_PROMPT_TOKENS=0). With left context on (as here) B's second
    # final waits in the committer for the held first one, at most PARLEY_CONTEXT_WAIT_MS
    # (1 s), then goes to the engine without its context and queues behind it.
    async with serve_app(
        gated, idle_timeout_s=IDLE_S, prompt_tokens=0, left_context_s=20.0
    ) as server:
        a = StreamResult()
        url = stream_url(server.ws_url, "takeover", participant="ana", interim_results=False)
        async with connect(url) as old:
            old_receiver = asyncio.create_task(receive_all(old, a))
            a_closed_at = float("inf")

            def closed(task: object) -> None:
                nonlocal a_closed_at
                a_closed_at = loop.time()

            old_receiver.add_done_callback(closed)
            await send(old, speech[:phrase] + SILENCE)
            a_silent_since = loop.time()
            recognizer.release()  # A's one final
            await a.wait_for(lambda r: len(r.finals) == 1)
            b = StreamResult()
            resume = stream_url(
                server.ws_url,
                "takeover",
                interim_results=False,
                resume_token=a.messages[0]["resume_token"],
                last_seq=1,
            )
            async with connect(resume) as new:
                new_receiver = asyncio.create_task(receive_all(new, b))
                await b.wait_for(lambda r: bool(r.messages))
                b_started = loop.time()
                assert b.messages[0]["resumed"] is True
                recognizer.entered.clear()
                await send(new, speech[phrase:] + SILENCE)
                scheduler = server.state.scheduler
                assert scheduler is not None
                async with asyncio.timeout(5):  # B's first final held, its second queued
                    while not (recognizer.entered.is_set() and scheduler.queue_depth):  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                while loop.time() < a_silent_since + IDLE_S + 0.5:  # past A's idle timeout
                    await new.send(KEEPALIVE)
                    await asyncio.sleep(0.2)
                recognizer.release(10)
                await new.send(STOP)
                await asyncio.wait_for(new_receiver, 10)
            await asyncio.wait_for(old_receiver, 5)
            a_closed = a.messages[-1]
        _, _, body = await server.request("GET", "/v1/meetings/takeover/transcript")
    ended = b.messages[-1]
    assert ended["type"] == "session.ended", b.messages[-3:]
    assert ended["finals"] == ended["utterances"] >= 2, ended
    assert b.close_code == 1000
    logged = [f["utterance_id"] for f in orjson.loads(body)["finals"]]
    assert logged == [f["utterance_id"] for f in a.finals + b.finals]
    # A was taken over as B started, not left to its idle timeout (4408).
    assert a.close_code == 4409, (a.close_code, a.messages[-2:])
    assert a_closed["type"] == "error" and a_closed["code"] == "conflict"
    assert a_closed_at - b_started < 1.0, a_closed_at - b_started
