"""Transcribe a decoded file the way a live session would, without hurting live rooms.

The file (raw 16 kHz mono pcm_s16le on disk) is read in chunks, cut into utterances by
the same Silero VAD and Segmenter as a live stream (partials off), and each utterance
goes to the shared BatchScheduler at `Priority.FILE`: after live finals, before live
partials. At most `in_flight()` of the file's requests are in the scheduler at once —
the server makes that 1 while live rooms are open — so a live final that arrives
during a file batch waits for that small batch only; and while rooms are open the file
takes only `model_share()` of the model's time, pausing after each result, so a live
final often finds the model idle. Results are committed in utterance order.

VAD runs on the event loop in slices of SLICE_WINDOWS windows with a yield between them
(bench/upload_vad.py measures a slice, the throughput and the event loop's lag); in a
thread the GIL's 5 ms switch interval doubled the lag at the same throughput. It scores
through its own DirectScorer, not the live rooms' VadBatcher: a file's many windows would
lengthen every batched turn (with the batcher's first, 10 ms-tick version a file crawled
at 11-51x real time).

The file goes through the live path's steps (session/pipeline.py: decode → VAD →
segmenter; session/committer.py: requests, results, language, log): a file without a
language detects it once and pins it, like a live `language=auto` source. Attached to a
meeting (as a source the caller registered with `Store.create_source`), each final is
also appended to the meeting's log (its `seq` comes from the store, gap-free, with the
source's context and language) and published to the meeting's listeners as it is
committed; a file that stands alone numbers its finals from 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine.api import SAMPLE_RATE
from session.audio import FrameDecoder
from session.committer import Committer, CommitterConfig
from session.enrolled import EnrolledVoices
from session.final_order import PendingFinal
from session.pipeline import AudioPipeline
from session.segmenter import SegmentEvent, UtteranceEnded
from session.services import SessionServices
from session.speakers import SpeakerLabeller
from session.vad import WINDOW, VadScorer
from store.records import FinalRecord, SourceState
from wire.codes import Encoding
from wire.messages import ServerMessage

CHUNK_SAMPLES = 10 * SAMPLE_RATE  # read from disk at a time (320 KB)
SLICE_WINDOWS = 4  # VAD windows scored between two yields to the event loop
BYTES_PER_SAMPLE = 2  # pcm_s16le


@dataclass(frozen=True, slots=True)
class FileOptions:
    source_id: str  # the scheduler's session id for this file; prefix of utterance ids
    participant: str
    language: str | None  # None: detect it (multilingual models), then pin it
    # The meeting source the file's finals are logged as (from Store.create_source, so
    # source_id must be its session_id); None: the file stands alone.
    meeting_source: SourceState | None = None
    diarize: bool = False  # label each final's speaker (services.speakers must be set)
    keyterms: tuple[str, ...] = ()  # words to expect (`engine.api.Utterance.keyterms`)
    enrolled: EnrolledVoices | None = None  # the tenant's named voices (diarize only)
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
        labeller = None
        if options.diarize:
            if services.speakers is None:
                raise ValueError("diarize needs the services' speaker embedder")
            labeller = SpeakerLabeller(services.speakers, services.diarizer, options.enrolled)
        self._pipeline = AudioPipeline(
            FrameDecoder(Encoding.PCM_S16LE, SAMPLE_RATE),
            vad or services.vad,
            dataclasses.replace(services.segmenter, partial_interval=0.0, speculate_after=0.0),
        )
        self._committer = Committer(
            CommitterConfig.for_source(
                services,
                session_id=options.source_id,
                participant=options.participant,
                language=options.language,
                live=False,
                keyterms=options.keyterms,
            ),
            services.scheduler,
            services.store,
            options.meeting_source,
            _ToProgress(progress),
            labeller,
        )
        self._pending: deque[PendingFinal] = deque()

    async def run(self) -> None:
        """Transcribe the whole file; on cancellation drop its queued requests."""
        try:
            with self._path.open("rb") as audio:
                while raw := await asyncio.to_thread(audio.read, CHUNK_SAMPLES * BYTES_PER_SAMPLE):
                    await self._segment(raw[: len(raw) // BYTES_PER_SAMPLE * BYTES_PER_SAMPLE])
            tail = self.progress.total_samples % WINDOW  # the last partial window: pad it
            if tail:
                await self._segment(bytes((WINDOW - tail) * BYTES_PER_SAMPLE))
            await self._handle(self._pipeline.flush())
            while self._pending:
                await self._commit(self._pending.popleft())
            await self._committer.finish()  # the file is done: its best speaker labels
            self.progress.processed_samples = self.progress.total_samples
        finally:
            # Cancelled or failed: what is still queued for this file is dropped.
            self._services.scheduler.cancel(self._options.source_id)
            await self._committer.close()

    async def _segment(self, pcm: bytes) -> None:
        step = SLICE_WINDOWS * WINDOW * BYTES_PER_SAMPLE
        for offset in range(0, len(pcm), step):
            await self._handle(await self._pipeline.decode(pcm[offset : offset + step]))
            self._advance()
            await asyncio.sleep(0)  # let live rooms run between slices

    async def _handle(self, events: list[SegmentEvent]) -> None:
        for event in events:
            if not isinstance(event, UtteranceEnded):
                continue
            while len(self._pending) >= max(1, self._options.in_flight()):
                await self._commit(self._pending.popleft())
            self.progress.utterances += 1
            # The padded last window may carry an utterance's end past the file's.
            end = max(event.start, min(event.end, self.progress.total_samples))
            self._pending.append(await self._committer.submit(dataclasses.replace(event, end=end)))
            self._advance()

    def _advance(self) -> None:
        done = self._pending[0].start if self._pending else self._pipeline.position
        done = min(done, self.progress.total_samples)
        self.progress.processed_samples = max(self.progress.processed_samples, done)

    async def _commit(self, pending: PendingFinal) -> None:
        committed = await self._committer.commit(pending)
        if committed.lost is not None:
            raise committed.lost  # the retry of a failed batch failed too: the job fails
        self.progress.empty = self._committer.empty
        self._advance()
        share = self._options.model_share()
        if share < 1.0 and committed.result is not None:
            # Leave the model idle for live rooms: pace, do not poll.
            await asyncio.sleep(committed.result.inference * (1.0 / max(share, 0.05) - 1.0))


class _ToProgress:
    """A file's share of what the committer commits: its growing result."""

    def __init__(self, progress: FileProgress) -> None:
        self._progress = progress

    def final(self, record: FinalRecord, payload: str) -> None:
        self._progress.finals.append(record)

    def message(self, message: ServerMessage) -> None:
        return None  # no client socket: the job resource reads the progress

    def relabelled(self, speakers: Mapping[str, str]) -> None:
        self._progress.finals[:] = [
            dataclasses.replace(f, speaker=speakers[f.utterance_id])
            if f.utterance_id in speakers
            else f
            for f in self._progress.finals
        ]
