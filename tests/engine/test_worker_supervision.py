"""Supervised model worker processes under the real scheduler: children SIGKILLed or
SIGSTOPped while they run a batch of real speech. Every final still settles with the
model's text (its batch runs again on another child or on the replacement), the lost
children are counted and replaced in the background, and nothing waits on a hung one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from bench.corpus import clips
from engine.api import Priority, RecognitionRequest, Utterance
from engine.scheduling.scheduler import BatchScheduler
from engine.workers.child import ChildProcess, WorkerLost
from engine.workers.processes import ProcessRecognizer, WorkerHealth
from server.engine_plan import model_config_with
from tests.support.scheduling import scheduler_config

pytestmark = pytest.mark.slow

HANG_AFTER = 2.0  # seconds without a heartbeat before a busy child is hung (10 s served)
SETTLE = 240.0  # generous: a replacement loads the model on a shared 2-core box


@pytest.fixture(scope="module")
def pool(tiny_en: Path, model_cache: Path) -> Iterator[ProcessRecognizer]:
    recognizer = ProcessRecognizer(
        model_config_with(cache=model_cache), processes=2, threads=1, hang_after=HANG_AFTER
    )
    yield recognizer
    recognizer.close()


@pytest.fixture(scope="module")
def jfk() -> Utterance:
    return Utterance(clips(("en_jfk",))[0].audio())


@contextlib.asynccontextmanager
async def scheduling(pool: ProcessRecognizer) -> AsyncIterator[BatchScheduler]:
    scheduler = BatchScheduler(pool, scheduler_config(workers=pool.processes, max_wait=0.0))
    scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()


async def until(pool: ProcessRecognizer, check: Callable[[WorkerHealth], bool]) -> WorkerHealth:
    """The pool's health once `check` holds (polled: the pool has no event to await)."""
    deadline = time.monotonic() + SETTLE
    while not check(health := pool.health()):
        assert time.monotonic() < deadline, f"not within {SETTLE} s: {health}"
        await asyncio.sleep(0.02)
    return health


async def fault_mid_batch(pool: ProcessRecognizer, jfk: Utterance, victims: int, sig: int) -> None:
    """Two finals on two children; `victims` of the busy children get `sig` mid-batch;
    both finals come back with the model's text, and the pool is whole again after."""
    async with scheduling(pool) as scheduler:
        futures = [
            await scheduler.submit(RecognitionRequest(f"s{i}", Priority.FINAL, jfk))
            for i in range(2)
        ]
        busy = (await until(pool, lambda h: len(h.busy) == 2)).busy
        for pid in busy[:victims]:
            os.kill(pid, sig)
        results = await asyncio.wait_for(asyncio.gather(*futures), SETTLE)
    for result in results:
        assert "ask not what your country can do for you" in result.transcription.text
    health = await until(pool, lambda h: h.alive == 2)
    assert not set(busy[:victims]) & set(health.pids)


async def test_a_child_killed_mid_batch_loses_no_final(
    pool: ProcessRecognizer, jfk: Utterance
) -> None:
    before = pool.health().restarts
    await fault_mid_batch(pool, jfk, victims=1, sig=signal.SIGKILL)
    after = pool.health().restarts
    assert after["died"] == before["died"] + 1 and after["hung"] == before["hung"]


async def test_every_child_killed_mid_batch_loses_no_final(
    pool: ProcessRecognizer, jfk: Utterance
) -> None:
    before = pool.health().restarts
    await fault_mid_batch(pool, jfk, victims=2, sig=signal.SIGKILL)
    assert pool.health().restarts["died"] == before["died"] + 2


async def test_every_child_hung_mid_batch_is_killed_and_replaced(
    pool: ProcessRecognizer, jfk: Utterance
) -> None:
    """SIGSTOP: the children are alive but beat no more; after `hang_after` each is
    SIGKILLed (a stopped process dies too) and its batch runs on the replacement."""
    before = pool.health().restarts
    await fault_mid_batch(pool, jfk, victims=2, sig=signal.SIGSTOP)
    after = pool.health().restarts
    assert after["hung"] == before["hung"] + 2 and after["died"] == before["died"]


async def test_stopping_the_scheduler_does_not_wait_on_a_hung_child(
    pool: ProcessRecognizer, jfk: Utterance
) -> None:
    """A stop while every child is SIGSTOPped mid-batch: the batches are given up (the
    children killed as hung once they leave a stop unanswered) well before `hang_after`
    would have found them, and the pool restarts them."""
    scheduler = BatchScheduler(pool, scheduler_config(workers=pool.processes, max_wait=0.0))
    scheduler.start()
    futures = [
        await scheduler.submit(RecognitionRequest(f"s{i}", Priority.FINAL, jfk)) for i in range(2)
    ]
    for pid in (await until(pool, lambda h: len(h.busy) == 2)).busy:
        os.kill(pid, signal.SIGSTOP)
    await asyncio.wait_for(scheduler.stop(), SETTLE)
    for future in futures:
        assert future.done()
    await until(pool, lambda h: h.alive == 2)


def test_a_replacement_that_cannot_load_in_time_is_killed_and_retried(
    tiny_en: Path, model_cache: Path, jfk: Utterance
) -> None:
    """A replacement not ready within the load timeout is killed (its process gone),
    counted as `load_failed` and tried again after a backoff; with the timeout back to
    normal the next one comes up and serves."""
    pool = ProcessRecognizer(model_config_with(cache=model_cache), processes=1, threads=1)
    try:
        victim = pool.health().pids[0]
        pool.load_timeout = 0.2  # shorter than any model load: every replacement is late
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + SETTLE
        seen: set[int] = set()
        while (late := pool.health()).restarts["load_failed"] < 2:
            assert time.monotonic() < deadline
            seen.update(late.pids)
            time.sleep(0.01)
        assert late.alive == 0 and late.restarts["died"] == 1
        given_up = seen - {victim, *late.pids}
        assert given_up and not any(Path(f"/proc/{pid}").exists() for pid in given_up)
        pool.load_timeout = 300.0
        while pool.health().alive < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "your country" in pool.transcribe([jfk])[0].text
    finally:
        pool.close()
    for pid in pool.health().pids:
        assert not Path(f"/proc/{pid}").exists()


def test_a_batch_on_a_killed_childs_closed_pipe_is_a_lost_worker(
    model_cache: Path, jfk: Utterance
) -> None:
    """A batch that meets a child already killed, its pipe closed (the supervisor found it
    dead while idle), raises WorkerLost, which moves the batch to another worker; not the
    OSError of the closed pipe, which failed the batch."""
    child = ChildProcess(0, model_config_with(cache=model_cache), 1, 0.0, False)
    child.kill()  # SIGKILL, reap, close the pipe: what the supervisor does to a dead child
    with pytest.raises(WorkerLost):
        child.run([jfk], None, HANG_AFTER)


def test_an_idle_child_killed_between_batches_loses_no_batch(
    pool: ProcessRecognizer, jfk: Utterance
) -> None:
    """An idle child SIGKILLed while batches keep coming from two threads: every batch
    returns the model's text (none fails on the dead child's pipe), the death is counted
    once and the child replaced."""
    before = pool.health()
    assert before.alive == 2 and not before.busy
    errors: list[BaseException] = []
    texts: list[str] = []

    def batches() -> None:
        for _ in range(3):
            try:
                texts.append(pool.transcribe([jfk])[0].text)
            except BaseException as exc:
                errors.append(exc)

    os.kill(before.pids[0], signal.SIGKILL)
    threads = [threading.Thread(target=batches) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SETTLE)
    assert not errors, errors
    assert len(texts) == 6 and all("your country" in text for text in texts)
    deadline = time.monotonic() + SETTLE
    while (after := pool.health()).alive < 2:
        assert time.monotonic() < deadline, after
        time.sleep(0.05)
    assert after.restarts["died"] == before.restarts["died"] + 1
    assert before.pids[0] not in after.pids


def _running(pids: tuple[int, ...]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


async def test_a_shutdown_during_the_first_model_load_closes_the_pool(model_cache: Path) -> None:
    """The lifespan cancels the model load (SIGTERM) while the worker pool is still being
    built on its thread: the load waits for it and closes it, so no model worker process
    outlives the shutdown (the pool was dropped unclosed)."""
    from server.app import _start_model  # the lifespan's loader, driven directly

    began, pools = threading.Event(), []

    def factory(settings: object) -> ProcessRecognizer:
        began.set()
        pools.append(
            ProcessRecognizer(model_config_with(cache=model_cache), processes=1, threads=1)
        )
        return pools[0]

    state = types.SimpleNamespace(settings=None, recognizer=None)
    loader = asyncio.create_task(_start_model(state, factory))  # type: ignore[arg-type]
    await asyncio.to_thread(began.wait, SETTLE)
    loader.cancel()
    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(loader, SETTLE)
        assert len(pools) == 1
        pids = pools[0].health().pids
        assert pids and not _running(pids), pids
    finally:
        for pool in pools:
            pool.close()
