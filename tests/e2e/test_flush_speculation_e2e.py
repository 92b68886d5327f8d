"""End to end, real model: a client's flush is answered from the speculation made in the
silence before it, with the text a decoding at the flush would give."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.corpus import clip
from tests.support.servers import ServerProcess, start_server
from tests.support.wsclient import BYTES_PER_SECOND, StreamResult, receive_all, stream_url

pytestmark = pytest.mark.slow

# Only a flush ends an utterance here (no endpoint within the test's silences), and every
# final is decoded the same way on both servers (the left context's load gates aside; no
# drafts, whose timing can tip a near tie: tests/e2e/test_speculation_e2e.py).
ENV = {
    "PARLEY_MIN_SILENCE_MS": "2000",
    "PARLEY_CONTEXT_BELOW_UTILIZATION": "0",
    "PARLEY_CONTEXT_BUDGET_MS": "0",
    "PARLEY_DRAFTS": "false",
}
SERVED = ("speculation", "speculation_unfinished", "decoded")


@pytest.fixture(scope="module")
def speculating() -> Iterator[ServerProcess]:
    """Speculating at the full post-roll (100 ms), so its finals carry the audio the other
    server's do: the default (32 ms) decodes 64 ms less trailing silence, which can change
    the text (on an AVX-512 Xeon, "Go forward ten meters." came twice), and that is the
    WER benchmarks' to judge (docs/performance.md), not this test's."""
    server = start_server({**ENV, "PARLEY_SPECULATE_AFTER_MS": "100"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def not_speculating() -> Iterator[ServerProcess]:
    server = start_server({**ENV, "PARLEY_SPECULATE_AFTER_MS": "0"})
    yield server
    server.stop()


def counts(server: ServerProcess) -> dict[str, float]:
    """Flushes by what served them, and speculations by outcome, from /metrics."""
    status, body = server.get("/metrics")
    assert status == 200
    found = dict.fromkeys((*SERVED, "used", "discarded", "cancelled"), 0.0)
    for line in body.decode().splitlines():
        if line.startswith("parley_flush_seconds_count{"):
            found[line.split('served="')[1].split('"')[0]] = float(line.split()[-1])
        elif line.startswith("parley_speculative_finals_total{"):
            found[line.split('outcome="')[1].split('"')[0]] = float(line.split()[-1])
    return found


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


async def flushed(server: ServerProcess, meeting: str, pcm: bytes) -> list[dict[str, Any]]:
    """Stream `pcm` at real time, wait a moment (the speculation decodes meanwhile), send
    `finalize`, and return the finals that came before `stop`."""
    result = StreamResult()
    async with connect(stream_url(server.ws_url, meeting, participant="p"), max_size=None) as ws:
        receiver = asyncio.create_task(receive_all(ws, result))
        frame = BYTES_PER_SECOND // 50
        for offset in range(0, len(pcm), frame):
            await ws.send(pcm[offset : offset + frame])
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.0)
        await ws.send(orjson.dumps({"type": "finalize"}).decode())
        await asyncio.wait_for(result.wait_for(lambda r: bool(r.finals)), 60)
        finals = list(result.finals)
        await ws.send(orjson.dumps({"type": "stop"}).decode())
        await asyncio.wait_for(receiver, 60)
    return finals


def silence(seconds: float) -> bytes:
    return bytes(int(seconds * BYTES_PER_SECOND) // 2 * 2)


def essentials(finals: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each final's text, start and end."""
    return [(f["text"], f["start"], f["end"]) for f in finals]


async def test_a_flush_after_trailing_silence_is_answered_from_the_speculation(
    speculating: ServerProcess, not_speculating: ServerProcess
) -> None:
    """A `finalize` sent after 0.4 s of trailing silence (and a second's wait) is answered
    from the speculation made in the silence (`parley_flush_seconds{served}` says so, no
    second decoding), with the final a server without speculation decodes at the flush
    (its post-roll aside)."""
    pcm = clip("en_ls_1221-135766-0002").pcm16() + silence(0.4)
    before_on, before_off = counts(speculating), counts(not_speculating)
    on = await flushed(speculating, "flush-spec", pcm)
    off = await flushed(not_speculating, "flush-plain", pcm)
    served = grew(before_on, counts(speculating))
    assert served.get("speculation", 0) + served.get("speculation_unfinished", 0) == 1, served
    assert served.get("used") == 1 and "decoded" not in served, served
    assert grew(before_off, counts(not_speculating)).get("decoded") == 1
    assert len(on) == 1 and on[0]["text"].strip()
    assert essentials(on) == essentials(off)


async def test_speech_resuming_withdraws_the_speculation(
    speculating: ServerProcess, not_speculating: ServerProcess
) -> None:
    """A pause long enough for a speculation, then more speech: the speculation is
    withdrawn (cancelled or discarded, never used), and the flush's final holds both parts,
    as a server without speculation decodes it."""
    pcm = (
        clip("en_librivox_sns_0880").pcm16()
        + silence(0.3)
        + clip("en_cmu_goforward").pcm16()
        + silence(0.4)
    )
    before_on, before_off = counts(speculating), counts(not_speculating)
    on = await flushed(speculating, "resume-spec", pcm)
    off = await flushed(not_speculating, "resume-plain", pcm)
    after = grew(before_on, counts(speculating))
    assert after.get("cancelled", 0) + after.get("discarded", 0) >= 1, after
    assert after.get("used") == 1, after  # the one made in the silence after the second part
    assert grew(before_off, counts(not_speculating)).get("decoded") == 1
    assert len(on) == 1 and "forward" in on[0]["text"].lower()
    assert essentials(on) == essentials(off)
