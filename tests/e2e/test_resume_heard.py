"""A resumed stream hears what the unbroken one heard (issue 38): its VAD goes on from the
state stored with its last final, and its next final is decoded behind the same left
context (the client re-sends from `send_from`). The real model on real recordings."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from bench.chaos import speech
from tests.support.servers import ServerProcess, start_server
from tests.support.wsclient import (
    BYTES_PER_SECOND,
    StreamResult,
    receive_all,
    stream_pcm,
    stream_url,
)

pytestmark = pytest.mark.slow

SPEED = 4.0
FRAME = BYTES_PER_SECOND // 50  # 20 ms


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Left context on every final whatever the load (no gate, no budget, a final waits
    for the one before it), so the unbroken and the resumed runs decode alike on a busy
    box; finals end at the 100 ms post-roll (speculation at the post-roll), the timeline
    these cases were found on."""
    process = start_server(
        {
            "PARLEY_SPECULATE_AFTER_MS": "100",
            "PARLEY_CONTEXT_BELOW_UTILIZATION": "0",
            "PARLEY_CONTEXT_BUDGET_MS": "0",
            "PARLEY_CONTEXT_WAIT_MS": "60000",
        }
    )
    yield process
    process.stop()


async def send(ws: ClientConnection, pcm: bytes, start: int, end: int) -> None:
    began = time.monotonic()
    for i, offset in enumerate(range(start, end, FRAME)):
        await ws.send(pcm[offset : min(offset + FRAME, end)])
        delay = began + (i + 1) * 0.02 / SPEED - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def aborted_and_resumed(
    base: str, meeting: str, pcm: bytes, abort_at: float, finals_first: int, *, resend: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Stream `pcm` up to `abort_at` s, wait for `finals_first` finals, cut the connection
    (no close handshake), resume with the token, re-send (from `send_from` with a `resend`,
    else from `resume_from`) to the end, `stop`. Every final, and the resumed
    `session.started`."""
    first, second = StreamResult(), StreamResult()
    async with connect(stream_url(base, meeting, participant="ana", interim_results=False)) as ws:
        receiver = asyncio.create_task(receive_all(ws, first))
        await send(ws, pcm, 0, round(abort_at * 16_000) * 2)
        async with asyncio.timeout(60):
            await first.wait_for(lambda r: len(r.finals) >= finals_first)
        ws.transport.abort()
        await asyncio.wait_for(receiver, 10)
    token = first.messages[0]["resume_token"]
    last_seq = max(f["seq"] for f in first.finals)
    url = stream_url(base, meeting, resume_token=token, last_seq=last_seq, interim_results=False)
    async with connect(url) as ws:
        receiver = asyncio.create_task(receive_all(ws, second))
        await second.wait_for(lambda r: bool(r.messages))
        started = second.messages[0]
        start = started["resume_from"]
        if resend:
            start = started["send_from"]
            await ws.send(orjson.dumps({"type": "resend", "from": start}).decode())
        await send(ws, pcm, round(start * 16_000) * 2, len(pcm))
        await ws.send(orjson.dumps({"type": "stop"}).decode())
        await asyncio.wait_for(receiver, 120)
    assert second.of_type("session.ended"), second.messages[-3:]
    return first.finals + second.finals, started


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


async def test_resumed_at_7_744_s_hears_word(server: ServerProcess) -> None:
    """bench.chaos.speech(702, …) resumed at 7.744 s (the end of a logged final) after an
    abort at 8.6 s, re-sent from resume_from as a client of the old protocol does: "Word."
    (8.03-8.67 s) is transcribed as in the unbroken stream (lost before: cold VAD)."""
    pcm = speech(702, 11)
    whole = await stream_pcm(
        server.ws_url, f"word-whole-{time.monotonic_ns()}", pcm, speed=SPEED, interim_results=False
    )
    spans = [(f["start"], f["end"]) for f in whole.finals]
    before = sum(f["end"] <= 7.744 for f in whole.finals)
    assert whole.finals[before - 1]["end"] == 7.744, spans
    word = [f for f in whole.finals if f["start"] <= 8.13 and f["end"] >= 8.57]
    assert word and words(word[0]["text"]), spans
    finals, started = await aborted_and_resumed(
        server.ws_url, f"word-resumed-{time.monotonic_ns()}", pcm, 8.6, before, resend=False
    )
    assert started["resume_from"] == 7.744
    assert started["send_from"] <= 7.744
    heard = [f for f in finals if f["start"] <= 8.13 and f["end"] >= 8.57]
    assert heard, [(f["start"], f["end"]) for f in finals]
    assert words(heard[0]["text"]) == words(word[0]["text"])


async def test_resumed_in_each_utterance_gives_the_unbroken_finals(server: ServerProcess) -> None:
    """Real recordings of several utterances (corpus clips with short pauses), aborted in
    the middle of each of their first utterances after the first and resumed, re-sent from
    send_from: the same finals as the unbroken stream (count, boundaries within 0.1 s,
    words)."""
    pcm = speech(702, 16)
    whole = await stream_pcm(
        server.ws_url, f"prop-whole-{time.monotonic_ns()}", pcm, speed=SPEED, interim_results=False
    )
    base = whole.finals
    assert len(base) >= 3, [(f["start"], f["end"], f["text"]) for f in base]
    for k in range(1, min(len(base), 4)):
        middle = (base[k]["start"] + base[k]["end"]) / 2
        finals, started = await aborted_and_resumed(
            server.ws_url, f"prop-{k}-{time.monotonic_ns()}", pcm, middle, k, resend=True
        )
        assert started["resume_from"] == base[k - 1]["end"]
        assert started["send_from"] == base[max(0, k - 2)]["start"]  # two utterances back
        got = [(f["start"], f["end"], words(f["text"])) for f in finals]
        want = [(f["start"], f["end"], words(f["text"])) for f in base]
        assert len(got) == len(want), (k, got, want)
        for (gs, ge, gw), (ws, we, ww) in zip(got, want, strict=True):
            assert abs(gs - ws) <= 0.1 and abs(ge - we) <= 0.1, (k, got, want)
            assert gw == ww, (k, got, want)
