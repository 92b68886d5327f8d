"""The Recognizer protocol: a batch of utterances in, one transcription per utterance out.

Implementations run on the scheduler's worker threads, one batch per thread at a time (so
they must be safe to call from several threads at once); they may block. They must
return a list of exactly the input's length (the scheduler fails the whole batch otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from engine.api import Transcription, Utterance

StopCheck = Callable[[], bool]


class Interrupted(Exception):
    """`should_stop` said to stop the batch before it finished; it has no results."""


class Recognizer(Protocol):
    """A speech model that transcribes batches."""

    @property
    def name(self) -> str:
        """A short name for logs and metrics, e.g. 'tiny.en'."""
        ...

    @property
    def languages(self) -> frozenset[str]:
        """The ISO 639-1 codes it transcribes: `{'en'}` for an English-only model."""
        ...

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: StopCheck | None = None
    ) -> list[Transcription]:
        """Transcribe every utterance; one result per input, in order. Blocking.

        `should_stop`, when given, is polled between steps of the work (a recognizer
        chooses where; often enough that a stop takes effect within tens of milliseconds
        to a few hundred): when it returns True, raise `Interrupted`."""
        ...

    def warmup(self) -> None:
        """Run the model once so the first real request does not pay for lazy init."""
        ...
