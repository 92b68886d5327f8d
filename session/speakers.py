"""Speaker labels for one diarized source (`diarize=true`), live or file.

The glue between the shared `SpeakerEmbedder` (engine/speakers.py), the source's sans-I/O
`Diarizer` (session/diarizer.py) and the committer that logs finals:

- `embed(audio)` starts embedding an utterance as soon as it is cut, alongside its
  recognition, so the label is ready when the text is (no added latency);
- `label(...)` turns one recognized utterance into labelled parts: one part when one
  speaker holds it; where the speaker changes inside it, the parts' words come from the
  word timings when the model gave them, else each part is transcribed on its own (the
  text of a part is then the model's, never a guess);
- `recluster(final=...)` re-clusters the source's segments every so often (off the event
  loop) and `relabel(...)` writes the labels that changed to the meeting's log and builds
  the `transcript.speaker` messages for the stream and its listeners.

An utterance whose embedding is refused (the embedder's queue is full) or too short to
embed keeps the label of the segment before it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.api import (
    SAMPLE_RATE,
    EmbedderFull,
    SpeakerEmbedding,
    SpeakerWindows,
    Transcription,
    WordTiming,
)
from session.diarizer import Diarizer, DiarizerConfig, Part, Relabel
from session.enrolled import EnrolledVoices
from store.api import Store
from store.errors import StoreError
from wire import build
from wire.messages import TranscriptSpeaker

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]
Recognize = Callable[[FloatArray], Awaitable[Transcription | None]]


@dataclass(frozen=True, slots=True)
class LabelledPart:
    """One final's worth of an utterance: samples `start`..`end` from the utterance's start."""

    utterance_id: str
    start: int
    end: int
    text: str
    words: tuple[WordTiming, ...]  # seconds from the utterance's start
    speaker: str
    language: str


class SpeakerLabeller:
    def __init__(
        self,
        embedder: SpeakerEmbedding,
        config: DiarizerConfig | None = None,
        enrolled: EnrolledVoices | None = None,
    ) -> None:
        """`enrolled`: the tenant's named voices; clusters that match one show its name."""
        self._embedder = embedder
        self.diarizer = Diarizer(config or DiarizerConfig(), enrolled=enrolled)
        self._tasks: set[asyncio.Task[SpeakerWindows | None]] = set()

    def embed(self, audio: FloatArray) -> asyncio.Task[SpeakerWindows | None]:
        """Start embedding one utterance now; await the task when its text is back."""
        task = asyncio.create_task(self._embed(audio), name="speaker-embed")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _embed(self, audio: FloatArray) -> SpeakerWindows | None:
        try:
            return await self._embedder.embed(audio)
        except EmbedderFull:
            logger.warning("speaker embedder full: an utterance keeps the previous label")
            return None

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def label(
        self,
        utterance_id: str,
        start: float,
        audio: FloatArray,
        windows: SpeakerWindows | None,
        transcription: Transcription,
        recognize: Recognize,
    ) -> list[LabelledPart]:
        """Cut one recognized utterance (starting `start` s into the source) at speaker
        changes and label each part that has words. Parts keep the utterance's order."""
        if windows is None:
            parts = [Part(0, len(audio), None)]
        else:
            parts = self.diarizer.parts(audio, windows)
        texts = await self._texts(parts, audio, transcription, recognize)
        out: list[LabelledPart] = []
        for part, (text, words, language) in zip(parts, texts, strict=True):
            if not text:
                continue
            key = utterance_id if not out else f"{utterance_id}.{len(out)}"
            speaker = self.diarizer.assign(
                key,
                start + part.start / SAMPLE_RATE,
                start + part.end / SAMPLE_RATE,
                part.embedding,
                part.windows,
            )
            out.append(LabelledPart(key, part.start, part.end, text, words, speaker, language))
        return out

    async def _texts(
        self,
        parts: Sequence[Part],
        audio: FloatArray,
        transcription: Transcription,
        recognize: Recognize,
    ) -> list[tuple[str, tuple[WordTiming, ...], str]]:
        whole = transcription.text.strip()
        if len(parts) == 1:
            return [(whole, transcription.words, transcription.language)]
        if transcription.words:  # split the words where the parts meet
            out: list[tuple[str, tuple[WordTiming, ...], str]] = []
            for part in parts:
                words = tuple(
                    w
                    for w in transcription.words
                    if part.start <= (w.start + w.end) / 2 * SAMPLE_RATE < part.end
                )
                text = "".join(w.word for w in words).strip()
                out.append((text, words, transcription.language))
            return out
        results = await asyncio.gather(*(recognize(audio[p.start : p.end]) for p in parts))
        if any(r is None for r in results):  # a part failed: keep the words, unsplit
            logger.warning("a speaker's part could not be transcribed; the utterance stays whole")
            return [(whole, transcription.words, transcription.language)] + [
                ("", (), transcription.language)
            ] * (len(parts) - 1)
        return [(r.text.strip(), r.words, r.language) for r in results if r is not None]

    async def recluster(self, *, final: bool = False) -> list[Relabel]:
        """Re-cluster when enough new speech came (or, `final`, at the source's end); in
        between, the segments renamed as a cluster came to match an enrolled speaker."""
        if not self.diarizer.segments:
            return []
        if not (final or self.diarizer.due()):
            return self.diarizer.renamed() if self.diarizer.enrolled else []
        return await asyncio.to_thread(self.diarizer.recluster)


async def relabel(
    store: Store, meeting_id: str, relabels: Sequence[Relabel]
) -> list[TranscriptSpeaker]:
    """Write new labels to the meeting's log (best effort: the events go out anyway) and
    return the `transcript.speaker` messages announcing them."""
    if not relabels:
        return []
    try:
        await store.set_speakers(meeting_id, {r.key: r.label for r in relabels})
    except StoreError:
        logger.warning("meeting %s: speaker labels not stored", meeting_id, exc_info=True)
    return [build.transcript_speaker(r.key, r.label) for r in relabels]
