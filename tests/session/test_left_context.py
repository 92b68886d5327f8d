"""The committer's left context: each final carries its source's previous utterance.

Scheduling logic over the real scheduler and a fake recognizer that records what each
utterance carried; tests/engine/test_context.py has what the model does with it.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.fake_recognizer import FakeRecognizer
from engine.api import SAMPLE_RATE, WordTiming
from engine.scheduling.scheduler import BatchScheduler
from session.final_order import PendingFinal
from session.said_before import LEFT_UTTERANCES, MAX_GAP, SaidBefore
from session.segmenter import UtteranceEnded, UtteranceMayEnd
from tests.session.test_prompts import committer
from tests.support.scheduling import scheduler_config
from tests.support.tasks import blocked


def utterance(index: int, start: float, seconds: float, value: float) -> UtteranceEnded:
    first = round(start * SAMPLE_RATE)
    samples = round(seconds * SAMPLE_RATE)
    return UtteranceEnded(index, first, first + samples, np.full(samples, value, np.float32))


async def test_each_final_hears_the_utterances_before_it_and_the_gaps(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    """Four finals cut at once: each waits for the one before it and carries the last
    LEFT_UTTERANCES utterances before it (audio, then its gap as zeros, at most MAX_GAP)
    and their finals' text; the first carries none."""
    recognizer, scheduler = fake
    source = committer(scheduler, left_context=10.0)
    events = [
        utterance(0, 0.0, 2.0, 0.1),
        utterance(1, 2.5, 3.0, 0.2),  # 0.5 s after the first
        utterance(2, 9.0, 1.0, 0.3),  # 3.5 s after the second
        utterance(3, 10.5, 1.0, 0.4),
    ]
    pending: list[PendingFinal] = [await source.submit(event) for event in events]
    assert [p.future is not None for p in pending] == [True, False, False, False]
    for p in pending:
        await source.commit(p)
    assert [p.utterance.left is None for p in pending] == [True, False, False, False]
    lefts = [u.left for u in recognizer.lefts]
    assert all(left is not None for left in lefts)
    second, third, fourth = (left for left in lefts if left is not None)
    assert second.text == f"n={2 * SAMPLE_RATE}"
    assert second.duration == pytest.approx(2.5)  # the 0.5 s gap in full
    assert np.all(second.audio[: 2 * SAMPLE_RATE] == np.float32(0.1))
    assert not second.audio[2 * SAMPLE_RATE :].any()
    assert third.text == f"n={2 * SAMPLE_RATE} n={3 * SAMPLE_RATE}"
    assert third.duration == pytest.approx(2.5 + 3.0 + MAX_GAP)  # a 3.5 s gap, shortened
    assert np.all(third.audio[round(2.5 * SAMPLE_RATE) :][: 3 * SAMPLE_RATE] == np.float32(0.2))
    assert LEFT_UTTERANCES == 2
    assert fourth.text == f"n={3 * SAMPLE_RATE} n={SAMPLE_RATE}"  # the last two only
    assert fourth.duration == pytest.approx(3.0 + MAX_GAP + 1.0 + 0.5)


async def test_no_context_after_an_empty_final_or_past_the_limit(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    """A final the guard emptied gives the next none (nothing was said to force); nor
    does a previous utterance that with its gap lasts longer than `left_context`; of
    two, only the last fits."""
    recognizer, scheduler = fake
    recognizer.empty_on = 3 * SAMPLE_RATE
    source = committer(scheduler, left_context=5.0)
    events = [
        utterance(0, 0.0, 3.0, 0.1),  # emptied
        utterance(1, 3.5, 4.8, 0.2),  # no context: the one before said nothing
        utterance(2, 8.8, 1.0, 0.3),  # no context: 4.8 s + 0.5 s of gap > 5 s
        utterance(3, 10.0, 1.0, 0.4),  # 1 s + 0.2 s: context (not the 4.8 s one too)
    ]
    for event in events:
        await source.commit(await source.submit(event))
    assert [len(u.audio) for u in recognizer.lefts] == [SAMPLE_RATE]
    assert recognizer.lefts[0].left is not None
    assert recognizer.lefts[0].left.duration == pytest.approx(1.2)


async def test_left_context_off_submits_every_final_at_once(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    """With left_context 0 (and prompts off) finals go to the engine as they are cut,
    with no context."""
    recognizer, scheduler = fake
    source = committer(scheduler, left_context=0.0)
    pending = [await source.submit(utterance(i, 2.0 * i, 1.0, 0.1)) for i in range(3)]
    assert all(p.future is not None for p in pending)
    for p in pending:
        await source.commit(p)
    assert recognizer.lefts == []


@pytest.mark.parametrize("context_after_flush", [False, True])
async def test_a_source_whose_client_flushed_goes_on_without_left_context(
    fake: tuple[FakeRecognizer, BatchScheduler], context_after_flush: bool
) -> None:
    """After the client's first flush, a source's finals carry no left context, nor does
    what it speculates, but for one that goes on from a cut in mid-speech: its context is
    essential. CONTEXT_AFTER_FLUSH keeps the context."""
    _, scheduler = fake
    source = committer(scheduler, left_context=10.0, context_after_flush=context_after_flush)
    first = await source.submit(utterance(0, 0.0, 2.0, 0.1))
    await source.commit(first)
    second = await source.submit(utterance(1, 2.5, 1.0, 0.2))  # cut by the flush
    source.flushed()
    await source.commit(second)
    assert second.utterance.left is not None  # cut before the flush took effect
    event = utterance(2, 4.0, 1.0, 0.3)
    speculated = source.speculative_utterance(
        UtteranceMayEnd(event.index, event.start, event.end, event.audio), draft=""
    )
    assert speculated is not None and (speculated.left is not None) == context_after_flush
    later = await source.submit(event)
    await source.commit(later)
    assert (later.utterance.left is not None) == context_after_flush
    going_on = UtteranceEnded(3, event.end, event.end + SAMPLE_RATE, event.audio, continues=True)
    cut_in_speech = await source.submit(going_on)
    await source.commit(cut_in_speech)
    left = cut_in_speech.utterance.left
    assert left is not None and left.essential


async def test_a_live_final_waits_for_the_one_before_it_at_most_context_wait() -> None:
    """A final cut while the one before it is held in the engine (and being committed):
    after `context_wait` it goes without context, beside that one (not behind it). A
    third cut then waits for the second and hears the two before it."""
    recognizer = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(recognizer, scheduler_config(max_batch_size=8))
    scheduler.start()
    try:
        source = committer(scheduler, left_context=10.0, context_wait=0.5)
        events = [utterance(i, 2.0 * i, 1.0 + i / 4, 0.1) for i in range(3)]
        pending = [await source.submit(events[0])]
        first = await blocked(source.commit(pending[0]))  # it awaits the first's result
        async with asyncio.timeout(5):  # the first is held in the engine, not still queued
            while not recognizer.entered.is_set():  # noqa: ASYNC110 - a thread's event
                await asyncio.sleep(0.01)
        pending.append(await source.submit(events[1]))
        assert pending[1].future is None
        async with asyncio.timeout(5):
            while pending[1].future is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert pending[1].utterance.left is None
        assert scheduler.queue_depth == 1  # the second, queued behind the held first
        pending.append(await source.submit(events[2]))
        assert pending[2].future is None  # its context (the second) is still open
        recognizer.release(10)
        for p in pending[1:]:
            await asyncio.wait_for(source.commit(p), 5)
        await first
    finally:
        await scheduler.stop()
    assert [len(u.audio) for u in recognizer.lefts] == [round(1.5 * SAMPLE_RATE)]
    third = pending[2].utterance.left
    assert third is not None
    assert third.text == f"n={SAMPLE_RATE} n={round(1.25 * SAMPLE_RATE)}"
    assert third.shorter is not None and third.shorter.text == f"n={round(1.25 * SAMPLE_RATE)}"


async def test_a_source_in_a_language_without_left_context_sends_its_finals_at_once() -> None:
    """Left context for English only: a Spanish source's finals go to the engine as they
    are cut, without context; a source detected as Spanish sends the finals that waited
    for the detecting one all at once, in Spanish, without context."""
    recognizer = FakeRecognizer(languages=frozenset({"en", "es"}), detects=("es", 0.95))
    scheduler = BatchScheduler(recognizer, scheduler_config(max_batch_size=8))
    scheduler.start()
    english = frozenset({"en"})
    try:
        spanish = committer(scheduler, left_context=10.0, language="es", context_languages=english)
        pending = [await spanish.submit(utterance(i, 2.0 * i, 1.0, 0.1)) for i in range(3)]
        assert all(p.future is not None for p in pending)
        for p in pending:
            await spanish.commit(p)
        detected = committer(scheduler, left_context=10.0, language=None, context_languages=english)
        pending = [await detected.submit(utterance(i, 2.0 * i, 1.0, 0.1)) for i in range(3)]
        assert [p.future is not None for p in pending] == [True, False, False]
        await detected.commit(pending[0])
        assert detected.language == "es"
        assert all(p.future is not None for p in pending[1:])  # both at once
        for p in pending[1:]:
            await detected.commit(p)
    finally:
        await scheduler.stop()
    assert recognizer.lefts == []
    assert recognizer.asked == ["es"] * 3 + [None, "es", "es"]


def test_the_context_carries_its_finals_words_on_its_own_audio() -> None:
    """The finals' word timings move onto the context's audio (each utterance after the
    ones before it and their gaps), so a recognizer can cut it at a word; a context with
    an untimed utterance in it carries none (its words would not make its text)."""
    said = SaidBefore()
    one = (WordTiming(" One", 0.1, 0.5, 0.9), WordTiming(" two.", 0.6, 1.0, 0.9))
    three = (WordTiming(" Three.", 0.2, 0.7, 0.9),)
    said.add(0, 0, 2 * SAMPLE_RATE, np.zeros(2 * SAMPLE_RATE, np.float32), "One two.", one)
    said.add(
        1, 3 * SAMPLE_RATE, 4 * SAMPLE_RATE, np.zeros(SAMPLE_RATE, np.float32), "Three.", three
    )
    left = said.before(2, round(4.5 * SAMPLE_RATE), 10.0)
    assert left is not None and left.text == "One two. Three."
    assert "".join(w.word for w in left.words).strip() == left.text
    assert [(w.start, w.end) for w in left.words] == [(0.1, 0.5), (0.6, 1.0), (3.2, 3.7)]
    assert left.shorter is not None and left.shorter.words == (
        (WordTiming(" Three.", 0.2, 0.7, 0.9)),
    )
    untimed = SaidBefore()
    untimed.add(0, 0, 2 * SAMPLE_RATE, np.zeros(2 * SAMPLE_RATE, np.float32), "One two.")
    untimed.add(
        1, 3 * SAMPLE_RATE, 4 * SAMPLE_RATE, np.zeros(SAMPLE_RATE, np.float32), "Three.", three
    )
    mixed = untimed.before(2, round(4.5 * SAMPLE_RATE), 10.0)
    assert mixed is not None and mixed.words == () and mixed.shorter is not None
    assert mixed.shorter.words == three


async def test_an_utterance_that_goes_on_from_a_cut_has_an_essential_context(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    """The utterance after a client's cut in mid-speech (`continues`) carries the cut one
    as an essential left context (the scheduler never sheds it), its text without the
    word the cut fell in (the fake's text is one word); one after a pause does not."""
    recognizer, scheduler = fake
    source = committer(scheduler, left_context=10.0)
    cut = utterance(0, 0.0, 2.0, 0.1)
    after = utterance(1, 2.0, 1.0, 0.2)
    going_on = UtteranceEnded(after.index, after.start, after.end, after.audio, continues=True)
    later = utterance(2, 4.0, 1.0, 0.3)
    for event in (cut, going_on, later):
        await source.commit(await source.submit(event))
    lefts = [u.left for u in recognizer.lefts]
    assert [left is not None and left.essential for left in lefts] == [True, False]
    assert lefts[0] is not None and lefts[0].duration == pytest.approx(2.0)  # no gap
    assert lefts[0].text == "" and lefts[1] is not None and lefts[1].text == "n=32000 n=16000"
