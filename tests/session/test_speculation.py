"""Speculative finals with the fake recognizer: a used speculation is the final's only
inference; a discarded one changes nothing the client sees."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from bench.fake_recognizer import FakeRecognizer
from engine.api import LeftContext, Priority, RecognitionRequest, RecognitionResult, Utterance
from engine.scheduling.scheduler import BatchScheduler
from session.speculation import Speculator
from session.telemetry import NullTelemetry
from tests.support.appserver import serve_app, serving
from tests.support.corpus import clip
from tests.support.scheduling import scheduler_config
from tests.support.timeouts import EVENT_TIMEOUT
from tests.support.wsclient import StreamResult, stream_pcm, stream_url

TIMEOUT = EVENT_TIMEOUT


def utterance(n: int, draft: str = "", prompt: str = "") -> Utterance:
    return Utterance(np.full(n, 0.1, np.float32), "en", draft, prompt, word_timings=True)


def final(n: int, draft: str = "", prompt: str = "") -> RecognitionRequest:
    return RecognitionRequest("s", Priority.FINAL, utterance(n, draft, prompt))


@pytest.fixture
async def engine() -> AsyncIterator[tuple[BatchScheduler, FakeRecognizer]]:
    fake = FakeRecognizer()
    scheduler = BatchScheduler(fake, scheduler_config(max_batch_size=4, max_wait=0.0))
    scheduler.start()
    yield scheduler, fake
    await scheduler.stop()


@pytest.fixture
async def gated() -> AsyncIterator[tuple[BatchScheduler, FakeRecognizer]]:
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(fake, scheduler_config(max_batch_size=4, max_wait=0.0))
    scheduler.start()
    yield scheduler, fake
    fake.release(64)
    await scheduler.stop()


async def occupy(
    scheduler: BatchScheduler, fake: FakeRecognizer
) -> asyncio.Future[RecognitionResult]:
    """Submit a final of one sample and wait until its (gated) batch runs."""
    busy = await scheduler.submit(final(1))
    await asyncio.wait_for(asyncio.to_thread(fake.entered.wait, TIMEOUT), TIMEOUT)
    return busy


async def ran(fake: FakeRecognizer, batches: int) -> None:
    async with asyncio.timeout(TIMEOUT):
        while len(fake.batches) < batches:  # noqa: ASYNC110
            await asyncio.sleep(0.001)


async def test_a_used_speculation_is_the_finals_only_inference(
    engine: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """The final that decodes as the speculation did (another draft aside) takes its
    result: the recognizer ran that audio once."""
    scheduler, fake = engine
    speculator = Speculator(scheduler, NullTelemetry())
    await speculator.speculate("s", utterance(1000, draft="n=800"))
    await ran(fake, 1)
    future = await speculator.submit(final(1000, draft="n=900"))
    result = await asyncio.wait_for(future, TIMEOUT)
    assert result.transcription.text == "n=1000"
    assert fake.batches == [[1000]] and fake.timed == [1000]
    speculator.withdraw()  # nothing held any more: nothing counted
    assert speculator.outcomes == {"used": 1, "discarded": 0, "cancelled": 0}


async def test_a_discarded_speculation_changes_nothing(
    engine: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """Speech resumed (withdraw) or the final decodes otherwise (another prompt, other
    audio): the final is decoded on its own, with its own result."""
    scheduler, fake = engine
    speculator = Speculator(scheduler, NullTelemetry())
    await speculator.speculate("s", utterance(1000))
    await ran(fake, 1)
    speculator.withdraw()  # speech resumed after it ran
    await speculator.speculate("s", utterance(2000))
    await ran(fake, 2)
    other_prompt = await speculator.submit(final(2000, prompt="earlier words"))
    assert (await asyncio.wait_for(other_prompt, TIMEOUT)).transcription.text == "n=2000"
    speculator.withdraw()  # what the final did not take
    assert fake.batches == [[1000], [2000], [2000]]
    assert fake.prompts[-1] == (2000, "earlier words")
    assert speculator.outcomes == {"used": 0, "discarded": 2, "cancelled": 0}


async def test_a_final_with_left_context_does_not_take_a_speculation_without(
    engine: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """A speculation carries no left context: the final that has one (same audio) is
    decoded on its own, with it."""
    scheduler, fake = engine
    speculator = Speculator(scheduler, NullTelemetry())
    await speculator.speculate("s", utterance(1000))
    await ran(fake, 1)
    left = LeftContext(np.full(500, 0.2, np.float32), "said before")
    request = final(1000)
    request = dataclasses.replace(
        request, utterance=dataclasses.replace(request.utterance, left=left)
    )
    await asyncio.wait_for(await speculator.submit(request), TIMEOUT)
    speculator.withdraw()
    assert fake.batches == [[1000], [1000]]
    assert [u.left for u in fake.lefts] == [left]
    assert speculator.outcomes == {"used": 0, "discarded": 1, "cancelled": 0}


async def test_a_speculation_withdrawn_while_queued_costs_no_model_time(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """Withdrawn before a worker took it, a speculation is cancelled, never run."""
    scheduler, fake = gated
    speculator = Speculator(scheduler, NullTelemetry())
    busy = await occupy(scheduler, fake)
    await speculator.speculate("s", utterance(1000))
    speculator.withdraw()
    assert scheduler.queue_depth == 0
    fake.release()
    await asyncio.wait_for(busy, TIMEOUT)
    assert fake.batches == [[1]]
    assert speculator.outcomes == {"used": 0, "discarded": 0, "cancelled": 1}


async def test_a_speculation_tells_the_language_it_was_heard_in() -> None:
    """The turn model's words check reads the speculation's text and language: on
    `language=auto` that is the language detected, not English (session/turn_words.py)."""
    fake = FakeRecognizer(languages=frozenset({"en", "fr"}), detects=("fr", 0.9))
    scheduler = BatchScheduler(fake, scheduler_config(max_batch_size=4, max_wait=0.0))
    scheduler.start()
    speculator = Speculator(scheduler, NullTelemetry())
    assert await speculator.transcription(0.0) is None  # nothing held
    auto = Utterance(np.full(1000, 0.1, np.float32), None, "", "", word_timings=True)
    await speculator.speculate("s", auto)
    heard = await speculator.transcription(TIMEOUT)
    speculator.withdraw()
    await scheduler.stop()
    assert heard is not None and (heard.text, heard.language) == ("n=1000", "fr")


async def test_a_speculation_whose_words_are_asked_for_goes_before_partials(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """The turn model's words check waits on the speculation: from then on it is served
    as a flushing client's (before partials), not on the time partials leave."""
    scheduler, fake = gated
    speculator = Speculator(scheduler, NullTelemetry())
    busy = await occupy(scheduler, fake)
    partial = await scheduler.submit(
        RecognitionRequest("p", Priority.PARTIAL, utterance(30, draft="n=20"))
    )
    await speculator.speculate("s", utterance(1000))
    assert await speculator.transcription(0.0) is None  # not decoded yet
    fake.release(3)
    heard = await speculator.transcription(TIMEOUT)
    await asyncio.wait_for(asyncio.gather(busy, partial), TIMEOUT)
    speculator.withdraw()
    assert heard is not None and heard.text == "n=1000"
    assert fake.batches == [[1], [1000], [30]]


class Flushes(NullTelemetry):
    def __init__(self) -> None:
        self.served: list[str] = []

    def flush_answered(self, seconds: float, served: str) -> None:
        self.served.append(served)


async def test_a_speculation_held_up_by_an_open_final_is_made_when_it_commits(
    engine: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """While the final before it is open (its prompt unknown), no speculation is made;
    `retry` after that final commits makes it, and the flush's final takes it, counted
    as served by a speculation ready at the flush."""
    scheduler, fake = engine
    telemetry = Flushes()
    speculator = Speculator(scheduler, telemetry)
    known: list[Utterance | None] = [None]
    await speculator.speculate_when("s", lambda: known[0])
    await speculator.retry()
    assert fake.batches == []  # still not known: nothing submitted
    known[0] = utterance(1000)
    await speculator.retry()  # the final before it committed
    await ran(fake, 1)
    future = await speculator.submit(final(1000))
    await asyncio.wait_for(future, TIMEOUT)
    speculator.answered(future, since=0.0)
    speculator.answered(None, since=0.0)  # a flush with nothing speculated
    assert fake.batches == [[1000]]
    assert telemetry.served == ["speculation", "decoded"]
    known[0] = utterance(2000)
    await speculator.speculate_when("s", lambda: None)
    speculator.withdraw()  # speech resumed: what it wanted is forgotten too
    await speculator.retry()
    assert fake.batches == [[1000]]


def metric(text: str, outcome: str) -> float:
    line = f'parley_speculative_finals_total{{outcome="{outcome}"}} '
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))


async def jfk_through_the_app(
    meeting: str, speculate_after_ms: float
) -> tuple[StreamResult, FakeRecognizer, str]:
    """JFK streamed (4x real time, then 1 s of silence) through the real app with a fake
    recognizer: what the client got, the fake, and the app's /metrics after."""
    fake = FakeRecognizer()
    async with serve_app(serving(fake), speculate_after_ms=speculate_after_ms) as server:
        result = await stream_pcm(
            server.ws_url, meeting, clip("en_jfk").pcm16(), speed=4, trailing_silence=1.0
        )
        _, _, body = await server.request("GET", "/metrics")
    return result, fake, body.decode()


async def test_finals_are_the_same_with_speculation_on_and_off() -> None:
    """JFK through the real app and VAD: the finals (text, times, seq) are the same with
    speculation on and off; with it on, no final's audio was decoded twice, and the
    speculations are counted by outcome."""
    (off_result, off_fake, _), (on_result, on_fake, metrics) = [
        await jfk_through_the_app("spec", speculate_after_ms) for speculate_after_ms in (0.0, 160.0)
    ]
    off, on = (
        [(f["text"], f["start"], f["end"], f["seq"]) for f in result.finals]
        for result in (off_result, on_result)
    )
    assert on == off and len(on) >= 3
    for text, *_ in on:
        assert on_fake.timed.count(int(text[2:])) == 1  # the final's audio ran once
    assert off_fake.timed == [int(text[2:]) for text, *_ in off]
    used = metric(metrics, "used")
    wasted = metric(metrics, "discarded")
    assert used >= 1
    assert len(on_fake.timed) == len(on) + wasted  # every other timed run was a discard


async def test_a_speculation_before_the_post_roll_is_the_final_with_that_post_roll() -> None:
    """JFK through the real app and VAD, speculating at the first silent window (32 ms,
    less than the 100 ms post-roll): every final ending at a pause carries one window of
    post-roll, not three (the same utterances, each 2 windows shorter, the same order), and
    each final's audio ran once: the speculation made in that silence was the final."""
    (off_result, _, _), (on_result, on_fake, metrics) = [
        await jfk_through_the_app("early", speculate_after_ms) for speculate_after_ms in (0.0, 32.0)
    ]
    off, on = (
        [(int(f["text"][2:]), f["start"], f["seq"]) for f in result.finals]
        for result in (off_result, on_result)
    )
    assert len(on) == len(off) >= 3
    for (n_on, start_on, seq_on), (n_off, start_off, seq_off) in zip(on, off, strict=True):
        assert (start_on, seq_on) == (start_off, seq_off)
        assert n_on == n_off - 2 * 512  # one window of post-roll instead of three
        assert on_fake.timed.count(n_on) == 1  # the speculation was the final
    assert metric(metrics, "used") == len(on)


def record_submits(scheduler: BatchScheduler) -> list[RecognitionRequest]:
    """Every request submitted to `scheduler` from now on, in order (it still runs them)."""
    submitted: list[RecognitionRequest] = []
    submit = scheduler.submit

    async def recording(request: RecognitionRequest) -> asyncio.Future[RecognitionResult]:
        submitted.append(request)
        return await submit(request)

    scheduler.submit = recording  # type: ignore[method-assign]
    return submitted


async def send_paced(ws: ClientConnection, pcm: bytes) -> None:
    """`pcm` in 80 ms frames at 4x real time."""
    for at in range(0, len(pcm), 2560):
        await ws.send(pcm[at : at + 2560])
        await asyncio.sleep(0.02)


def awaited_speculations(requests: list[RecognitionRequest]) -> list[bool]:
    """Whether each speculation among `requests` was awaited."""
    return [r.awaited for r in requests if r.priority is Priority.SPECULATIVE]


def behind_context(requests: list[RecognitionRequest]) -> list[bool]:
    """Whether each final or speculation among `requests` carried left context."""
    finals = (Priority.SPECULATIVE, Priority.FINAL)
    return [r.utterance.left is not None for r in requests if r.priority in finals]


async def test_a_flushing_clients_speculations_are_awaited() -> None:
    """JFK through the real app: a native stream that sends no finalize speculates at the
    plain rank and decodes its finals behind the ones before; over Deepgram's /v1/listen
    (whose clients send Finalize) every speculation is awaited (before partials) and no
    final has left context, as on a native stream from its first finalize on."""
    async with serve_app(serving(FakeRecognizer())) as server:
        scheduler = server.state.scheduler
        assert scheduler is not None
        submitted = record_submits(scheduler)
        pcm = clip("en_jfk").pcm16()
        await stream_pcm(server.ws_url, "plain", pcm, speed=4, trailing_silence=1.0)
        plain = awaited_speculations(submitted)
        assert len(plain) >= 3 and not any(plain)
        assert any(behind_context(submitted))  # its later finals heard the earlier ones
        submitted.clear()
        async with connect(f"{server.ws_url}/v1/listen?encoding=linear16&sample_rate=16000") as ws:
            await send_paced(ws, pcm)
            await ws.send(bytes(32000))
            await ws.send('{"type": "CloseStream"}')
            async for _ in ws:  # drain until the server closes
                pass
        deepgram = awaited_speculations(submitted)
        assert len(deepgram) >= 3 and all(deepgram)
        behind = behind_context(submitted)
        assert len(behind) >= 3 and not any(behind)  # a client that flushes: no left context
        submitted.clear()
        async with connect(stream_url(server.ws_url, "flush", participant="p")) as ws:
            half = len(pcm) // 2 // 2 * 2
            for part in (pcm[:half], pcm[half:]):
                await send_paced(ws, part)
                await ws.send(bytes(16000))
                await ws.send('{"type": "finalize"}')
            await ws.send('{"type": "stop"}')
            async for _ in ws:
                pass
        flags = awaited_speculations(submitted)  # plain until the first finalize, then awaited
        assert False in flags and True in flags, flags
        assert flags == sorted(flags), flags


async def test_a_flushing_clients_finals_are_awaited(
    engine: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """A final no speculation served goes to the scheduler marked awaited once the client
    flushes (it waits on it: it goes first), unmarked before."""
    scheduler, _ = engine
    submitted = record_submits(scheduler)
    speculator = Speculator(scheduler, NullTelemetry())
    await asyncio.wait_for(await speculator.submit(final(1000)), TIMEOUT)
    speculator.awaited = True
    await asyncio.wait_for(await speculator.submit(final(2000)), TIMEOUT)
    assert [r.awaited for r in submitted] == [False, True]
