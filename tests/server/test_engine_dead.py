"""A dead engine (the scheduler's loop died): /readyz says so with the reason, an open
stream ends at once instead of hanging, new streams and uploads are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import orjson
from websockets.asyncio.client import connect

from engine.api import Priority, RecognitionRequest, RecognitionResult, Utterance
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP, error_of, exchange
from tests.support.timeouts import S
from tests.support.wsclient import StreamResult, receive_all

TIMEOUT = 10 * S


def broken_observer(
    requests: Sequence[RecognitionRequest], results: Sequence[RecognitionResult]
) -> None:
    raise RuntimeError("metrics bug")


async def test_a_dead_engine_is_reported_and_refuses_work() -> None:
    """The loop dies after a batch: readyz turns 503 with the reason, the stream that was
    open ends with 1011 when it next needs the model, a new stream gets 1013 with the
    reason, an upload 503."""
    async with serve_app() as server:
        status, _, body = await server.request("GET", "/readyz")
        assert status == 200, body
        scheduler = server.state.scheduler
        assert scheduler is not None
        async with connect(f"{server.ws_url}/v1/meetings/dead-1/stream") as ws:
            open_stream = StreamResult()
            receiver = asyncio.create_task(receive_all(ws, open_stream))
            await open_stream.wait_for(lambda r: bool(r.messages))

            scheduler.add_observer(broken_observer)
            silence = Utterance(np.zeros(1600, np.float32))
            future = await scheduler.submit(RecognitionRequest("probe", Priority.FINAL, silence))
            await asyncio.wait_for(future, TIMEOUT)  # it ran; the observer then killed the loop

            status, _, body = await server.request("GET", "/readyz")
            ready = orjson.loads(body)
            assert status == 503 and ready["ready"] is False
            assert ready["checks"]["scheduler"] == "dead"
            assert any("RuntimeError: metrics bug" in reason for reason in ready["reasons"])

            speech = clip("en_jfk").pcm16() + bytes(32_000)
            for offset in range(0, len(speech), 32_000):
                if receiver.done():
                    break
                await ws.send(speech[offset : offset + 32_000])
            await asyncio.wait_for(receiver, TIMEOUT)
        assert open_stream.close_code == 1011

        refused = await exchange(f"{server.ws_url}/v1/meetings/dead-2/stream", [STOP])
        assert refused.close_code == 1013
        error = error_of(refused)
        assert error is not None and "speech engine is dead" in error["message"]

        status, _, body = await server.request(
            "POST",
            "/v1/transcriptions",
            body=b"",
            headers={"Content-Type": "multipart/form-data; boundary=x"},
        )
        assert status == 503 and b"speech engine is dead" in body
