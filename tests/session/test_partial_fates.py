"""Why a partial was not sent: one withdrawn when its utterance ends costs no more
model time ('cancelled': a queued one never runs, a running one is stopped); one whose
result comes after its final was computed for nothing ('stale'). The two are counted
apart, so load tests see the waste.

Scheduling logic over the real scheduler and a fake recognizer."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from bench.fake_recognizer import FakeRecognizer
from engine.api import Priority
from engine.scheduling.scheduler import BatchScheduler
from session.outbox import Outbox
from session.partial_sender import PartialSender
from session.segmenter import PartialDue
from session.telemetry import NullTelemetry
from store.memory import MemoryStore
from tests.session.test_prompts import committer, utterance
from tests.support.scheduling import scheduler_config


class _Drops(NullTelemetry):
    def __init__(self) -> None:
        self.dropped: list[str] = []

    def partial_dropped(self, reason: str) -> None:
        self.dropped.append(reason)


def _due(index: int, samples: int) -> PartialDue:
    return PartialDue(index, 0, samples, np.zeros(samples, np.float32))


async def _settled(sender: PartialSender) -> None:
    async with asyncio.timeout(10):
        await asyncio.gather(*sender.tasks(), return_exceptions=True)


async def test_partials_withdrawn_at_their_utterance_end_are_cancelled_not_stale() -> None:
    """The queued partial never runs; the running one is stopped (its CPU goes to the
    final): both are 'cancelled', neither sent."""
    recognizer = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(recognizer, scheduler_config(max_batch_size=8, workers=1))
    scheduler.start()
    try:
        source = committer(scheduler)
        telemetry = _Drops()
        sender = PartialSender(
            source, "m", scheduler, MemoryStore(), Outbox(10), telemetry, time.monotonic
        )
        await sender.submit(_due(0, 1000))  # runs, held at the gate
        async with asyncio.timeout(10):
            await asyncio.to_thread(recognizer.entered.wait)
        await sender.submit(_due(0, 2000))  # queued behind it
        assert scheduler.cancel(source.config.engine_key, only=Priority.PARTIAL) == 1
        await _settled(sender)
        assert telemetry.dropped == ["cancelled", "cancelled"]
        assert sender.sent == 0
        assert recognizer.batches == [[1000]]  # the queued one never ran
        async with asyncio.timeout(10):  # the running one was stopped
            while not recognizer.stopped:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        assert recognizer.stopped == [[1000]]
    finally:
        await scheduler.stop()


async def test_a_partial_whose_result_comes_after_its_final_is_stale(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    recognizer, scheduler = fake
    source = committer(scheduler)
    telemetry = _Drops()
    sender = PartialSender(
        source, "m", scheduler, MemoryStore(), Outbox(10), telemetry, time.monotonic
    )
    await source.commit(await source.submit(utterance(0, 3000)))
    await sender.submit(_due(0, 1000))  # computed, but utterance 0 is committed already
    await _settled(sender)
    assert telemetry.dropped == ["stale"]
    assert [1000] in recognizer.batches
