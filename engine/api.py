"""The engine as session/ sees it: requests in, results out, and what can go wrong.

A session builds an `Utterance` (16 kHz mono audio, an optional pinned language and a
decoding draft), wraps it in a `RecognitionRequest` with a `Priority`, and `submit`s it
to the shared `Recognition` (the `BatchScheduler`); it awaits the returned future for a
`RecognitionResult`, or `cancel`s what it no longer needs. A session submits every
partial it would like shown; the engine keeps the newest per session and, under load,
thins them out for every session alike (finals never wait for them). A session may also
submit a final early (SPECULATIVE, the newest per session kept) and `promote` it once
its endpoint is confirmed.

Errors (every one a `SchedulerError`):

    SchedulerError
    ├── SchedulerFull       the queue is at its bound; the request (a partial) was refused
    ├── RequestSuperseded   a newer partial of the same session replaced this one
    ├── SchedulerStopped    the scheduler is not running, or stopped before the request ran
    ├── BatchFailed         the model raised for this request's batch; a retry may succeed
    └── EngineDead          the scheduler's loop died: nothing will run again (not recoverable)

Nothing here imports torch or the model: session/ and server/ import this module freely.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 16_000  # the model's rate: every stream and file is resampled to it

AudioArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class LeftContext:
    """The audio just before an utterance and what was said in it: its source's previous
    utterances (each with the gap after it) and their finals' text. `shorter` is the same
    context without its oldest utterance (None when it holds one), for a recognizer that
    has room for less; `words`, its text's words with their times, let it keep the last
    words that fit instead."""

    audio: AudioArray
    text: str
    shorter: LeftContext | None = None
    # The text's words, times in seconds from the start of `audio` (empty: not known):
    # where a recognizer may cut the context short at a word (`engine.whisper.context.filled`).
    words: tuple[WordTiming, ...] = ()
    # The utterance goes on from this audio without a pause (a client cut the speech
    # there): alone it would start inside a word, so a scheduler under load keeps it.
    essential: bool = False

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class Utterance:
    """Mono float32 audio at 16 kHz, in [-1, 1].

    `language` is an ISO 639-1 code to pin, or None to let a multilingual model detect it
    (an English-only model ignores it). A session detects once, then pins what it found.
    `draft` is what an earlier transcription of this utterance's beginning said (its
    latest partial): a recognizer may use it to decode faster, never to change the result.
    `prompt` is the text said before it by the same source (its previous finals): Whisper
    is conditioned on it (`<|startofprev|>`), which keeps spelling, casing and punctuation
    consistent; a recognizer keeps its most recent part. Empty: decoded on its own.
    `word_timings` asks for the transcription's `words` (finals do; partials do not: the
    timings cost another decoder pass).
    `left` is the audio before it with its text: a recognizer may put that audio in the
    same window, ahead of the utterance, and its text ahead of the transcript, so the
    model hears the utterance in context (it transcribes only the utterance itself, and
    may drop the context when it does not fit).
    `partial` marks a partial transcript, which only has to be good enough to show for a
    moment: a recognizer may decode it more cheaply than a final (a shorter encoder
    window, a smaller token budget) and, where a final would be decoded again (a loop),
    keep what it read before it looped, or give it empty text.
    `keyterms` are words the source expects (names, products, jargon), as they should be
    written: a recognizer favours them where the audio allows (`engine.whisper.keyterms`), and
    never writes one that was not said. Empty: none.
    """

    audio: AudioArray
    language: str | None = None
    draft: str = ""
    prompt: str = ""
    word_timings: bool = False
    left: LeftContext | None = None
    partial: bool = False
    keyterms: tuple[str, ...] = ()

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class WordTiming:
    """One word of a transcription: its text as the model wrote it (with its leading
    space; the words joined make the text), its span and the model's probability of it
    (the mean over its tokens)."""

    word: str
    start: float  # seconds from the start of the utterance's audio
    end: float
    probability: float


@dataclass(frozen=True, slots=True)
class Transcription:
    """What the model heard in one utterance.

    `text` is empty when the hallucination guard judged the audio not to be speech.
    `language` is the language it was decoded in; `language_probability` is the model's
    probability of that language when it detected it, None when it was pinned (or the
    model knows one language only).
    """

    text: str
    language: str
    avg_logprob: float
    no_speech_prob: float
    words: tuple[WordTiming, ...] = field(default=())
    language_probability: float | None = None


class Priority(enum.IntEnum):
    """Lower values are served first.

    SPECULATIVE is a final decoded before its endpoint is confirmed (the utterance has
    gone silent; it may yet resume): it runs when no final or file request needs a
    worker, finals stop it as they stop partials, and `promote` makes it a final once the
    endpoint comes. One whose client flushes (`RecognitionRequest.awaited`) starts before
    partials."""

    FINAL = 0
    FILE = 1
    SPECULATIVE = 2
    PARTIAL = 3


@dataclass(frozen=True, slots=True)
class RecognitionRequest:
    session_id: str  # the key `cancel` drops by; a session has at most one queued partial
    priority: Priority
    utterance: Utterance
    # When a final's utterance was cut (time.monotonic, the scheduler's clock): a live
    # final's latency budget for its left context counts from it. None: from its submit.
    closed_at: float | None = None
    # A FINAL or SPECULATIVE final whose client waits on it (the client flushes): the
    # policy starts it before other finals and partials (engine/scheduling/policy.py,
    # rules 1 and 3).
    awaited: bool = False


@dataclass(frozen=True, slots=True)
class RecognitionResult:
    transcription: Transcription
    queue_wait: float  # seconds from submit to the start of its batch
    inference: float  # seconds the batch took on the worker thread
    batch_size: int


class SchedulerError(Exception):
    """Base of the engine's request errors."""


class SchedulerFull(SchedulerError):
    """The queue is at its bound and the request (a partial) was not admitted."""


class RequestSuperseded(SchedulerError):
    """A newer partial of the same session replaced this one before it ran."""


class SchedulerStopped(SchedulerError):
    """The scheduler is not running, or stopped before the request ran."""


class BatchFailed(SchedulerError):
    """The recognizer raised (or returned the wrong number of results) for this batch."""


class EngineDead(SchedulerError):
    """The scheduler's loop died: every waiting and later request fails with this.

    Not recoverable in this process: `/readyz` reports it, and the server must restart.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"speech engine is dead: {reason}")
        self.reason = reason


class Recognition(Protocol):
    """What a session may ask of the engine (`BatchScheduler` implements it)."""

    async def submit(self, request: RecognitionRequest) -> asyncio.Future[RecognitionResult]:
        """Queue `request`; return the future of its result.

        A partial replaces the session's queued partial (the newer audio; the older
        future fails with RequestSuperseded), or fails with SchedulerFull when the queue
        is full; finals and file requests wait for room. Raises
        SchedulerStopped or EngineDead when nothing will run it.
        """
        ...

    def cancel(self, session_id: str, *, only: Priority | None = None) -> int:
        """Drop the session's queued requests (or only those of priority `only`); their
        futures are cancelled. Returns how many were dropped."""
        ...

    def promote(self, request: RecognitionRequest) -> bool:
        """The SPECULATIVE `request` (as submitted) is a final now: queued, it is served
        as a final submitted now; running, finals no longer stop it. False if it is
        neither queued nor running (it finished, failed or was dropped)."""
        ...

    def expedite(self, request: RecognitionRequest) -> bool:
        """The SPECULATIVE `request` (as submitted) is waited on from now (a turn decision
        reads its words): it is served as an awaited one (`RecognitionRequest.awaited`),
        before partials, and finals no longer stop it. False if it is neither queued nor
        running."""
        ...


# ---------------------------------------------------------------- speakers


class EmbedderFull(Exception):
    """Too many speaker windows are waiting: this utterance gets no embedding."""


@dataclass(frozen=True, slots=True)
class SpeakerWindows:
    """The speaker embeddings of one utterance's windows: `bounds[i]` is window i's
    (start, end) in samples from the start of the utterance, `embeddings[i]` its unit
    vector (cosine similarity of two is their dot product)."""

    bounds: tuple[tuple[int, int], ...]
    embeddings: npt.NDArray[np.float32]  # [len(bounds), embedding size]

    def mean(self) -> npt.NDArray[np.float32]:
        """The utterance's embedding: the windows' mean, weighted by length, normalised."""
        weights = np.array([end - start for start, end in self.bounds], np.float32)
        total = weights @ self.embeddings
        norm = float(np.linalg.norm(total))
        return (total / norm).astype(np.float32) if norm > 0 else total


class SpeakerEmbedding(Protocol):
    """What a diarized session asks of the speaker model (`SpeakerEmbedder` implements it)."""

    async def embed(self, audio: npt.NDArray[np.float32]) -> SpeakerWindows:
        """The embeddings of one utterance's windows. Raises EmbedderFull when the
        embedder's queue is at its bound."""
        ...
