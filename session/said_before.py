"""What a source said just before an utterance: its left context (`engine.whisper.context`).

Each final may carry its source's previous utterances' audio and final text
(`Utterance.left`), so the model hears them in the same window ahead of the utterance: on
a synthetic dialogue per-utterance decoding lost to long-form decoding for want of it
(docs/performance.md#left-context). `SaidBefore` keeps the last `LEFT_UTTERANCES` committed
utterances with text and gives the context of the next: those of them just before it (no
utterance between them left out), as many as fit the limit, each followed by the gap
after it. The gaps are silence to the VAD and go in as zeros, at most `MAX_GAP` each (the
model needs no more to hear a pause; it keeps the window short). The context of two
utterances carries that of the last one alone (`LeftContext.shorter`), for a recognizer
that has room for one only. The context's words carry the finals' word timings moved
onto its audio, so a recognizer may keep only its last words (`engine.whisper.context.filled`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.api import SAMPLE_RATE, LeftContext, WordTiming

FloatArray = npt.NDArray[np.float32]

LEFT_UTTERANCES = 2  # more did no better on the dialogue (docs/performance.md#left-context)
MAX_GAP = 1.5  # seconds of silence kept after each utterance of the context


@dataclass(frozen=True, slots=True)
class _Said:
    index: int
    start: int  # samples on the source's timeline
    end: int
    audio: FloatArray
    text: str
    words: tuple[WordTiming, ...]  # times from the start of `audio`


class SaidBefore:
    def __init__(self) -> None:
        self._said: deque[_Said] = deque(maxlen=LEFT_UTTERANCES)

    def add(
        self,
        index: int,
        start: int,
        end: int,
        audio: FloatArray,
        text: str,
        words: tuple[WordTiming, ...] = (),
    ) -> None:
        """Utterance `index` was committed with `text` (and its `words`, if timed)."""
        self._said.append(_Said(index, start, end, audio, text, words))

    def clear(self) -> None:
        """An utterance said nothing (or was lost): the next starts without context."""
        self._said.clear()

    def before(self, index: int, start: int, limit: float) -> LeftContext | None:
        """The context of utterance `index` starting at sample `start`: at most `limit`
        seconds of the utterances just before it, with their gaps; None if none fits."""
        pieces: list[FloatArray] = []
        texts: list[str] = []
        words: tuple[WordTiming, ...] = ()
        seconds = 0.0
        context: LeftContext | None = None
        for said in reversed(self._said):
            gap = start - said.end
            if said.index != index - 1 or gap < 0:
                break
            silence = np.zeros(min(gap, round(MAX_GAP * SAMPLE_RATE)), np.float32)
            length = (len(said.audio) + len(silence)) / SAMPLE_RATE
            seconds += length
            if seconds > limit:
                break
            # Timed only if every utterance in it is: its words must make its text.
            timed = bool(said.words) and (context is None or bool(context.words))
            words = (*said.words, *(_later(w, length) for w in words)) if timed else ()
            pieces[:0] = [said.audio, silence]
            texts.insert(0, said.text)
            context = LeftContext(
                np.concatenate(pieces), " ".join(texts), shorter=context, words=words
            )
            index, start = said.index, said.start
        return context


def _later(word: WordTiming, seconds: float) -> WordTiming:
    return dataclasses.replace(
        word, start=round(word.start + seconds, 3), end=round(word.end + seconds, 3)
    )
