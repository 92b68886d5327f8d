"""A fake recognizer for scheduler logic tests: deterministic, milliseconds, thread-safe."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from engine.api import Transcription, Utterance
from engine.recognizer import Interrupted


class FakeRecognizer:
    """Transcribes an utterance as 'n=<sample count>'; records every batch it ran.

    `gate` (when set) makes each batch wait until the test releases it, so a test can
    queue requests while a batch is in flight; a gated batch that the scheduler stops
    (`should_stop`) raises Interrupted and is recorded in `stopped`; `checked` is set each
    time a gated batch has asked `should_stop` (and recorded a stop). `fail_on` makes a
    batch containing an utterance of that length raise. Given `languages` beyond English
    it is multilingual: an utterance that pins no language is "detected" as `detects`
    (code, probability).
    `asked` records every utterance's `language` (None: detection asked for), `drafts`
    every utterance's (sample count, draft), `prompts` its (sample count, prompt),
    `keyterms` its (sample count, keyterms), `timed`
    the sample count of every utterance that asked for word timings (finals do).
    `empty_on` gives an utterance of that length empty text (as the guard empties one).
    """

    def __init__(
        self,
        max_batch_size: int = 8,
        *,
        gated: bool = False,
        languages: frozenset[str] = frozenset({"en"}),
        detects: tuple[str, float] = ("en", 1.0),
    ) -> None:
        self._max_batch_size = max_batch_size
        self._languages = languages
        self.detects = detects
        self.asked: list[str | None] = []
        self.drafts: list[tuple[int, str]] = []
        self.prompts: list[tuple[int, str]] = []
        self.keyterms: list[tuple[int, tuple[str, ...]]] = []
        self.lefts: list[Utterance] = []  # every utterance that came with a left context
        self.timed: list[int] = []
        self.empty_on: int | None = None
        self.batches: list[list[int]] = []
        self.fail_on: int | None = None
        self.wrong_length = False
        self.gate = threading.Semaphore(0) if gated else None
        self.entered = threading.Event()
        self.stopped: list[list[int]] = []  # batches stopped by `should_stop`
        self.checked = threading.Event()  # a gated batch asked `should_stop`

    def release(self, batches: int = 1) -> None:
        """Let `batches` gated batches run (or pass the gate, when they come)."""
        assert self.gate is not None, "release() is for a gated FakeRecognizer"
        for _ in range(batches):
            self.gate.release()

    @property
    def name(self) -> str:
        return "fake"

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def languages(self) -> frozenset[str]:
        return self._languages

    def warmup(self) -> None:
        return None

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: Callable[[], bool] | None = None
    ) -> list[Transcription]:
        sizes = [len(u.audio) for u in batch]
        self.batches.append(sizes)
        self.asked.extend(u.language for u in batch)
        self.drafts.extend((len(u.audio), u.draft) for u in batch)
        self.prompts.extend((len(u.audio), u.prompt) for u in batch)
        self.keyterms.extend((len(u.audio), u.keyterms) for u in batch)
        self.lefts.extend(u for u in batch if u.left is not None)
        self.timed.extend(len(u.audio) for u in batch if u.word_timings)
        self.entered.set()
        if self.gate is not None:
            # Wait for the test to release the batch, or for the scheduler to stop it.
            deadline = time.monotonic() + 10
            while not self.gate.acquire(timeout=0.005):
                if should_stop is not None:
                    if should_stop():
                        self.stopped.append(sizes)
                        self.checked.set()
                        raise Interrupted("stopped")
                    self.checked.set()
                if time.monotonic() > deadline:
                    break
        if self.fail_on is not None and self.fail_on in sizes:
            raise RuntimeError(f"fake failure on n={self.fail_on}")
        results = [self._result(u) for u in batch]
        return results[:-1] if self.wrong_length else results

    def _result(self, utterance: Utterance) -> Transcription:
        text = "" if len(utterance.audio) == self.empty_on else f"n={len(utterance.audio)}"
        if len(self._languages) == 1:
            language, probability = next(iter(self._languages)), None
        elif utterance.language is None:
            language, probability = self.detects
        else:
            language, probability = utterance.language, None
        return Transcription(
            text=text,
            language=language,
            avg_logprob=-0.1,
            no_speech_prob=0.0,
            language_probability=probability,
        )
