"""One large live frame (1 MiB: 32 s of audio, 1,024 VAD windows) does not stall the
event loop: the server scores it in slices, and other streams run between them."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import connect

from tests.appserver import serve_app
from tests.corpus import clip
from tests.hardclient import STOP
from tests.wsclient import StreamResult, receive_all, stream_url

MAX_STALL_S = 0.1  # one unsliced 1 MiB frame stalled the loop ~0.2-0.4 s on the 2-core box


class StallMeter:
    """The longest the event loop went without running this ticker."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.002)
            self.longest = max(self.longest, loop.time() - before - 0.002)

    def __enter__(self) -> StallMeter:
        self._task = asyncio.create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_a_1mib_frame_does_not_stall_other_streams() -> None:
    speech = clip("en_jfk").pcm16()
    frame = (speech * 3)[: 1 << 20]
    async with serve_app() as server:
        url = stream_url(server.ws_url, "large", participant="big", interim_results=False)
        warm = StreamResult()
        async with connect(url, max_size=None) as ws:  # the VAD's first call, off the meter
            receiving = asyncio.create_task(receive_all(ws, warm))
            await ws.send(speech[:32_000])
            await ws.send(STOP)
            await asyncio.wait_for(receiving, 20)
        result = StreamResult()
        async with connect(url, max_size=None) as ws:
            receiving = asyncio.create_task(receive_all(ws, result))
            await result.wait_for(lambda r: bool(r.messages))
            with StallMeter() as meter:
                await ws.send(frame)
                await ws.send(STOP)
                await asyncio.wait_for(receiving, 30)
        assert result.messages[-1]["type"] == "session.ended", result.messages[-2:]
        assert result.messages[-1]["audio_seconds"] >= 32.0
        print(f"longest event-loop stall with a 1 MiB frame: {meter.longest * 1000:.1f} ms")
        assert meter.longest < MAX_STALL_S, meter.longest
