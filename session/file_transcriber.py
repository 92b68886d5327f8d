"""Transcribe a decoded file the way a live session would, without hurting live rooms.

The file (raw 16 kHz mono pcm_s16le on disk) is read in chunks, cut into utterances by
the same Silero VAD and Segmenter as a live stream (partials off), and each utterance
goes to the shared BatchScheduler at `Priority.FILE`: after live finals, before live
partials. At most `in_flight()` of the file's requests are in the scheduler at once —
the server makes that 1 while live rooms are open — so a live final that arrives
during a file batch waits for that small batch only; and while rooms are open the file
takes only `model_share()` of the model's time, pausing after each result, so a live
final often finds the model idle. Results are committed in utterance order.

VAD runs on the event loop in slices of SLICE_WINDOWS windows with a yield between
them. bench/upload_vad.py on the 2-core box (quiet): ~0.6 ms a slice, ~230x real time,
event-loop lag p99 ~1.6 ms; in a thread the GIL's 5 ms switch interval gave p99
~3.3 ms at the same throughput. It scores through its own DirectScorer, not the live
rooms' VadBatcher: a file's many windows would lengthen every batched turn (with the
batcher's first, 10 ms-tick version a file crawled at 11-51x real time).

Attached to a meeting (as a source the caller registered with `Store.create_source`),
each final is also appended to the meeting's log (its `seq` comes from the store,
gap-free) and published to the meeting's listeners as it is committed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from engine.api import (
    SAMPLE_RATE,
    BatchFailed,
    Priority,
    RecognitionRequest,
    RecognitionResult,
    SchedulerError,
    SpeakerWindows,
    Transcription,
    Utterance,
)
from session.actor import SessionServices
from session.diarizer import Relabel
from session.language import LanguageDetector
from session.segmenter import Segmenter, SegmentEvent, UtteranceEnded
from session.speakers import LabelledPart, SpeakerLabeller, relabel
from session.vad import WINDOW, VadScorer, VadStream
from store.records import FinalRecord, NewFinal, SourceState
from wire import build
from wire.messages import Word

logger = logging.getLogger(__name__)

CHUNK_SAMPLES = 10 * SAMPLE_RATE  # read from disk at a time (320 KB)
SLICE_WINDOWS = 4  # VAD windows scored between two yields to the event loop


@dataclass(frozen=True, slots=True)
class FileOptions:
    source_id: str  # the scheduler's session id for this file; prefix of utterance ids
    participant: str
    language: str | None  # None: detect it (multilingual models), then pin it
    # The meeting source the file's finals are logged as (from Store.create_source, so
    # source_id must be its session_id); None: the file stands alone.
    meeting_source: SourceState | None = None
    diarize: bool = False  # label each final's speaker (services.speakers must be set)
    # How many of the file's requests may be in the scheduler now; asked before each
    # submission, so the server can lower it while live rooms are open.
    in_flight: Callable[[], int] = lambda: 4
    # The share of the model's time the file may take now (1.0: all it can get). Below 1
    # the file pauses after each result, so the model is idle part of the time and a live
    # final that arrives then does not wait for a file batch at all.
    model_share: Callable[[], float] = lambda: 1.0


@dataclass
class FileProgress:
    """The growing result of one file, read by the job resource while it runs."""

    total_samples: int
    processed_samples: int = 0  # every utterance before this sample is transcribed
    finals: list[FinalRecord] = field(default_factory=list)
    utterances: int = 0
    empty: int = 0  # utterances the model judged not to be speech

    @property
    def processed_seconds(self) -> float:
        return round(self.processed_samples / SAMPLE_RATE, 3)

    @property
    def total_seconds(self) -> float:
        return round(self.total_samples / SAMPLE_RATE, 3)


@dataclass(slots=True)
class _Pending:
    event: UtteranceEnded
    utterance: Utterance
    future: asyncio.Future[RecognitionResult]
    speakers: asyncio.Task[SpeakerWindows | None] | None = None


class FileTranscriber:
    def __init__(
        self,
        audio_path: Path,
        services: SessionServices,
        options: FileOptions,
        progress: FileProgress,
        vad: VadScorer | None = None,
    ) -> None:
        """`vad` scores the file's windows (default: the live sessions' scorer). The server
        passes a DirectScorer over the same model: a file's windows come all at once, and
        scoring them apart keeps the live rooms' per-turn VAD batches small."""
        self._path = audio_path
        self._services = services
        self._options = options
        self.progress = progress
        config = dataclasses.replace(services.segmenter, partial_interval=0.0)
        self._segmenter = Segmenter(config)
        self._vad = VadStream(vad or services.vad)
        self._pending: deque[_Pending] = deque()
        self._language = options.language
        if self._language is None and len(services.languages) == 1:
            self._language = next(iter(services.languages))  # an English-only model
        # Like a live source: the first utterances are detected on their own (at no extra
        # model cost), then the detector pins one language for the rest of the file.
        self._detector = LanguageDetector() if self._language is None else None
        self._source = options.meeting_source
        if self._source is not None and self._source.session_id != options.source_id:
            raise ValueError("a file attached to a meeting uses its source's session id")
        self._labeller: SpeakerLabeller | None = None
        if options.diarize:
            if services.speakers is None:
                raise ValueError("diarize needs the services' speaker embedder")
            self._labeller = SpeakerLabeller(services.speakers, services.diarizer)

    async def run(self) -> None:
        """Transcribe the whole file; on cancellation drop its queued requests."""
        scheduler = self._services.scheduler
        try:
            with self._path.open("rb") as audio:
                while raw := await asyncio.to_thread(audio.read, CHUNK_SAMPLES * 2):
                    await self._segment(_samples(raw))
            tail = self.progress.total_samples % WINDOW  # the last partial window: pad it
            if tail:
                await self._segment(np.zeros(WINDOW - tail, np.float32))
            await self._handle(self._segmenter.flush())
            while self._pending:
                await self._commit(self._pending.popleft())
            if self._labeller is not None:  # the file is done: its best labelling
                await self._relabel(await self._labeller.recluster(final=True))
            self.progress.processed_samples = self.progress.total_samples
        finally:
            # Cancelled or failed: what is still queued for this file is dropped.
            scheduler.cancel(self._options.source_id)
            if self._labeller is not None:
                await self._labeller.close()

    async def _segment(self, samples: npt.NDArray[np.float32]) -> None:
        step = SLICE_WINDOWS * WINDOW
        for offset in range(0, len(samples), step):
            events: list[SegmentEvent] = []
            for window, probability in await self._vad.process(samples[offset : offset + step]):
                events.extend(self._segmenter.push(window, probability))
            await self._handle(events)
            self._advance()
            await asyncio.sleep(0)  # let live rooms run between slices

    async def _handle(self, events: list[SegmentEvent]) -> None:
        for event in events:
            if not isinstance(event, UtteranceEnded):
                continue
            while len(self._pending) >= max(1, self._options.in_flight()):
                await self._commit(self._pending.popleft())
            self.progress.utterances += 1
            utterance = Utterance(event.audio, self._language)
            future = await self._submit(utterance)
            speakers = self._labeller.embed(event.audio) if self._labeller is not None else None
            self._pending.append(_Pending(event, utterance, future, speakers))
            self._advance()

    async def _submit(self, utterance: Utterance) -> asyncio.Future[RecognitionResult]:
        request = RecognitionRequest(self._options.source_id, Priority.FILE, utterance)
        return await self._services.scheduler.submit(request)

    def _advance(self) -> None:
        done = self._pending[0].event.start if self._pending else self._segmenter.position
        done = min(done, self.progress.total_samples)
        self.progress.processed_samples = max(self.progress.processed_samples, done)

    async def _commit(self, pending: _Pending) -> None:
        try:
            result = await pending.future
        except BatchFailed:
            logger.warning("file batch failed for %s; retrying once", self._options.source_id)
            result = await (await self._submit(pending.utterance))
        self._advance()
        share = self._options.model_share()
        if share < 1.0:  # leave the model idle for live rooms: pace, do not poll
            await asyncio.sleep(result.inference * (1.0 / max(share, 0.05) - 1.0))
        text = result.transcription.text.strip()
        if not text:
            self.progress.empty += 1
            return
        self._observe_language(result)
        event = pending.event
        for part in await self._parts(pending, result):
            start = _seconds(event.start + part.start)
            end = _seconds(min(event.start + part.end, self.progress.total_samples))
            offset = event.start / SAMPLE_RATE
            words: list[Word] = [
                {
                    "word": w.word,
                    "start": round(offset + w.start, 3),
                    "end": round(offset + w.end, 3),
                }
                for w in part.words
            ]
            final = NewFinal(
                utterance_id=part.utterance_id,
                session_id=self._options.source_id,
                participant=self._options.participant,
                text=part.text,
                start=start,
                end=max(end, start),
                language=part.language,
                words=words,
                speaker=part.speaker or None,
            )
            await self._log(final, event.start + part.end, event.index)
        if self._labeller is not None:
            await self._relabel(await self._labeller.recluster())

    async def _parts(self, pending: _Pending, result: RecognitionResult) -> list[LabelledPart]:
        """The finals one utterance makes: itself, or (diarize) one per speaker in it."""
        event = pending.event
        transcription = result.transcription
        utterance_id = f"{self._options.source_id}-{event.index}"
        if self._labeller is None or pending.speakers is None:
            text = transcription.text.strip()
            length = event.end - event.start
            return [
                LabelledPart(
                    utterance_id, 0, length, text, transcription.words, "", transcription.language
                )
            ]
        return await self._labeller.label(
            utterance_id,
            event.start / SAMPLE_RATE,
            event.audio,
            await pending.speakers,
            transcription,
            lambda audio: self._recognize_part(audio, transcription.language),
        )

    async def _recognize_part(
        self, audio: npt.NDArray[np.float32], language: str
    ) -> Transcription | None:
        try:
            result = await (await self._submit(Utterance(audio, language)))
        except SchedulerError:
            logger.warning("a part of %s failed", self._options.source_id, exc_info=True)
            return None
        return result.transcription

    async def _log(self, final: NewFinal, end_sample: int, index: int) -> None:
        """Keep one final; attached to a meeting, log it there and tell the listeners."""
        if self._source is None:
            record = FinalRecord.from_new(len(self.progress.finals) + 1, final)
        else:
            store = self._services.store
            source = dataclasses.replace(
                self._source, acked_until=end_sample / SAMPLE_RATE, next_utterance=index + 1
            )
            record = await store.append_final(source.meeting_id, final, source)
            self._source = source
            await store.publish(
                source.meeting_id, build.encode(build.transcript_final(record)).encode()
            )
        self.progress.finals.append(record)

    async def _relabel(self, relabels: list[Relabel]) -> None:
        """Apply a re-clustering's new labels to the result, and to the meeting if any."""
        if not relabels:
            return
        labels = {r.key: r.label for r in relabels}
        self.progress.finals[:] = [
            dataclasses.replace(f, speaker=labels[f.utterance_id])
            if f.utterance_id in labels
            else f
            for f in self.progress.finals
        ]
        if self._source is not None:
            meeting_id = self._source.meeting_id
            store = self._services.store
            for message in await relabel(store, meeting_id, relabels):
                await store.publish(meeting_id, build.encode(message).encode())

    def _observe_language(self, result: RecognitionResult) -> None:
        detector = self._detector
        probability = result.transcription.language_probability
        if detector is None or detector.pinned is not None or probability is None:
            return
        pinned = detector.observe(result.transcription.language, probability)
        if pinned is not None:
            self._language = pinned.language
            logger.info(
                "file %s: language pinned to %s (p=%.2f after %d utterances)",
                self._options.source_id,
                pinned.language,
                pinned.probability,
                pinned.utterances,
            )


def _samples(raw: bytes) -> npt.NDArray[np.float32]:
    """pcm_s16le bytes → float32 in [-1, 1]."""
    pcm = np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2")
    samples: npt.NDArray[np.float32] = pcm.astype(np.float32) / 32768.0
    return samples


def _seconds(sample: int) -> float:
    return round(sample / SAMPLE_RATE, 3)
