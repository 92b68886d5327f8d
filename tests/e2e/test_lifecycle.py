"""Server lifecycle: readiness, graceful SIGTERM drain, and metrics matching what clients got."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.e2e.test_stream_e2e import scrape
from tests.support.corpus import clip
from tests.support.servers import ServerProcess, start_server
from tests.support.timeouts import START_TIMEOUT, S
from tests.support.wsclient import (
    BYTES_PER_SECOND,
    StreamResult,
    receive_all,
    stream_pcm,
    stream_url,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fresh_server() -> Iterator[ServerProcess]:
    """A server just spawned, its model still loading: the readiness test (first in this
    file) watches it come up, the Ctrl-C test then stops it. One model load for both."""
    server = start_server(wait=False)
    yield server
    server.stop()


def test_readyz_is_not_ready_before_warmup_and_ready_after(fresh_server: ServerProcess) -> None:
    """/readyz answers 503 with a reason while the model loads, then 200; /healthz is 200
    throughout; a stream opened before ready is refused with 1013."""
    server = fresh_server
    deadline = time.monotonic() + 30 * S
    while True:
        try:
            status, body = server.get("/readyz")
            break
        except OSError:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
    assert status == 503, body
    payload = orjson.loads(body)
    assert payload["ready"] is False and payload["status"] == "not_ready"
    assert "model is loading" in payload["reasons"]
    assert server.get("/healthz")[0] == 200
    early = asyncio.run(_open_and_wait(stream_url(server.ws_url, "early")))
    assert early.close_code == 1013 and early.of_type("error")[0]["code"] == "overloaded"
    server.wait_ready(START_TIMEOUT)
    status, body = server.get("/readyz")
    assert status == 200 and orjson.loads(body)["checks"]["model"] == "ready"


async def _open_and_wait(url: str) -> StreamResult:
    result = StreamResult()
    async with connect(url) as ws:
        await asyncio.wait_for(receive_all(ws, result), 10)
    return result


async def test_sigterm_flushes_the_utterance_in_progress() -> None:
    """SIGTERM mid-utterance: the client gets that utterance's final and session.ended
    before close 1012, and the process exits 0 within the drain timeout."""
    server = await asyncio.to_thread(start_server)
    speech = clip("en_ls_2412-153948-0000")  # first utterance runs from 0.3 s to 7.8 s
    pcm = speech.pcm16()
    result = StreamResult()
    try:
        async with connect(stream_url(server.ws_url, "sigterm", participant="dan")) as ws:
            receiver = asyncio.create_task(receive_all(ws, result))
            frame = BYTES_PER_SECOND // 50
            started = time.monotonic()
            for i, offset in enumerate(range(0, len(pcm), frame)):
                if i == 200:  # 4 s in: mid-utterance
                    server.process.send_signal(signal.SIGTERM)
                try:
                    await ws.send(pcm[offset : offset + frame])
                except Exception:  # the server closed the socket: stop sending
                    break
                await asyncio.sleep(max(0.0, started + (i + 1) * 0.02 - time.monotonic()))
            await asyncio.wait_for(receiver, 30)
        exit_code = await asyncio.to_thread(server.process.wait, 30)
    finally:
        server.stop()
    kinds = [m["type"] for m in result.messages]
    assert result.close_code == 1012, (result.close_code, kinds)
    assert kinds[-1] == "session.ended" and result.messages[-1]["reason"] == "shutdown"
    finals = result.finals
    assert finals, kinds
    assert 3.5 <= finals[-1]["end"] <= 6.0  # the utterance cut at the shutdown
    assert exit_code == 0, server.log()


def test_ctrl_c_is_an_orderly_shutdown(fresh_server: ServerProcess) -> None:
    """SIGINT (Ctrl-C under `make run`) drains like SIGTERM: exit 0, no traceback."""
    server = fresh_server
    server.wait_ready(START_TIMEOUT)
    try:
        server.process.send_signal(signal.SIGINT)
        exit_code = server.process.wait(30 * S)
    finally:
        server.stop()
    log = server.log()
    assert exit_code == 0, log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log


async def test_metrics_match_what_clients_received(parley_server: ServerProcess) -> None:
    """After two rooms stream, /metrics counts exactly the finals and sessions they saw,
    and every exposed family parses."""
    before = scrape(parley_server)
    rooms = await asyncio.gather(
        stream_pcm(parley_server.ws_url, "metrics-a", clip("en_jfk").pcm16(), speed=2.0),
        stream_pcm(
            parley_server.ws_url, "metrics-b", clip("en_ls_61-70968-0000").pcm16(), speed=2.0
        ),
    )
    after = scrape(parley_server)

    def delta(key: str) -> float:
        return float(after.get(key, 0.0) - before.get(key, 0.0))

    finals = sum(len(r.finals) for r in rooms)
    partials = sum(len(r.of_type("transcript.partial")) for r in rooms)
    assert delta("parley_finals_total") == finals
    merged = delta("parley_partials_dropped_total|reason=merged")
    assert delta("parley_partials_total") - merged == partials
    assert delta("parley_sessions_total|close_code=1000|reason=stop") == 2
    assert delta("parley_final_latency_seconds_count") == finals
    # The gauge drops when the endpoint returns, just after the client saw its close.
    deadline = time.monotonic() + 5
    while scrape(parley_server)["parley_active_sessions"] != 0:
        assert time.monotonic() < deadline, "a session stayed registered"
        await asyncio.sleep(0.05)
    assert "parley_queue_depth|priority=final" in after
