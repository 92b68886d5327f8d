"""Speculative finals: a live source's final decoded while its endpoint is still awaited.

An utterance ends after `min_silence` of silence, but the audio its final carries (up to
the last speech plus the post-roll) is fixed well before that: the segmenter says so with
`UtteranceMayEnd`. The actor then has the committer build the final's utterance exactly as
`Committer.submit` would (`Committer.speculative_utterance`: same audio, language, prompt,
word timings) and hands it to `Speculator.speculate`, which submits it at
`Priority.SPECULATIVE`: the scheduler runs it on model time no final needs. When the
endpoint comes, the committer submits the final through this `Speculator` (it is the
committer's `Recognition`): a final whose utterance equals the one speculated (the draft
aside: a draft never changes a result) takes the speculation's future and the scheduler
promotes it to a final, so the final is decoded once, and usually is ready by then. Any
other request goes to the scheduler as it is.

A speculation is withdrawn when speech resumes (`UtteranceResumed`), when the utterance
ends otherwise than speculated (the actor withdraws what the final's submit did not take)
and when the stream ends. Each one is counted once by outcome (telemetry `speculative_final`):

- `used`: a final took it;
- `discarded`: withdrawn after the model had started on it (its model time is wasted);
- `cancelled`: withdrawn while still queued (no model time spent).

The final's text is the one a final submitted at its endpoint would get, its `seq` and
order are the committer's as always, and a failed speculation is retried as any final is.

A client's flush (`finalize`, Deepgram's `Finalize`, OpenAI's `commit`) comes after its
own VAD heard ~0.2 s of silence; by then the speculation made at the post-roll has
usually been decoded, and the flush is answered from it (`answered` counts each flush's
time from its receipt to its final, telemetry `flush_answered`, by what served it:
`speculation` (ready at the flush), `speculation_unfinished` (taken while decoding or
queued) or `decoded` (no speculation matched: decoded at the flush).

The turn model's words check (session/turn_words.py) reads the held speculation
(`transcription`) and waits on it for a moment: from then on the scheduler serves it as a
flushing client's (`Recognition.expedite`: before partials), since its text is wanted now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.api import (
    LeftContext,
    Priority,
    Recognition,
    RecognitionRequest,
    RecognitionResult,
    Transcription,
    Utterance,
)
from session.telemetry import Telemetry

logger = logging.getLogger(__name__)

SERVED_KEPT = 8  # speculations taken whose final's flush may still be counted


@dataclass(frozen=True, slots=True)
class _Speculation:
    request: RecognitionRequest
    future: asyncio.Future[RecognitionResult]
    submitted: float  # the clock's time of its submit


class Speculator:
    """One connection's speculative final (at most one at a time), and the `Recognition`
    its committer submits through."""

    def __init__(
        self,
        recognition: Recognition,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recognition = recognition
        self._telemetry = telemetry
        self._clock = clock
        self._held: _Speculation | None = None
        self._withdrawals = 0  # a speculation withdrawn while its submit was awaited is dropped
        # A speculation not known yet (`speculate_when`), and the key it goes under.
        self._wanted: tuple[str, Callable[[], Utterance | None]] | None = None
        # The futures of the speculations finals took: whether each was ready then, and
        # when it was submitted.
        self._served: dict[asyncio.Future[RecognitionResult], tuple[str, float]] = {}
        self.outcomes: dict[str, int] = {"used": 0, "discarded": 0, "cancelled": 0}
        # The client flushes (its protocol's clients do, or it has): it waits on each
        # final, so its finals go first and its speculations before partials
        # (`RecognitionRequest.awaited`).
        self.awaited = False

    async def speculate(self, key: str, utterance: Utterance | None) -> None:
        """Decode `utterance` (None: its final's decoding is not known yet) as the final
        of the utterance going silent now, replacing any earlier speculation."""
        self.withdraw()
        if utterance is None:
            return
        request = RecognitionRequest(key, Priority.SPECULATIVE, utterance, awaited=self.awaited)
        withdrawals = self._withdrawals
        try:
            future = await self._recognition.submit(request)
        except Exception:  # full, stopped or dead: the final will be submitted as one
            return
        future.add_done_callback(_retrieve)
        self._held = _Speculation(request, future, self._clock())
        if self._withdrawals != withdrawals:  # withdrawn while it was being submitted
            self.withdraw()

    async def speculate_when(self, key: str, build: Callable[[], Utterance | None]) -> None:
        """Speculate the utterance `build` gives; while it gives None (the final's prompt or
        left context is still an open final's), `retry` asks it again, after each final
        commits, until the speculation is withdrawn: a flush after a slow final is still
        answered from a speculation when the silence lasts long enough."""
        self.withdraw()
        self._wanted = (key, build)
        await self.retry()

    async def retry(self) -> None:
        """Make the speculation `speculate_when` wants, if it can be made now."""
        if self._wanted is None or self._held is not None:
            return
        key, build = self._wanted
        if (utterance := build()) is not None:
            self._wanted = None
            await self.speculate(key, utterance)

    async def transcription(self, timeout: float) -> Transcription | None:
        """The held speculation's transcription once decoded (its text and the language it
        was decoded in), waiting at most `timeout` seconds; None: none is held, or it was
        not decoded in time, or failed (the turn model's question about the words so far,
        session/turn_words.py)."""
        held = self._held
        if held is None:
            return None
        if not held.future.done():  # waited on now: before partials (a flushing client's)
            self._recognition.expedite(held.request)
        await asyncio.wait({held.future}, timeout=timeout)
        future = held.future
        if not future.done() or future.cancelled() or future.exception() is not None:
            return None
        return future.result().transcription

    def withdraw(self) -> None:
        """The speculation will not be a final: drop it (counted as discarded or cancelled)."""
        self._wanted = None
        self._withdrawals += 1
        held, self._held = self._held, None
        if held is None:
            return
        dropped = (
            not held.future.done()
            and self._recognition.cancel(held.request.session_id, only=Priority.SPECULATIVE) > 0
        )
        self._count("cancelled" if dropped else "discarded")

    # ------------------------------------------------------------------ Recognition

    async def submit(self, request: RecognitionRequest) -> asyncio.Future[RecognitionResult]:
        """A final that decodes as the speculation did takes its future; anything else
        goes to the scheduler."""
        held = self._held
        if held is not None and _same_decoding(held.request, request):
            self._held = None
            future = held.future
            if not future.done() and self._recognition.promote(held.request):
                return self._used(future, "speculation_unfinished", held.submitted)
            if future.done() and not future.cancelled() and future.exception() is None:
                return self._used(future, "speculation", held.submitted)
            self._count("discarded")  # it failed: the final is decoded anew
        elif request.priority is Priority.FINAL and logger.isEnabledFor(logging.DEBUG):
            logger.debug("a final decoded anew: %s", _mismatch(held, self._wanted, request))
        if request.priority is Priority.FINAL and self.awaited:
            request = dataclasses.replace(request, awaited=True)
        return await self._recognition.submit(request)

    def answered(self, future: asyncio.Future[RecognitionResult] | None, since: float) -> None:
        """A flush received at `since` has its final (of `future`) sent: count how long
        it took and what served it."""
        now = self._clock()
        # A final no speculation served was submitted at the flush.
        decoded = ("decoded", since)
        served, submitted = self._served.pop(future, decoded) if future is not None else decoded
        self._telemetry.flush_answered(now - since, served)
        if logger.isEnabledFor(logging.DEBUG) and future is not None and future.done():
            result = None if future.cancelled() or future.exception() else future.result()
            if result is not None:  # when it was submitted, started and done, from the flush
                start = submitted + result.queue_wait
                logger.debug(
                    "flush answered in %.0f ms (%s): submitted %+.0f ms, started %+.0f ms, "
                    "decoded %+.0f ms (%.0f ms, batch %d) from the flush",
                    (now - since) * 1000, served, (submitted - since) * 1000,
                    (start - since) * 1000, (start + result.inference - since) * 1000,
                    result.inference * 1000, result.batch_size,
                )  # fmt: skip

    def cancel(self, session_id: str, *, only: Priority | None = None) -> int:
        return self._recognition.cancel(session_id, only=only)

    def promote(self, request: RecognitionRequest) -> bool:
        return self._recognition.promote(request)

    def expedite(self, request: RecognitionRequest) -> bool:
        return self._recognition.expedite(request)

    def _used(
        self, future: asyncio.Future[RecognitionResult], served: str, submitted: float
    ) -> asyncio.Future[RecognitionResult]:
        self._count("used")
        self._served[future] = (served, submitted)
        while len(self._served) > SERVED_KEPT:  # finals no flush asked for
            del self._served[next(iter(self._served))]
        return future

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self._telemetry.speculative_final(outcome)


def _same_decoding(speculated: RecognitionRequest, final: RecognitionRequest) -> bool:
    """Whether `final` decodes to what `speculated` does: the same key, a final, and the
    same utterance but for its draft."""
    a, b = speculated.utterance, final.utterance
    return (
        final.priority is Priority.FINAL
        and speculated.session_id == final.session_id
        and (a.language, a.prompt, a.word_timings) == (b.language, b.prompt, b.word_timings)
        and np.array_equal(a.audio, b.audio)
        and _same_left(a.left, b.left)
    )


def _mismatch(held: _Speculation | None, wanted: object | None, final: RecognitionRequest) -> str:
    """Why `final` took no speculation (for the debug log)."""
    if held is None:
        return "none was made yet (waiting for a final's prompt)" if wanted else "none held"
    a, b = held.request.utterance, final.utterance
    differs = [
        name
        for name, same in (
            ("audio", np.array_equal(a.audio, b.audio)),
            ("prompt", a.prompt == b.prompt),
            ("left context", _same_left(a.left, b.left)),
            ("language or timings", (a.language, a.word_timings) == (b.language, b.word_timings)),
        )
        if not same
    ]
    sizes = f"{len(a.audio)} vs {len(b.audio)} samples"
    return f"the speculation differs in {', '.join(differs) or 'its key'} ({sizes})"


def _same_left(a: LeftContext | None, b: LeftContext | None) -> bool:
    """The same left context, or none on both (a speculation carries none yet: a final
    with one is decoded on its own)."""
    if a is None or b is None:
        return a is b
    return (a.text, a.essential) == (b.text, b.essential) and np.array_equal(a.audio, b.audio)


def _retrieve(future: asyncio.Future[RecognitionResult]) -> None:
    """A withdrawn speculation's failure is nobody's to await: don't log it as unretrieved."""
    if not future.cancelled():
        future.exception()
