"""A fake recognizer for scheduler logic tests: deterministic, milliseconds, thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from engine.recognizer import Transcription, Utterance


class FakeRecognizer:
    """Transcribes an utterance as 'n=<sample count>'; records every batch it ran.

    `gate` (when set) makes each batch wait until the test releases it, so a test can
    queue requests while a batch is in flight. `fail_on` makes a batch containing an
    utterance of that length raise.
    """

    def __init__(self, max_batch_size: int = 8, *, gated: bool = False) -> None:
        self._max_batch_size = max_batch_size
        self.batches: list[list[int]] = []
        self.fail_on: int | None = None
        self.wrong_length = False
        self.gate = threading.Semaphore(0) if gated else None
        self.entered = threading.Event()

    @property
    def name(self) -> str:
        return "fake"

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    def warmup(self) -> None:
        return None

    def transcribe(self, batch: Sequence[Utterance]) -> list[Transcription]:
        sizes = [len(u.audio) for u in batch]
        self.batches.append(sizes)
        self.entered.set()
        if self.gate is not None:
            self.gate.acquire(timeout=10)
        if self.fail_on is not None and self.fail_on in sizes:
            raise RuntimeError(f"fake failure on n={self.fail_on}")
        results = [
            Transcription(text=f"n={n}", language="en", avg_logprob=-0.1, no_speech_prob=0.0)
            for n in sizes
        ]
        return results[:-1] if self.wrong_length else results
