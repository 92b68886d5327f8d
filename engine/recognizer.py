"""The Recognizer protocol: a batch of utterances in, one transcription per utterance out.

Implementations run on the scheduler's single worker thread; they may block. They must
return a list of exactly the input's length (the scheduler fails the whole batch otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 16_000

AudioArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Utterance:
    """Mono float32 audio at 16 kHz, in [-1, 1].

    `language` is an ISO 639-1 code to pin, or None to let a multilingual model detect it
    (an English-only model ignores it). A session detects once, then pins what it found.
    `draft` is what an earlier transcription of this utterance's beginning said (its
    latest partial): a recognizer may use it to decode faster, never to change the result.
    """

    audio: AudioArray
    language: str | None = None
    draft: str = ""

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class WordTiming:
    word: str
    start: float  # seconds from the start of the utterance's audio
    end: float


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


class Recognizer(Protocol):
    """A speech model that transcribes batches."""

    @property
    def name(self) -> str:
        """A short name for logs and metrics, e.g. 'tiny.en'."""
        ...

    @property
    def max_batch_size(self) -> int:
        """The largest batch this recognizer should be given."""
        ...

    @property
    def languages(self) -> frozenset[str]:
        """The ISO 639-1 codes it transcribes: `{'en'}` for an English-only model."""
        ...

    def transcribe(self, batch: Sequence[Utterance]) -> list[Transcription]:
        """Transcribe every utterance; one result per input, in order. Blocking."""
        ...

    def warmup(self) -> None:
        """Run the model once so the first real request does not pay for lazy init."""
        ...
