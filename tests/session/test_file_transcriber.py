"""FileTranscriber with the real VAD and scheduler, a fake recognizer and the memory store."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from bench.fake_recognizer import FakeRecognizer
from engine.api import RecognitionRequest, RecognitionResult
from engine.scheduling.scheduler import BatchScheduler
from session.file_transcriber import FileOptions, FileProgress, FileTranscriber
from session.final_order import CONTEXT_CHARS
from session.services import SessionServices, offline_services
from store.memory import MemoryStore
from tests.conftest import StoreFactory
from tests.support.corpus import clip
from tests.support.scheduling import scheduler_config


class CountingScheduler(BatchScheduler):
    """Records the most requests of one session that were unsettled at once."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.futures: list[asyncio.Future[RecognitionResult]] = []
        self.most_outstanding = 0

    async def submit(self, request: RecognitionRequest) -> asyncio.Future[RecognitionResult]:
        future = await super().submit(request)
        self.futures.append(future)
        # Count futures not yet done (a done-callback would run a loop turn late).
        outstanding = sum(not f.done() for f in self.futures)
        self.most_outstanding = max(self.most_outstanding, outstanding)
        return future


@pytest.fixture
async def services() -> AsyncIterator[SessionServices]:
    scheduler = CountingScheduler(FakeRecognizer(), scheduler_config(max_batch_size=8))
    scheduler.start()
    yield offline_services(scheduler, MemoryStore())
    await scheduler.stop()


def speech_file(tmp_path: Path, repeats: int = 3) -> tuple[Path, int]:
    """JFK three times with a second of silence between: 16 kHz s16 on disk."""
    gap = np.zeros(16_000, np.float32)
    samples = np.concatenate([np.concatenate([clip("en_jfk").samples(), gap])] * repeats)
    path = tmp_path / "audio.s16"
    path.write_bytes((samples * 32767).astype("<i2").tobytes())
    return path, len(samples)


@pytest.mark.parametrize("in_flight", [1, 3])
async def test_utterances_in_order_with_bounded_in_flight(
    tmp_path: Path, services: SessionServices, in_flight: int
) -> None:
    """Every utterance is transcribed once, in order, inside the file; never more than
    `in_flight` of them wait in the scheduler; progress ends at the file's length."""
    path, total = speech_file(tmp_path)
    progress = FileProgress(total_samples=total)
    options = FileOptions("upload-t", "speaker", "en", in_flight=lambda: in_flight)
    seen: list[float] = []

    async def watch() -> None:
        while True:
            seen.append(progress.processed_seconds)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    await FileTranscriber(path, services, options, progress).run()
    watcher.cancel()
    scheduler = services.scheduler
    assert isinstance(scheduler, CountingScheduler)
    assert 1 <= scheduler.most_outstanding <= in_flight
    finals = progress.finals
    assert len(finals) >= 6 and progress.utterances == len(finals)  # JFK has >= 2 phrases
    assert [f.seq for f in finals] == list(range(1, len(finals) + 1))
    assert all(f.text.startswith("n=") for f in finals)
    assert all(a.end <= b.start for a, b in itertools.pairwise(finals))
    assert finals[-1].end <= total / 16_000
    assert seen == sorted(seen) and progress.processed_samples == total


async def test_attached_file_appends_to_the_meeting_log(
    tmp_path: Path, services: SessionServices
) -> None:
    """A file attached to a meeting logs its finals there, after the meeting's own."""
    path, total = speech_file(tmp_path, repeats=1)
    store = services.store
    source, _ = await store.create_source("m1", "rec")
    progress = FileProgress(total_samples=total)
    options = FileOptions(source.session_id, "rec", "en", meeting_source=source)
    await FileTranscriber(path, services, options, progress).run()
    logged = await store.finals("m1")
    assert [f.seq for f in logged] == list(range(1, len(logged) + 1)) and logged
    assert [f.text for f in logged] == [f.text for f in progress.finals]
    assert all(f.utterance_id.startswith(source.session_id) for f in logged)


async def test_cancel_drops_the_files_queued_requests(
    tmp_path: Path, services: SessionServices
) -> None:
    """Cancelling a running transcription leaves nothing of it in the scheduler."""
    path, total = speech_file(tmp_path, repeats=6)
    options = FileOptions("upload-c", "speaker", "en", in_flight=lambda: 4)
    task = asyncio.create_task(
        FileTranscriber(path, services, options, FileProgress(total_samples=total)).run()
    )
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    scheduler = services.scheduler
    assert isinstance(scheduler, BatchScheduler)
    assert scheduler.queue_depth == 0


async def test_auto_language_is_detected_then_pinned(tmp_path: Path) -> None:
    """With a multilingual model and no language, the first utterance is detected, and
    once the detector is sure the rest of the file is pinned to that language."""
    fake = FakeRecognizer(languages=frozenset({"en", "de"}), detects=("de", 0.9))
    scheduler = BatchScheduler(fake, scheduler_config(max_batch_size=8))
    scheduler.start()
    services = offline_services(scheduler, MemoryStore(), fake.languages)
    path, total = speech_file(tmp_path, repeats=2)
    progress = FileProgress(total_samples=total)
    options = FileOptions("upload-l", "speaker", None, in_flight=lambda: 1)
    try:
        await FileTranscriber(path, services, options, progress).run()
    finally:
        await scheduler.stop()
    assert fake.asked[0] is None and len(fake.asked) >= 3
    assert fake.asked[1:] == ["de"] * (len(fake.asked) - 1)
    assert {f.language for f in progress.finals} == {"de"}


async def test_attached_file_stores_its_sources_context_and_language(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    """Like a live source, a file attached to a meeting stores the source's rolling
    context (its latest text) and the language it detected with each final: what a resume
    of that source reads back."""
    fake = FakeRecognizer(languages=frozenset({"en", "de"}), detects=("de", 0.9))
    scheduler = BatchScheduler(fake, scheduler_config(max_batch_size=8))
    scheduler.start()
    store = make_store()
    services = offline_services(scheduler, store, fake.languages)
    source, token = await store.create_source("m-context", "rec")
    path, total = speech_file(tmp_path, repeats=1)
    progress = FileProgress(total_samples=total)
    options = FileOptions(source.session_id, "rec", None, meeting_source=source)
    try:
        await FileTranscriber(path, services, options, progress).run()
    finally:
        await scheduler.stop()
    stored = await store.resume_source("m-context", token, "rec")
    texts = " ".join(f.text for f in progress.finals)
    assert len(progress.finals) >= 2
    assert stored.context == texts[-CONTEXT_CHARS:].strip()
    assert stored.language == "de"
    last = progress.finals[-1]
    assert stored.next_utterance == int(last.utterance_id.rsplit("-", 1)[1]) + 1
    assert stored.acked_until == pytest.approx(last.end, abs=1e-3)
