"""ProcessRecognizer: the real model in child processes, on real speech."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.corpus import clips
from bench.processes import status_kb
from engine.api import Utterance
from engine.loading import ModelConfig, load_whisper
from engine.recognizer import Interrupted
from engine.workers.child import IDLE_TRIM_S
from engine.workers.processes import ProcessRecognizer
from server.engine_plan import model_config_with

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def config(tiny_en: Path, model_cache: Path) -> ModelConfig:
    return model_config_with(cache=model_cache)


@pytest.fixture(scope="module")
def pool(config: ModelConfig) -> Iterator[ProcessRecognizer]:
    recognizer = ProcessRecognizer(config, processes=2, threads=1, trim_interval=0.001)
    yield recognizer
    recognizer.close()


@pytest.fixture(scope="module")
def jfk() -> Utterance:
    return Utterance(clips(("en_jfk",))[0].audio(), word_timings=True)


def test_children_transcribe_as_the_model_in_process_does(
    pool: ProcessRecognizer, config: ModelConfig, jfk: Utterance
) -> None:
    """Each child gives the in-process recognizer's text and words, in input order."""
    assert pool.name == "tiny.en" and pool.languages == frozenset({"en"})
    local = load_whisper(config).transcribe([jfk])[0]
    assert "ask not what your country can do for you" in local.text
    short = Utterance(jfk.audio[: 16_000 * 3])
    for _ in range(pool.processes):  # every child serves a call in turn
        out = pool.transcribe([jfk, short])
        assert out[0].text == local.text
        # The same words and times; a probability may differ in its last digit (the child
        # runs one torch thread, this process more: another summation order).
        assert [(w.word, w.start, w.end) for w in out[0].words] == [
            (w.word, w.start, w.end) for w in local.words
        ]
        assert out[0].words and all(
            abs(a.probability - b.probability) < 1e-3
            for a, b in zip(out[0].words, local.words, strict=True)
        )
        assert len(out[1].text) < len(out[0].text)


def test_calls_from_two_threads_run_at_once(pool: ProcessRecognizer, jfk: Utterance) -> None:
    """Two worker threads each get a child: both batches complete, each with its text."""
    results: dict[int, str] = {}

    def run(index: int) -> None:
        results[index] = pool.transcribe([jfk])[0].text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results[0] == results[1] and "your country" in results[0]


def test_a_stop_interrupts_the_batch_and_the_child_goes_on(
    pool: ProcessRecognizer, jfk: Utterance
) -> None:
    """should_stop turning true mid-batch raises Interrupted well before the batch would
    end; the child then serves the next batch in full."""
    started = time.monotonic()
    alone = pool.transcribe([jfk] * 4)
    whole = time.monotonic() - started
    stop_at = time.monotonic() + 0.05
    started = time.monotonic()
    with pytest.raises(Interrupted):
        pool.transcribe([jfk] * 4, lambda: time.monotonic() > stop_at)
    assert time.monotonic() - started < whole
    for _ in range(pool.processes):
        assert pool.transcribe([jfk])[0].text == alone[0].text


def test_a_dead_idle_child_is_replaced_in_the_background(
    config: ModelConfig, jfk: Utterance
) -> None:
    """A child killed between batches is seen and replaced without a batch asking
    (`health()` counts it), and the next batch is served by the replacement."""
    recognizer = ProcessRecognizer(config, processes=1, threads=1)
    try:
        (first,) = recognizer.health().pids
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 240
        while (health := recognizer.health()).alive < 1 or first in health.pids:
            assert time.monotonic() < deadline, health
            time.sleep(0.02)
        assert health.restarts == {"died": 1, "hung": 0, "load_failed": 0}
        assert "your country" in recognizer.transcribe([jfk])[0].text
    finally:
        recognizer.close()
    assert not any(Path(f"/proc/{pid}").exists() for pid in recognizer.health().pids)
    with pytest.raises(RuntimeError, match="closed"):
        recognizer.transcribe([jfk])


def test_a_model_that_fails_to_load_fails_the_start(config: ModelConfig) -> None:
    """A configuration the child's model refuses: the constructor raises with the child's
    reason, and no child is left behind."""
    bad = model_config_with(cache=config.cache, dtype="float16", quantize="int8")
    before = set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="int8 runs on the CPU in float32 only"):
        ProcessRecognizer(bad, processes=1, threads=1)
    assert set(multiprocessing.active_children()) == before


def test_an_idle_child_gives_its_free_heap_back(config: ModelConfig, jfk: Utterance) -> None:
    """A batch leaves its buffers' pages in the child's heap; with no trim due for an hour,
    the child still gives them back once no batch has come for `IDLE_TRIM_S`."""
    recognizer = ProcessRecognizer(config, processes=1, threads=1, trim_interval=3600.0)
    try:
        (pid,) = recognizer.health().pids
        recognizer.transcribe([jfk] * 4)
        after_batch = status_kb(pid, "RssAnon:") / 1024
        deadline = time.monotonic() + IDLE_TRIM_S + 5.0
        while (now := status_kb(pid, "RssAnon:") / 1024) > after_batch - 20:
            assert time.monotonic() < deadline, (after_batch, now)
            time.sleep(0.05)
    finally:
        recognizer.close()
