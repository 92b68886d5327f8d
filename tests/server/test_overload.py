"""Overload: past the stream bound or the model's measured capacity, new streams are
refused with 1013 and a reason; admitted rooms (and resumed ones) get every final."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from websockets.asyncio.client import ClientConnection, connect

from bench.fake_recognizer import FakeRecognizer
from engine.api import Transcription, Utterance
from server.settings import Settings
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP, error_of, exchange
from tests.support.wsclient import StreamResult, receive_all


class SlowRecognizer(FakeRecognizer):
    """The fake engine, taking `delay` seconds per batch on its worker thread."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: Callable[[], bool] | None = None
    ) -> list[Transcription]:
        time.sleep(self.delay)
        return super().transcribe(batch, should_stop)


async def send_speech(ws: ClientConnection, pcm: bytes) -> None:
    for offset in range(0, len(pcm), 3200):
        await ws.send(pcm[offset : offset + 3200])
        await asyncio.sleep(0.002)


def assert_complete(result: StreamResult) -> None:
    """Every utterance the session cut reached the client as a final, seq gap-free."""
    ended = result.messages[-1]
    assert ended["type"] == "session.ended", result.messages[-3:]
    assert ended["finals"] == ended["utterances"] == len(result.finals) > 0
    seqs = [f["seq"] for f in result.finals]
    assert seqs == sorted(set(seqs))
    assert max(f["timing"]["total"] for f in result.finals) < 1.0  # latency kept


async def test_past_capacity_new_streams_are_refused_and_admitted_rooms_finish() -> None:
    """Three streams admitted, the fourth refused 1013 (stream bound); once finals wait
    longer than the (low) limit, a new stream is refused 1013 with the measured reason
    while a resumed stream is admitted; every admitted room gets all its finals."""

    def slow(settings: Settings) -> SlowRecognizer:
        return SlowRecognizer(0.05)

    # Speculation off: finals decoded early wait ~0 here, and this measures waits of 20 ms
    # (the batch wait) against a 1 ms limit.
    async with serve_app(
        slow, max_sessions=3, admit_max_queue_wait_ms=1.0, speculate_after_ms=0
    ) as server:
        base = f"{server.ws_url}/v1/meetings"
        speech = clip("en_jfk").pcm16() + bytes(32000)  # a second of silence closes the last
        rooms = [StreamResult() for _ in range(3)]
        async with (
            connect(f"{base}/room-0/stream") as a,
            connect(f"{base}/room-1/stream") as b,
            connect(f"{base}/room-2/stream") as c,
        ):
            receivers = [
                asyncio.create_task(receive_all(ws, r))
                for ws, r in zip((a, b, c), rooms, strict=True)
            ]
            for room in rooms:
                await room.wait_for(lambda r: bool(r.messages))
            fourth = await exchange(f"{base}/room-3/stream", [STOP])
            assert fourth.close_code == 1013
            error = error_of(fourth)
            assert error is not None and error["code"] == "overloaded"
            assert "at capacity (3 streams)" in error["message"] and error["retry_after"] > 0

            await send_speech(a, speech)  # four utterances: enough finals to measure
            await rooms[0].wait_for(lambda r: len(r.finals) >= 4)
            await send_speech(b, speech[: 32000 * 3])
            b.transport.abort()  # a dropped connection: its slot frees
            await receivers[1]
            while len(server.state.registry) > 2:  # noqa: ASYNC110 - the server saw the drop
                await asyncio.sleep(0.01)
            token = rooms[1].messages[0]["resume_token"]

            measured = await exchange(f"{base}/room-4/stream", [STOP])
            assert measured.close_code == 1013
            assert "finals waited" in error_of(measured)["message"]  # type: ignore[index]

            async with connect(f"{base}/room-1/stream?resume_token={token}") as resumed_ws:
                resumed = StreamResult()
                resuming = asyncio.create_task(receive_all(resumed_ws, resumed))
                await resumed.wait_for(lambda r: bool(r.messages))
                assert resumed.messages[0]["type"] == "session.started"
                offset = round(resumed.messages[0]["resume_from"] * 16000) * 2
                await asyncio.gather(
                    send_speech(resumed_ws, speech[offset:]), send_speech(c, speech)
                )
                for ws in (a, resumed_ws, c):
                    await ws.send(STOP)
                await asyncio.wait_for(asyncio.gather(receivers[0], receivers[2], resuming), 60)
        assert_complete(rooms[0])
        assert_complete(rooms[2])
        ended = resumed.messages[-1]
        assert ended["type"] == "session.ended" and ended["finals"] == ended["utterances"]
        finals = {f["utterance_id"]: f for f in rooms[1].finals + resumed.finals}
        assert len(finals) == len(rooms[0].finals)  # the same speech, nothing lost or repeated
        assert sorted(f["seq"] for f in finals.values()) == list(range(1, len(finals) + 1))


async def test_capacity_check_off_admits_up_to_the_stream_bound() -> None:
    """With the measured check off (0), only the stream bound refuses."""

    def slow(settings: Settings) -> SlowRecognizer:
        return SlowRecognizer(0.05)

    async with serve_app(slow, max_sessions=8, admit_max_queue_wait_ms=0.0) as server:
        pcm = clip("en_jfk").pcm16()
        first = await exchange(
            f"{server.ws_url}/v1/meetings/warm/stream",
            [pcm[o : o + 6400] for o in range(0, len(pcm), 6400)] + [STOP],
        )
        assert_complete(first)
        second = await exchange(f"{server.ws_url}/v1/meetings/next/stream", [STOP])
        assert second.close_code == 1000
