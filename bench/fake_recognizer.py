"""The one stand-in for the speech model, typed against the engine's Recognizer protocol:
deterministic, thread-safe, milliseconds by default. The tests drive the scheduler and the
server with it (recording what it was asked, gating batches); `python -m bench.fake_server`
serves with it, its model time simulated per batch.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence

from engine.api import Transcription, Utterance
from engine.recognizer import Interrupted, Recognizer

STEP = 0.005  # seconds between looks at `should_stop` while a batch's time is simulated


def batch_table(text: str) -> list[tuple[int, float]]:
    """`size:ms,...` as (size, seconds), sorted by size."""
    points = []
    for item in text.split(","):
        size, _, ms = item.partition(":")
        points.append((int(size), float(ms) / 1000))
    if not points or any(size < 1 or seconds < 0 for size, seconds in points):
        raise ValueError(f"a batch table is size:ms,... with sizes >= 1, not {text!r}")
    return sorted(points)


def table_seconds(table: Sequence[tuple[int, float]], size: int) -> float:
    """A batch of `size`'s time by `table`: linear between its sizes; beyond its ends, the
    end's time per row."""
    if size <= table[0][0]:
        return table[0][1] * size / table[0][0]
    for (low, low_s), (high, high_s) in itertools.pairwise(table):
        if size <= high:
            return low_s + (high_s - low_s) * (size - low) / (high - low)
    return table[-1][1] * size / table[-1][0]


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

    A batch of n takes `batch_s` + n x `utterance_s`, or, given `table` ((size, seconds)
    rows), the table's time interpolated between its sizes: the model's time simulated
    with a sleep that holds no GIL (as a GPU's kernels do not), stopped within `STEP`
    when the scheduler says stop. `record=False` keeps none of the lists above (a long
    bench would grow them without bound).
    """

    def __init__(
        self,
        *,
        gated: bool = False,
        languages: frozenset[str] = frozenset({"en"}),
        detects: tuple[str, float] = ("en", 1.0),
        batch_s: float = 0.0,
        utterance_s: float = 0.0,
        table: Sequence[tuple[int, float]] = (),
        record: bool = True,
    ) -> None:
        self._batch_s = batch_s
        self._utterance_s = utterance_s
        self._table = list(table)
        self._record = record
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
    def languages(self) -> frozenset[str]:
        return self._languages

    def warmup(self) -> None:
        return None

    def seconds(self, size: int) -> float:
        """The simulated model time of a batch of `size`."""
        if self._table:
            return table_seconds(self._table, size)
        return self._batch_s + self._utterance_s * size

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: Callable[[], bool] | None = None
    ) -> list[Transcription]:
        sizes = [len(u.audio) for u in batch]
        if self._record:
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
        end = time.monotonic() + self.seconds(len(batch))
        while (left := end - time.monotonic()) > 0:
            if should_stop is not None and should_stop():
                raise Interrupted("stopped")
            time.sleep(min(STEP, left))
        if self.fail_on is not None and self.fail_on in sizes:
            raise RuntimeError(f"fake failure on n={self.fail_on}")
        results = [self.result(u) for u in batch]
        return results[:-1] if self.wrong_length else results

    def result(self, utterance: Utterance) -> Transcription:
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


_TYPED: type[Recognizer] = FakeRecognizer  # mypy checks it against the protocol
