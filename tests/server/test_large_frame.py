"""One large live frame (1 MiB: 32 s of audio, 1,024 VAD windows) does not stall the
event loop: the server scores it in slices, and other streams run between them."""

from __future__ import annotations

import asyncio
import time

from websockets.asyncio.client import connect

from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP
from tests.support.wsclient import StreamResult, receive_all, stream_url

MAX_STALL_S = 0.1  # one unsliced 1 MiB frame stalled the loop ~0.2-0.4 s on the 2-core box


class StallMeter:
    """The longest the event loop went without running this ticker, counting only time
    this process spent working (its CPU time, all threads): on a loaded machine the OS
    also keeps the whole process off the CPU for a while, which is no stall of ours.
    `longest_wall` is the plain wall-clock figure, printed for comparison."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_wall = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before, cpu_before = loop.time(), time.process_time()
            await asyncio.sleep(0.002)
            wall = loop.time() - before - 0.002
            worked = time.process_time() - cpu_before
            self.longest_wall = max(self.longest_wall, wall)
            self.longest = max(self.longest, min(wall, worked))

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
        print(
            f"longest event-loop stall with a 1 MiB frame: {meter.longest * 1000:.1f} ms of "
            f"work ({meter.longest_wall * 1000:.1f} ms wall)"
        )
        assert meter.longest < MAX_STALL_S, meter.longest
