"""BatchScheduler logic with a fake recognizer: batching, priorities, replacement, errors."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np
import pytest

from bench.fake_recognizer import FakeRecognizer
from engine.api import (
    BatchFailed,
    EngineDead,
    LeftContext,
    Priority,
    RecognitionRequest,
    RecognitionResult,
    RequestSuperseded,
    SchedulerFull,
    SchedulerStopped,
    Utterance,
)
from engine.scheduling.scheduler import BatchScheduler, SchedulerState
from tests.support.scheduling import scheduler_config
from tests.support.tasks import blocked
from tests.support.timeouts import EVENT_TIMEOUT

TIMEOUT = EVENT_TIMEOUT


def request(session: str, n: int, priority: Priority = Priority.FINAL) -> RecognitionRequest:
    return RecognitionRequest(session, priority, Utterance(np.zeros(n, dtype=np.float32)))


async def wait_entered(fake: FakeRecognizer) -> None:
    await asyncio.wait_for(asyncio.to_thread(fake.entered.wait, TIMEOUT), TIMEOUT)
    fake.entered.clear()


async def occupy(
    scheduler: BatchScheduler, fake: FakeRecognizer
) -> asyncio.Future[RecognitionResult]:
    """Submit a final of one sample and wait until its (gated) batch runs."""
    busy = await scheduler.submit(request("busy", 1))
    await wait_entered(fake)
    return busy


async def checked_after_plan(scheduler: BatchScheduler, fake: FakeRecognizer) -> None:
    """Wait until the scheduler has planned with what was submitted, then until the running
    gated batch has asked `should_stop` since: had the plan stopped it, it is in
    `fake.stopped` by then."""
    await asyncio.wait_for(scheduler.planned(), TIMEOUT)
    fake.checked.clear()
    await asyncio.wait_for(asyncio.to_thread(fake.checked.wait, TIMEOUT), TIMEOUT)


@contextlib.asynccontextmanager
async def started(scheduler: BatchScheduler) -> AsyncIterator[BatchScheduler]:
    """The scheduler, started for the block and stopped after it (a failed test too)."""
    scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()


@pytest.fixture
async def gated() -> AsyncIterator[tuple[BatchScheduler, FakeRecognizer]]:
    """A gated scheduler whose finals stop every partial batch (partial_wait 0: the wait
    for a batch about to end has a test of its own)."""
    fake = FakeRecognizer(gated=True)
    async with started(
        BatchScheduler(
            fake,
            scheduler_config(max_batch_size=4, max_wait=0.0, max_queue=8, partial_wait=0.0),
        )
    ) as scheduler:
        yield scheduler, fake
        fake.release(64)


async def test_requests_from_several_sessions_share_one_batch() -> None:
    """Requests of three sessions submitted together run as one batch."""
    fake = FakeRecognizer()
    async with started(
        BatchScheduler(fake, scheduler_config(max_batch_size=8, max_wait=0.05))
    ) as scheduler:
        futures = [await scheduler.submit(request(f"s{i}", 100 + i)) for i in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)
    assert [r.transcription.text for r in results] == ["n=100", "n=101", "n=102"]
    assert fake.batches == [[100, 101, 102]]
    assert scheduler.stats.batch_sessions == [frozenset({"s0", "s1", "s2"})]
    assert all(r.batch_size == 3 for r in results)


async def test_batch_size_is_bounded() -> None:
    """Ten queued requests with max_batch_size 4 run as batches of 4, 4 and 2."""
    fake = FakeRecognizer()
    async with started(
        BatchScheduler(fake, scheduler_config(max_batch_size=4, max_wait=0.05))
    ) as scheduler:
        futures = [await scheduler.submit(request(f"s{i}", i + 1)) for i in range(10)]
        await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)
    assert [len(b) for b in fake.batches] == [4, 4, 2]


async def test_finals_are_served_before_partials(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """While a batch runs, queued finals (then file requests) make the next batch, and the
    older partials the one after: partials never ride in a batch of finals."""
    scheduler, fake = gated
    first = await occupy(scheduler, fake)
    partials = [
        await scheduler.submit(request(f"p{i}", 10 + i, Priority.PARTIAL)) for i in range(4)
    ]
    files = [await scheduler.submit(request("file", 30, Priority.FILE))]
    finals = [await scheduler.submit(request(f"f{i}", 20 + i)) for i in range(2)]
    fake.release()
    await first
    await wait_entered(fake)
    assert fake.batches[1] == [20, 21, 30]
    fake.release()
    await wait_entered(fake)
    assert fake.batches[2] == [10, 11, 12, 13]
    fake.release()
    await asyncio.wait_for(asyncio.gather(*partials, *files, *finals), TIMEOUT)


async def test_newer_partial_replaces_queued_one(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """A session's second partial replaces its queued first; the first fails superseded."""
    scheduler, fake = gated
    busy = await occupy(scheduler, fake)
    old = await scheduler.submit(request("s", 10, Priority.PARTIAL))
    new = await scheduler.submit(request("s", 11, Priority.PARTIAL))
    assert scheduler.queue_depth == 1
    with pytest.raises(RequestSuperseded):
        await old
    fake.release()
    await busy
    fake.release()
    assert (await asyncio.wait_for(new, TIMEOUT)).transcription.text == "n=11"
    assert scheduler.stats.partials_superseded == 1


async def test_cancel_drops_a_sessions_queued_requests(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """cancel(session) cancels that session's queued futures and no other's."""
    scheduler, fake = gated
    busy = await occupy(scheduler, fake)
    mine = [
        await scheduler.submit(request("gone", 5)),
        await scheduler.submit(request("gone", 6, Priority.PARTIAL)),
    ]
    other = await scheduler.submit(request("stays", 7))
    assert scheduler.cancel("gone") == 2
    assert all(f.cancelled() for f in mine)
    fake.release(2)
    await busy
    assert (await asyncio.wait_for(other, TIMEOUT)).transcription.text == "n=7"
    assert [5, 6] not in fake.batches and fake.batches[-1] == [7]


async def test_recognizer_error_fails_exactly_its_batch() -> None:
    """A failing batch fails its own futures; the next batch succeeds."""
    fake = FakeRecognizer()
    async with started(
        BatchScheduler(fake, scheduler_config(max_batch_size=2, max_wait=0.05))
    ) as scheduler:
        fake.fail_on = 13
        bad = [await scheduler.submit(request("a", 13)), await scheduler.submit(request("b", 14))]
        good = await scheduler.submit(request("c", 15))
        outcomes = await asyncio.wait_for(asyncio.gather(*bad, return_exceptions=True), TIMEOUT)
        assert all(isinstance(o, BatchFailed) for o in outcomes)
        assert (await asyncio.wait_for(good, TIMEOUT)).transcription.text == "n=15"
        assert scheduler.stats.failed_batches == 1
        after = await scheduler.submit(request("d", 16))
        assert (await asyncio.wait_for(after, TIMEOUT)).transcription.text == "n=16"


async def test_length_mismatch_fails_the_batch() -> None:
    """A recognizer returning fewer results than inputs fails every future of the batch."""
    fake = FakeRecognizer()
    fake.wrong_length = True
    async with started(
        BatchScheduler(fake, scheduler_config(max_batch_size=4, max_wait=0.05))
    ) as scheduler:
        futures = [await scheduler.submit(request(f"s{i}", i + 1)) for i in range(3)]
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), TIMEOUT)
    assert all(isinstance(o, BatchFailed) for o in outcomes)


async def test_full_queue_rejects_partials_and_holds_finals(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """At the bound a new partial fails SchedulerFull; a final waits for room and then runs."""
    scheduler, fake = gated
    busy = await occupy(scheduler, fake)
    queued = [await scheduler.submit(request(f"s{i}", 10 + i)) for i in range(8)]
    with pytest.raises(SchedulerFull):
        await scheduler.submit(request("p", 99, Priority.PARTIAL))
    waiting = await blocked(scheduler.submit(request("late", 50)))
    assert not waiting.done()
    fake.release(4)
    late = await asyncio.wait_for(waiting, TIMEOUT)
    assert (await asyncio.wait_for(late, TIMEOUT)).transcription.text == "n=50"
    await asyncio.wait_for(asyncio.gather(busy, *queued), TIMEOUT)
    assert scheduler.stats.partials_rejected == 1


async def test_stop_fails_queued_requests_and_refuses_new_ones(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """stop() fails the running and queued futures with SchedulerStopped; submit refuses."""
    scheduler, fake = gated
    busy = await occupy(scheduler, fake)
    queued = await scheduler.submit(request("s", 2))
    stopping = asyncio.create_task(scheduler.stop())
    await asyncio.sleep(0)
    fake.release()
    await asyncio.wait_for(stopping, TIMEOUT)
    outcomes = await asyncio.gather(busy, queued, return_exceptions=True)
    assert all(isinstance(o, SchedulerStopped) for o in outcomes)
    assert fake.batches == [[1]]
    with pytest.raises(SchedulerStopped):
        await scheduler.submit(request("s", 3))


async def test_a_dead_loop_fails_waiting_and_later_requests_at_once(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """When the loop dies (here: an observer raises after a batch), the scheduler is DEAD:
    queued requests and a final waiting for room fail with EngineDead at once, and so does
    every later submit; nothing more runs."""
    scheduler, fake = gated

    def broken_observer(*_: object) -> None:
        raise ValueError("observer bug")

    scheduler.add_observer(broken_observer)
    busy = await occupy(scheduler, fake)
    queued = [await scheduler.submit(request(f"s{i}", 10 + i)) for i in range(7)]
    queued.append(await scheduler.submit(request("p", 20, Priority.PARTIAL)))
    waiting = await blocked(scheduler.submit(request("late", 50)))  # queue is full
    assert not waiting.done()
    fake.release()
    assert (await asyncio.wait_for(busy, TIMEOUT)).transcription.text == "n=1"
    outcomes = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 1.0)
    assert all(isinstance(o, EngineDead) for o in outcomes), outcomes
    with pytest.raises(EngineDead, match="ValueError: observer bug"):
        await asyncio.wait_for(waiting, 1.0)
    assert scheduler.state is SchedulerState.DEAD
    assert scheduler.death is not None and "observer bug" in scheduler.death.reason
    for priority in Priority:
        with pytest.raises(EngineDead):
            await asyncio.wait_for(scheduler.submit(request("new", 60, priority)), 1.0)
    assert fake.batches == [[1]] and not scheduler.has_unfinished_requests()


async def test_utilization_counts_recent_model_time_of_every_worker() -> None:
    """Utilization: the workers' busy time over the last 2 s window, per worker."""
    now = [100.0]
    fake = FakeRecognizer(gated=True)
    async with started(
        BatchScheduler(
            fake,
            scheduler_config(workers=2, max_batch_size=4, max_wait=0.0, max_queue=8),
            clock=lambda: now[0],
        )
    ) as scheduler:
        assert scheduler.utilization == 0.0
        busy = await scheduler.submit(request("a", 1))
        await wait_entered(fake)
        now[0] += 1.0  # one of two workers, one second into its batch: a quarter of 2 x 2 s
        assert scheduler.utilization == pytest.approx(0.25)
        fake.release()
        await asyncio.wait_for(busy, TIMEOUT)
        now[0] += 3.0  # the batch ended more than a window ago
        assert scheduler.utilization == 0.0


async def test_a_final_stops_a_running_partial_batch_which_runs_again_after(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """One worker busy with partials: a final stops that batch at its next step and runs
    first; the partials go back to the queue and run after it (none is lost)."""
    scheduler, fake = gated
    partials = [
        await scheduler.submit(request(f"p{i}", 10 + i, Priority.PARTIAL)) for i in range(2)
    ]
    await wait_entered(fake)
    final = await scheduler.submit(request("f", 20))
    await wait_entered(fake)
    assert fake.stopped == [[10, 11]] and fake.batches[-1] == [20]
    fake.release()
    result = await asyncio.wait_for(final, TIMEOUT)
    assert result.queue_wait < 1.0
    await wait_entered(fake)
    assert fake.batches[-1] == [10, 11]
    fake.release()
    texts = [(await asyncio.wait_for(p, TIMEOUT)).transcription.text for p in partials]
    assert texts == ["n=10", "n=11"]
    assert scheduler.stats.preempted_batches == 1
    assert scheduler.stats.model_seconds[Priority.PARTIAL] > 0
    assert scheduler.stats.model_seconds[Priority.FINAL] > 0


async def test_a_final_waits_for_a_partial_batch_about_to_end() -> None:
    """Until a partial row's cost is known, partial batches hold one row; once measured
    (0.1 s), what runs within `partial_wait` (0.25 s: two rows), and a final that finds
    the worker on such a batch waits for it instead of stopping it (its work is not
    thrown away); the final then goes first."""
    now = [0.0]
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake,
        scheduler_config(max_batch_size=4, max_wait=0.0, max_queue=8, partial_wait=0.25),
        clock=lambda: now[0],
    )
    async with started(scheduler):
        first = await scheduler.submit(request("a", 10, Priority.PARTIAL))
        waiting = await scheduler.submit(request("z", 9, Priority.PARTIAL))
        await wait_entered(fake)
        assert fake.batches == [[10]]  # the cost is not known yet: one row
        now[0] += 0.1
        fake.release()
        await asyncio.wait_for(first, TIMEOUT)
        await wait_entered(fake)
        now[0] += 0.1
        fake.release()
        await asyncio.wait_for(waiting, TIMEOUT)
        partials = [
            await scheduler.submit(request(s, n, Priority.PARTIAL))
            for s, n in (("b", 11), ("c", 12), ("d", 13))
        ]
        await wait_entered(fake)
        assert fake.batches[-1] == [11, 12]  # two rows of 0.1 s fit 0.25 s
        final = await scheduler.submit(request("f", 20))
        await checked_after_plan(scheduler, fake)
        assert fake.stopped == [] and scheduler.stats.preempted_batches == 0
        fake.release()
        await wait_entered(fake)
        assert fake.batches[-1] == [20]
        fake.release(2)
        await asyncio.wait_for(asyncio.gather(final, *partials), TIMEOUT)
        assert fake.batches[-1] == [13]


async def test_flat_batches_take_every_queued_partial_and_a_final_waits_for_them() -> None:
    """With flat batches (a GPU) a row measured at 0.1 s does not hold later partial
    batches to what fits `partial_wait` by rows: the next takes every queued partial (up
    to `max_partial_batch`), is expected to take a batch's 0.1 s, and a final that finds
    the worker on it waits instead of stopping it."""
    now = [0.0]
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake,
        scheduler_config(
            max_batch_size=4, max_wait=0.0, max_queue=8, partial_wait=0.25, flat_batches=True
        ),
        clock=lambda: now[0],
    )
    async with started(scheduler):
        first = await scheduler.submit(request("a", 10, Priority.PARTIAL))
        await wait_entered(fake)
        assert fake.batches == [[10]]  # the cost is not known yet: one row
        partials = [
            await scheduler.submit(request(s, n, Priority.PARTIAL))
            for s, n in (("b", 11), ("c", 12), ("d", 13), ("e", 14), ("g", 15))
        ]
        now[0] += 0.1
        fake.release()
        await asyncio.wait_for(first, TIMEOUT)
        await wait_entered(fake)
        assert fake.batches[-1] == [11, 12, 13, 14]  # per row, 0.25 s would fit two
        final = await scheduler.submit(request("f", 20))
        await checked_after_plan(scheduler, fake)
        assert fake.stopped == [] and scheduler.stats.preempted_batches == 0
        fake.release()
        await wait_entered(fake)
        assert fake.batches[-1] == [20]
        fake.release(2)
        await asyncio.wait_for(asyncio.gather(final, *partials), TIMEOUT)
        assert fake.batches[-1] == [15]


async def test_a_stopped_partial_gives_way_to_a_newer_one_of_its_session(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """A partial whose batch was stopped is superseded if its session sent a newer one."""
    scheduler, fake = gated
    old = await scheduler.submit(request("s", 10, Priority.PARTIAL))
    await wait_entered(fake)
    new = await scheduler.submit(request("s", 11, Priority.PARTIAL))
    final = await scheduler.submit(request("f", 20))
    await wait_entered(fake)
    with pytest.raises(RequestSuperseded):
        await asyncio.wait_for(old, TIMEOUT)
    fake.release(2)
    await asyncio.wait_for(final, TIMEOUT)
    assert (await asyncio.wait_for(new, TIMEOUT)).transcription.text == "n=11"
    assert fake.batches == [[10], [20], [11]]


async def test_with_two_workers_a_final_runs_beside_a_partial_batch() -> None:
    """Two workers: partials take one, a final takes the other at once; nothing is stopped."""
    fake = FakeRecognizer(gated=True)
    async with started(
        BatchScheduler(fake, scheduler_config(workers=2, max_batch_size=4, max_wait=0.0))
    ) as scheduler:
        partial = await scheduler.submit(request("p", 10, Priority.PARTIAL))
        await wait_entered(fake)
        final = await scheduler.submit(request("f", 20))
        await wait_entered(fake)
        assert fake.batches == [[10], [20]] and fake.stopped == []
        fake.release(2)
        await asyncio.wait_for(asyncio.gather(partial, final), TIMEOUT)


async def test_partials_go_stalest_session_first() -> None:
    """Round robin: a session whose partial just ran waits behind the others, even when
    its next partial arrives before theirs run."""
    fake = FakeRecognizer(gated=True)
    async with started(
        BatchScheduler(fake, scheduler_config(max_batch_size=1, max_wait=0.0))
    ) as scheduler:
        busy = await occupy(scheduler, fake)
        sessions = [("a", 10), ("b", 20), ("c", 30)]
        first = [await scheduler.submit(request(s, n, Priority.PARTIAL)) for s, n in sessions]
        fake.release()
        await wait_entered(fake)  # a's partial runs: it waited longest
        again = await scheduler.submit(request("a", 11, Priority.PARTIAL))
        fake.release(4)
        await asyncio.wait_for(asyncio.gather(busy, *first, again), TIMEOUT)
        assert fake.batches == [[1], [10], [20], [30], [11]]


def partial(session: str, n: int, draft: str = "") -> RecognitionRequest:
    """A partial; `draft`: its utterance's latest partial text ("": it has shown none)."""
    audio = np.zeros(n, dtype=np.float32)
    return RecognitionRequest(session, Priority.PARTIAL, Utterance(audio, draft=draft))


async def test_an_utterances_first_partial_goes_before_staler_later_ones() -> None:
    """A partial whose utterance has shown none (empty draft) runs before the partials of
    sessions that waited longer; a session's next partial, queued while its first ran,
    is not a first one once that came back with text, though its draft is still empty."""
    fake = FakeRecognizer(gated=True)
    async with started(
        BatchScheduler(fake, scheduler_config(max_batch_size=1, max_wait=0.0))
    ) as scheduler:
        busy = await occupy(scheduler, fake)
        later = [
            await scheduler.submit(partial("b", 20, draft="earlier")),
            await scheduler.submit(partial("c", 30, draft="earlier")),
        ]
        first = await scheduler.submit(partial("a", 10))
        fake.release()
        await wait_entered(fake)  # a's first partial runs, ahead of b's and c's
        next_of_a = await scheduler.submit(partial("a", 11))
        fake.release(4)
        await asyncio.wait_for(asyncio.gather(busy, *later, first, next_of_a), TIMEOUT)
        assert fake.batches == [[1], [10], [20], [30], [11]]


async def test_busy_history_stays_bounded_without_readers_of_utilization() -> None:
    """Finals-only streams and uploads never read `utilization` (only partials do): the
    record of recent batches is still trimmed to the load window, not one entry per batch
    for the process's life."""
    now = [0.0]

    def clock() -> float:
        now[0] += 0.1  # every reading of the clock is 0.1 s later: ~5 per batch
        return now[0]

    fake = FakeRecognizer()
    async with started(
        BatchScheduler(
            fake, scheduler_config(max_batch_size=1, max_wait=0.0, max_queue=1), clock=clock
        )
    ) as scheduler:
        for i in range(300):
            await asyncio.wait_for(await scheduler.submit(request(f"s{i}", 10)), TIMEOUT)
        assert scheduler.stats.batches == 300
        spans = scheduler.busy.spans
        assert len(spans) <= 10, len(spans)  # 2 s window, ~0.5 s a batch


SPECULATIVE = Priority.SPECULATIVE


async def test_a_final_stops_a_speculative_batch_which_runs_again_after(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """A speculative final runs on the free worker; a final stops it and runs first, then
    the speculation runs again (nothing lost)."""
    scheduler, fake = gated
    early = await scheduler.submit(request("s", 10, SPECULATIVE))
    await wait_entered(fake)
    final = await scheduler.submit(request("f", 20))
    await wait_entered(fake)
    assert fake.stopped == [[10]] and fake.batches[-1] == [20]
    fake.release()
    await asyncio.wait_for(final, TIMEOUT)
    await wait_entered(fake)
    fake.release()
    assert (await asyncio.wait_for(early, TIMEOUT)).transcription.text == "n=10"
    assert fake.batches == [[10], [20], [10]]


async def test_speculation_waits_for_finals_and_partials(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """Queued behind a busy worker: finals run first, then the partial (within its
    budget), then the speculative final; a newer speculation of the session replaces its
    queued one."""
    scheduler, fake = gated
    busy = await scheduler.submit(request("busy", 1))
    await wait_entered(fake)
    partial = await scheduler.submit(request("p", 30, Priority.PARTIAL))
    old = await scheduler.submit(request("s", 10, SPECULATIVE))
    early = await scheduler.submit(request("s", 11, SPECULATIVE))
    final = await scheduler.submit(request("f", 20))
    with pytest.raises(RequestSuperseded):
        await old
    fake.release(4)
    await asyncio.wait_for(asyncio.gather(busy, partial, early, final), TIMEOUT)
    assert fake.batches == [[1], [20], [30], [11]]


async def test_an_awaited_speculation_runs_before_partials(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """A speculation whose client flushes (`awaited`) is queued behind a busy worker with
    a partial: it runs right after the finals, before the partial."""
    scheduler, fake = gated
    busy = await scheduler.submit(request("busy", 1))
    await wait_entered(fake)
    partial = await scheduler.submit(request("p", 30, Priority.PARTIAL))
    awaited = dataclasses.replace(request("s", 11, SPECULATIVE), awaited=True)
    early = await scheduler.submit(awaited)
    final = await scheduler.submit(request("f", 20))
    fake.release(4)
    await asyncio.wait_for(asyncio.gather(busy, partial, early, final), TIMEOUT)
    assert fake.batches == [[1], [20], [11], [30]]


async def test_a_final_waits_for_a_running_awaited_speculation(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """An awaited speculation (its client's flush is ~0.1 s away) is not stopped by a
    final, which runs after it: nothing of it is thrown away."""
    scheduler, fake = gated
    awaited = dataclasses.replace(request("s", 10, SPECULATIVE), awaited=True)
    early = await scheduler.submit(awaited)
    await wait_entered(fake)
    final = await scheduler.submit(request("f", 20))
    fake.release()
    assert (await asyncio.wait_for(early, TIMEOUT)).transcription.text == "n=10"
    await wait_entered(fake)
    fake.release()
    await asyncio.wait_for(final, TIMEOUT)
    assert fake.stopped == [] and fake.batches == [[10], [20]]


async def test_an_expedited_speculation_runs_before_partials_and_is_not_stopped(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """A plain speculation that a turn decision comes to wait on (`expedite`) is served
    as an awaited one: queued, it runs before a partial queued ahead of it; running, a
    final does not stop it. Expediting it changes nothing for `promote` (the same
    request object)."""
    scheduler, fake = gated
    busy = await scheduler.submit(request("busy", 1))
    await wait_entered(fake)
    partial = await scheduler.submit(request("p", 30, Priority.PARTIAL))
    speculated = request("s", 11, SPECULATIVE)
    early = await scheduler.submit(speculated)
    assert scheduler.expedite(speculated)
    fake.release()
    await wait_entered(fake)  # the speculation runs: a final must wait for it
    final = await scheduler.submit(request("f", 20))
    await checked_after_plan(scheduler, fake)
    assert fake.stopped == []
    assert scheduler.promote(speculated)
    fake.release(3)
    await asyncio.wait_for(asyncio.gather(busy, partial, early, final), TIMEOUT)
    assert fake.batches == [[1], [11], [20], [30]]
    assert not scheduler.expedite(speculated)  # done: nothing to expedite


async def test_promoted_speculation_is_served_as_a_final(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """Promoted while queued, a speculation runs with the finals, in one batch (as a final
    submitted at its promotion, not an awaited one though a turn decision expedited it);
    cancelling speculations leaves it alone."""
    scheduler, fake = gated
    busy = await scheduler.submit(request("busy", 1))
    await wait_entered(fake)
    final = await scheduler.submit(request("f", 20))
    speculated = request("s", 10, SPECULATIVE)
    early = await scheduler.submit(speculated)
    assert scheduler.expedite(speculated)
    assert scheduler.promote(speculated)
    assert scheduler.depth_by_priority()[Priority.FINAL] == 2
    assert scheduler.cancel("s", only=SPECULATIVE) == 0
    fake.release(2)
    await asyncio.wait_for(asyncio.gather(busy, final, early), TIMEOUT)
    assert fake.batches == [[1], [20, 10]]
    assert not scheduler.promote(speculated)  # done: nothing to promote


async def test_a_running_speculation_once_promoted_is_not_stopped(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """Promoted while it runs, a speculation is a final: a new final waits for it instead
    of stopping it."""
    scheduler, fake = gated
    speculated = request("s", 10, SPECULATIVE)
    early = await scheduler.submit(speculated)
    await wait_entered(fake)
    assert scheduler.promote(speculated)
    final = await scheduler.submit(request("f", 20))
    await checked_after_plan(scheduler, fake)
    assert fake.stopped == []
    fake.release(2)
    await asyncio.wait_for(asyncio.gather(early, final), TIMEOUT)
    assert fake.batches == [[10], [20]]
    assert scheduler.stats.preempted_batches == 0


async def test_a_withdrawn_running_speculation_is_stopped_and_frees_its_worker(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """Cancelling a session's speculations stops its running speculative batch (its
    future cancelled, not put back): the worker takes the next request at once. Another
    session's speculation and a promoted one are left to run."""
    scheduler, fake = gated
    early = await scheduler.submit(request("s", 10, SPECULATIVE))
    await wait_entered(fake)
    assert scheduler.cancel("other", only=SPECULATIVE) == 0
    await checked_after_plan(scheduler, fake)
    assert fake.stopped == []
    assert scheduler.cancel("s", only=SPECULATIVE) == 0  # nothing queued: it ran
    assert early.cancelled() and scheduler.stats.cancelled_batches[SPECULATIVE] == 1
    final = await scheduler.submit(request("f", 20))
    await wait_entered(fake)
    assert fake.stopped == [[10]] and fake.batches == [[10], [20]]
    fake.release()
    await asyncio.wait_for(final, TIMEOUT)
    assert scheduler.queue_depth == 0 and fake.batches == [[10], [20]]  # never ran again
    speculated = request("s", 11, SPECULATIVE)
    promoted = await scheduler.submit(speculated)
    await wait_entered(fake)
    assert scheduler.promote(speculated)
    scheduler.cancel("s", only=SPECULATIVE)
    await checked_after_plan(scheduler, fake)
    assert fake.stopped == [[10]] and not promoted.done()
    fake.release()
    assert (await asyncio.wait_for(promoted, TIMEOUT)).transcription.text == "n=11"


async def test_cancelling_a_sessions_partials_stops_its_running_partial_batch(
    gated: tuple[BatchScheduler, FakeRecognizer],
) -> None:
    """At its utterance's speculation or final, a session's running partial is stale:
    cancelling its partials stops that batch (its future cancelled, not put back), and the
    speculation submitted with it runs at once; another session's partial runs on."""
    scheduler, fake = gated
    other = await scheduler.submit(request("o", 5, Priority.PARTIAL))
    await wait_entered(fake)
    scheduler.cancel("s", only=Priority.PARTIAL)
    await checked_after_plan(scheduler, fake)
    assert fake.stopped == [] and not other.done()
    fake.release()
    await asyncio.wait_for(other, TIMEOUT)
    stale = await scheduler.submit(request("s", 30, Priority.PARTIAL))
    await wait_entered(fake)
    assert scheduler.cancel("s", only=Priority.PARTIAL) == 0  # nothing queued: it ran
    early = await scheduler.submit(request("s", 10, SPECULATIVE))
    await wait_entered(fake)
    assert stale.cancelled() and fake.stopped == [[30]]
    assert scheduler.stats.cancelled_batches[Priority.PARTIAL] == 1
    fake.release()
    assert (await asyncio.wait_for(early, TIMEOUT)).transcription.text == "n=10"
    assert fake.batches == [[5], [30], [10]] and scheduler.queue_depth == 0


def with_left(session: str, n: int, priority: Priority = Priority.FINAL) -> RecognitionRequest:
    """A request whose utterance carries a left context (a second of silence, "before")."""
    left = LeftContext(np.zeros(16000, dtype=np.float32), "before")
    return RecognitionRequest(session, priority, Utterance(np.zeros(n, np.float32), left=left))


async def test_without_a_load_gate_finals_keep_their_left_context() -> None:
    """context_below None: every final goes to the model with its context."""
    fake = FakeRecognizer(gated=True)
    async with started(
        BatchScheduler(fake, scheduler_config(max_batch_size=1, max_wait=0.0))
    ) as scheduler:
        busy = await occupy(scheduler, fake)
        futures = [await scheduler.submit(with_left(f"s{i}", 100 + i)) for i in range(2)]
        fake.release(3)
        await asyncio.wait_for(asyncio.gather(busy, *futures), TIMEOUT)
    assert [len(u.audio) for u in fake.lefts] == [100, 101]
    assert scheduler.stats.contexts_shed == 0 and scheduler.has_context_slack()


async def test_a_final_with_another_queued_behind_it_sheds_its_left_context() -> None:
    """With the gate, the first of two queued finals (batches of one) goes while the second
    waits: without its context; the second, alone on an idle model, keeps its own."""
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake, scheduler_config(max_batch_size=1, max_wait=0.0, context_below=1.0)
    )
    async with started(scheduler):
        busy = await occupy(scheduler, fake)
        first = await scheduler.submit(with_left("a", 100))
        second = await scheduler.submit(with_left("b", 101))
        fake.release(3)
        await asyncio.wait_for(asyncio.gather(busy, first, second), TIMEOUT)
    assert fake.batches == [[1], [100], [101]]
    assert [len(u.audio) for u in fake.lefts] == [101]
    assert fake.lefts[0].left is not None and fake.lefts[0].left.text == "before"
    assert scheduler.stats.contexts_shed == 1


async def test_a_busy_model_sheds_live_contexts_but_not_a_files() -> None:
    """With the model busy over the last seconds (utilization above the gate), a live
    final goes without its left context; a file's utterance keeps it."""
    now = [0.0]
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake,
        scheduler_config(max_batch_size=4, max_wait=0.0, context_below=0.001),
        clock=lambda: now[0],
    )
    async with started(scheduler):
        busy = await occupy(scheduler, fake)
        now[0] += 0.05  # the model is busy: utilization well above 0.1 %
        live = await scheduler.submit(with_left("live", 100))
        upload = await scheduler.submit(with_left("file", 200, Priority.FILE))
        assert not scheduler.has_context_slack()
        fake.release(2)
        results = await asyncio.wait_for(asyncio.gather(busy, live, upload), TIMEOUT)
    assert [r.transcription.text for r in results] == ["n=1", "n=100", "n=200"]
    assert fake.batches == [[1], [100, 200]]
    assert [len(u.audio) for u in fake.lefts] == [200]
    assert scheduler.stats.contexts_shed == 1


async def test_an_essential_left_context_is_never_shed() -> None:
    """A final that goes on from a client's cut in mid-speech keeps its left context on a
    busy model, where a final cut at a pause sheds its own."""
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake, scheduler_config(max_batch_size=4, max_wait=0.0, context_below=0.001)
    )
    async with started(scheduler):
        busy = await occupy(scheduler, fake)
        await asyncio.sleep(0.05)  # the model is busy: utilization well above 0.1 %
        cold = await scheduler.submit(with_left("cold", 100))
        left = LeftContext(np.zeros(16000, dtype=np.float32), "before", essential=True)
        cut = RecognitionRequest(
            "cut", Priority.FINAL, Utterance(np.zeros(300, np.float32), left=left)
        )
        going_on = await scheduler.submit(cut)
        assert not scheduler.has_context_slack()
        fake.release(2)
        await asyncio.wait_for(asyncio.gather(busy, cold, going_on), TIMEOUT)
    assert fake.batches == [[1], [100, 300]]
    assert [len(u.audio) for u in fake.lefts] == [300]
    assert scheduler.stats.contexts_shed == 1


async def test_partials_alone_leave_a_final_its_left_context() -> None:
    """The gate reads the finals' share of the model, not partials': a worker busy with a
    partial (the model's utilization well above the gate) leaves a final its context."""
    now = [0.0]
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake,
        scheduler_config(
            workers=2, max_batch_size=1, max_wait=0.0, partial_share=1.0, context_below=0.001
        ),
        clock=lambda: now[0],
    )
    async with started(scheduler):
        partial = await scheduler.submit(request("p", 1, Priority.PARTIAL))
        await wait_entered(fake)
        now[0] += 0.05
        assert scheduler.utilization > 0.001 and scheduler.finals_utilization == 0.0
        assert scheduler.has_context_slack()
        final = await scheduler.submit(with_left("f", 100))
        await wait_entered(fake)
        now[0] += 0.05
        assert scheduler.finals_utilization > 0.001  # a final's batch counts while it runs
        fake.release(2)
        await asyncio.wait_for(asyncio.gather(partial, final), TIMEOUT)
    assert sorted(fake.batches) == [[1], [100]]
    assert [len(u.audio) for u in fake.lefts] == [100]
    assert scheduler.stats.contexts_shed == 0
    assert not scheduler.has_context_slack()  # the final's own time counts now


async def finals_alone_then_one_behind_context(
    budget: float,
) -> tuple[BatchScheduler, FakeRecognizer]:
    """A final alone that holds the model ~0.1 s, then a final with a left context, under a
    latency budget of `budget` seconds (no load gate): the scheduler and recognizer after."""
    now = [0.0]
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake,
        scheduler_config(max_batch_size=1, max_wait=0.0, context_budget=budget),
        clock=lambda: now[0],
    )
    async with started(scheduler):
        busy = await occupy(scheduler, fake)
        now[0] += 0.1
        fake.release()
        await asyncio.wait_for(busy, TIMEOUT)
        final = await scheduler.submit(with_left("a", 100))
        fake.release()
        await asyncio.wait_for(final, TIMEOUT)
    assert fake.batches == [[1], [100]]
    return scheduler, fake


async def test_a_final_expected_late_behind_its_context_goes_alone() -> None:
    """Finals alone take ~0.1 s, so behind a context ~0.17 s: over a 50 ms budget the
    final goes without its context; under a 5 s budget it keeps it."""
    tight, alone = await finals_alone_then_one_behind_context(0.05)
    assert tight.stats.contexts_shed == 1 and alone.lefts == []
    loose, behind = await finals_alone_then_one_behind_context(5.0)
    assert loose.stats.contexts_shed == 0 and [len(u.audio) for u in behind.lefts] == [100]


async def test_the_budget_counts_from_the_finals_cut_not_its_submit() -> None:
    """A final cut 10 s ago (it waited for the one before it) is already late: it goes
    without its context under a 5 s budget, though it was submitted just now."""
    fake = FakeRecognizer(gated=True)
    scheduler = BatchScheduler(
        fake, scheduler_config(max_batch_size=1, max_wait=0.0, context_budget=5.0)
    )
    async with started(scheduler):
        busy = await occupy(scheduler, fake)
        fake.release()
        await asyncio.wait_for(busy, TIMEOUT)
        late = replace(with_left("a", 100), closed_at=time.monotonic() - 10.0)
        fake.release()
        await asyncio.wait_for(await scheduler.submit(late), TIMEOUT)
    assert scheduler.stats.contexts_shed == 1 and fake.lefts == []


def test_the_load_gate_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="context_below"):
        BatchScheduler(FakeRecognizer(), scheduler_config(context_below=0.0))
    with pytest.raises(ValueError, match="context_budget"):
        BatchScheduler(FakeRecognizer(), scheduler_config(context_budget=0.0))
