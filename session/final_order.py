"""When each final of a source goes to the engine, and what it is decoded after.

`FinalOrder` holds a source's open finals (submitted, or cut and waiting) between
`Committer.submit` and `Committer.commit`, and what the next one is decoded after:

Prompts (`CommitterConfig.prompts`): each final is decoded after the source's previous
finals' text (`Utterance.prompt`, the source's rolling `context`, which the store keeps
across a resume), as Whisper conditions on previous text. So a final is sent only once
the one before it is committed: one final of a source is with the engine at a time, and
the finals cut meanwhile wait in order (live, the previous final is almost always
committed by the time the next utterance ends; a file's utterances run one by one). A
final the hallucination guard emptied (no speech, a loop) clears the context: the next
final starts afresh rather than continue from what went wrong. A partial decodes with
its utterance's prompt (`prompt_for_partial`).

Left context (`CommitterConfig.left_context` seconds, 0: off): each final carries the
source's previous utterances' audio and final text (`session.said_before`), so the model
hears them ahead of the utterance. Like prompts, a final is then sent once the one before
it is committed; a final the guard emptied (or a lost one) leaves the next without.
Once the source's client flushes (`drop_left_context`, CONTEXT_AFTER_FLUSH off), its later
finals go without (a client that flushes waits on each final), but for one that goes on
from a cut in mid-speech: its context is essential.

How long a final waits for the one before it (`CommitterConfig.context_wait`): a file's
as long as it takes (its text matters, not when it comes), a live source's at most a
second. Past that it goes to the engine without its prompt or context, beside the one
still in flight, so a slow or stuck final never holds up the source's next ones by more
than that (finals of a source then share batches again, as with neither). The final
after it waits for it in turn and gets its context as usual.

A final goes through the source's `LanguageGate` when it is admitted (it may hold it
until the language is known); `send` hands an admitted final to the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engine.api import LeftContext, RecognitionResult, SpeakerWindows, Utterance
from session.language import LanguageGate
from session.said_before import SaidBefore

# Rolling text context kept per source: the prompt of its next final (the recognizer keeps
# its last `prompt_tokens` tokens; 128 tokens of English are ~600 characters).
CONTEXT_CHARS = 1000


@dataclass(slots=True)
class PendingFinal:
    """A cut utterance on its way to the log."""

    index: int
    start: int  # samples on the source's timeline
    end: int
    utterance: Utterance
    closed_at: float  # when it was submitted (or cut, while held)
    # It goes on from the utterance before it, split by a client's cut in mid-speech: its
    # left context is `essential` (session/segmenter.py).
    continues: bool = False
    # None while held back until the source's language is known (language=auto only).
    future: asyncio.Future[RecognitionResult] | None = None
    # Its speaker embeddings, computed beside its recognition (diarized sources).
    speakers: asyncio.Task[SpeakerWindows | None] | None = None
    # The VAD's state at `end`, stored with the source (a resume goes on from it).
    vad_state: str | None = None
    # When the client's flush that cut it was received (None: not cut by a flush).
    flushed_at: float | None = None


@dataclass(frozen=True, slots=True)
class FinalizeAck:
    """Queued behind the finals a `finalize` cut: the committer acknowledges it in order."""

    utterance_id: str | None


class FinalOrder:
    def __init__(
        self,
        gate: LanguageGate[PendingFinal],
        send: Callable[[PendingFinal], Awaitable[None]],
        *,
        prompts: bool,
        left_context: float,
        context_wait: float | None,
        context_languages: frozenset[str] | None,
        clock: Callable[[], float],
        context: str = "",
    ) -> None:
        """The settings are `CommitterConfig`'s; `context`: the source's rolling context
        so far (a resumed source's)."""
        self._gate = gate
        self._send = send
        self._prompts = prompts
        self._left_context = left_context
        self._essential_only = False  # left context only where essential (`drop_left_context`)
        self._context_wait = context_wait
        self._context_languages = context_languages
        self._clock = clock
        self.context = context  # the source's recent final text: the next final's prompt
        self._open = 0  # finals submitted (or waiting for their prompt), not yet committed
        self._waiting: deque[PendingFinal] = deque()  # cut, waiting for their prompt
        self._cut = asyncio.Event()  # a final started waiting
        self._said = SaidBefore()  # the next final's left context

    def drop_left_context(self) -> None:
        """The source's finals from now on go without left context (its client flushes:
        it waits on each final, and a context doubles the final's encoder window), but for
        those that go on from a cut in mid-speech (`_essential`)."""
        self._essential_only = True

    def _limit_for(self, continues: bool) -> float:
        """Most seconds of left context a final carries that goes on from a cut in
        mid-speech (`continues`) or not."""
        return 0.0 if self._essential_only and not continues else self.left_limit()

    def left_limit(self) -> float:
        """Most seconds of left context the source's next final carries: none with left
        context off or in a language it is not used for (a source whose language is
        still being detected may get it)."""
        languages, language = self._context_languages, self._gate.language
        if languages is not None and language is not None and language not in languages:
            return 0.0
        return self._left_context

    def in_order(self) -> bool:
        """Whether a final waits for the one before it (its prompt or its context)."""
        return self._prompts or self.left_limit() > 0

    def prompt_for_partial(self) -> str | None:
        """The prompt a partial of the utterance in progress decodes with: its final's
        (the context once every earlier final is committed), "" with prompts off, None
        while an earlier final is still open (the partial would decode in another
        context than its final)."""
        if not self._prompts:
            return ""
        return None if self._open else self.context

    def speculative(
        self, utterance: Utterance, index: int, start: int, continues: bool = False
    ) -> Utterance | None:
        """`utterance` (with its prompt) as its final would go if cut now, with its left
        context; None while that is an open final's."""
        limit = self._limit_for(continues)
        if limit <= 0:
            return utterance
        if self._open:
            return None
        left = _essential(self._said.before(index, start, limit), continues)
        return dataclasses.replace(utterance, left=left)

    async def cut(self, pending: PendingFinal) -> None:
        """A final was cut: send it now, or let it wait for the one before it."""
        self._open += 1
        if self.in_order() and self._open > 1:
            self._waiting.append(pending)
            self._cut.set()
        elif await self._admit(pending):
            pending.closed_at = self._clock()

    async def _admit(self, pending: PendingFinal, *, alone: bool = False) -> bool:
        """Send the final now, in the source's language and with its prompt and left
        context (none if `alone`: the final before it is still open), unless the language
        gate holds it (False)."""
        language = pending.utterance.language or self._gate.language
        pending.utterance = dataclasses.replace(pending.utterance, language=language)
        if self.in_order():
            limit = 0.0 if alone else self._limit_for(pending.continues)
            left = self._said.before(pending.index, pending.start, limit) if limit > 0 else None
            left = _essential(left, pending.continues)
            pending.utterance = dataclasses.replace(
                pending.utterance,
                prompt=self.context if self._prompts and not alone else "",
                left=left,
            )
        if not self._gate.admit(pending):
            return False
        await self._send(pending)
        return True

    def hear_before(self, said: SaidBefore) -> None:
        """A resumed source's last utterances, heard again: the next final's left context
        (session.resume_context)."""
        self._said = said

    def heard(self, text: str) -> None:
        """A final of `text` is being logged: the next final's prompt ends with it."""
        self.context = (self.context + " " + text)[-CONTEXT_CHARS:].strip()

    async def committed(
        self, pending: PendingFinal, result: RecognitionResult | None, logged: bool
    ) -> None:
        """`pending` was committed (`result` None: lost; `logged`: it made finals, else
        the guard emptied it): it is no longer open, and the finals that waited for it
        go."""
        self._open -= 1
        if result is not None and not logged:
            self.context = ""  # the guard emptied it: the next final starts afresh
        if logged and result is not None and self.left_limit() > 0:
            transcription = result.transcription
            self._said.add(
                pending.index,
                pending.start,
                pending.end,
                pending.utterance.audio,
                transcription.text.strip(),
                transcription.words,
            )
        else:
            self._said.clear()
        if not self.in_order():  # the language pinned is one without left context
            while self._waiting:
                await self._admit(self._waiting.popleft())
        elif self._waiting and self._open == len(self._waiting):  # none in flight before it
            await self._admit(self._waiting.popleft())

    async def meanwhile(self, future: asyncio.Future[RecognitionResult]) -> RecognitionResult:
        """Await an open final's result; meanwhile send each final that has waited
        `context_wait` for the one before it, without its prompt and context."""
        wait = self._context_wait
        while wait is not None and self.in_order() and not future.done():
            if not self._waiting:  # until one is cut, or the result comes
                self._cut.clear()
                cut = asyncio.ensure_future(self._cut.wait())
                either: set[asyncio.Future[object]] = {future, cut}  # type: ignore[arg-type]
                try:
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    cut.cancel()
                continue
            delay = self._waiting[0].closed_at + wait - self._clock()
            if delay > 0:
                await asyncio.wait({future}, timeout=delay)
            else:
                await self._admit(self._waiting.popleft(), alone=True)
        return await future


def _essential(left: LeftContext | None, continues: bool) -> LeftContext | None:
    """The left context of an utterance that goes on from it without a pause (a client's
    cut in mid-speech): essential (alone, its first word would be cut), and its text
    without its last word, the one the cut fell in: the model hears that word whole
    across the cut and writes it again as the utterance's first."""
    if left is None or not continues:
        return left
    shorter = _essential(left.shorter, continues)
    text, _, _ = left.text.rstrip().rpartition(" ")
    return dataclasses.replace(
        left, text=text, words=left.words[:-1], shorter=shorter, essential=True
    )
