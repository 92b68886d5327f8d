"""A task cancelled while Python 3.11's `asyncio.wait_for` (redis-py's, around each
command) completes runs on as if never cancelled (CPython gh-86296); `cancel_and_wait`
ends it all the same, and a listener that breaks the rules while its forwarder talks to
Redis is gone from the server."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from server.cancel import cancel_and_wait
from tests.support.appserver import serve_app


async def test_a_task_whose_cancel_was_swallowed_is_cancelled_again() -> None:
    inner: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    ran_on = asyncio.Event()

    async def body() -> None:
        await asyncio.wait_for(inner, 10)  # 3.11: the cancel below is swallowed here
        ran_on.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await asyncio.sleep(0)  # in wait_for
    inner.set_result(1)  # the inner future completes in the same turn as the cancel
    async with asyncio.timeout(5):
        await cancel_and_wait([task])
    assert task.cancelled()


async def test_listeners_refused_for_audio_while_reading_redis_all_end(
    redis_url: str, redis_prefix: str
) -> None:
    """Listeners that send audio at once (1003) while their forwarder reads the meeting's
    log from Redis: every one is gone from the server afterwards (a swallowed cancel left
    some forwarders waiting for events for ever, each holding a listener slot)."""
    async with serve_app(redis_url=redis_url, store_prefix=redis_prefix, drain_timeout_s=1) as app:

        async def listener(index: int) -> int | None:
            """The close code, None when the server sent none within 5 s."""
            url = f"{app.ws_url}/v1/meetings/leak-{index % 4}/events"
            async with connect(url, close_timeout=0.1) as ws:
                await ws.send(b"\x00\x00")
                try:
                    async with asyncio.timeout(5):
                        async for _ in ws:
                            pass
                except ConnectionClosed:
                    pass
                except TimeoutError:
                    return None
            return ws.close_code

        closes: list[int | None] = []
        for _ in range(5):
            closes += await asyncio.gather(*(listener(i) for i in range(16)))
        assert closes == [1003] * len(closes)
        for _ in range(50):  # and the server's side of each is gone
            if (still_open := app.state.metrics.listeners._value.get()) == 0:
                break
            await asyncio.sleep(0.1)
        assert still_open == 0
