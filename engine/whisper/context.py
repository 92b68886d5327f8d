"""Left context: an utterance decoded in one window behind the audio said before it.

Decoded alone, each utterance's window holds that utterance and silence, and tiny.en
hears every utterance cold. Long-form Whisper decodes 30 s windows that begin with
whatever came before, and on a dialogue of synthetic voices it made far fewer errors
than per-utterance decoding of the very same VAD segments
(docs/history/2026-12-02-quality-and-left-context.md#where-the-dialogues-errors-came-from-left-context):
not from the prompt of previous text (one point), the window length, timestamps or the
segments' padding (none), but from hearing the speech before.

So an utterance may carry its `LeftContext` (`engine.api`): the audio before it (its
source's previous utterance and the gap after it) and that audio's final text. The
recognizer puts the context's audio in the window ahead of the utterance's and feeds the
context's text after <|notimestamps|> as the transcript so far (forced tokens, not the
`<|startofprev|>` prompt), so the model writes on from there: only the utterance's words,
having heard the voice, pace and topic that led up to them. Word timings are aligned over
the whole window (the context's tokens take the context's audio) and moved back to the
utterance's own time. A context never makes the window longer than the recognizer's
`context_window` (20 s): its oldest utterances are dropped until it fits, and a window
that the utterance alone fills gets none (a 30 s window costs four times a 10 s one on
the CPU encoder, and one previous utterance did as well as two on the meeting set).
With `context_own_window` the window is the one the utterance has alone: the context
keeps only its last words that fit the room left there (`filled`, cut at the context's
word timings), so the encoder's first pass costs what it costs without context
(docs/history/2026-12-02-quality-and-left-context.md#left-context-in-the-finals-own-window-issue-17-against-issue-15-branch-ctx):
a short utterance that then loops (1 s of silence after it) is decoded again without its
context in the same window, not on the full one.

Behind a context tiny.en sometimes says the utterance twice ("And it is worth mention in
passing that as an example of fine typography, and it is worth mention in passing ...":
once in 39 utterances of the meeting set), too few repeats for the guard's compression
ratio to call it a loop; `repeats_itself` spots it, and the recognizer then decodes that
utterance again without its context. It may also read the context again, or make up
words, where the utterance is only the breath after a sentence: the context's speech in
the window keeps the no-speech probability low (0.23 where alone the guard drops it).
`repeats_context` spots the first; a low average log-probability the second
(`engine.whisper.window_policy.WindowPolicy.conditioning_failed`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np

from engine.api import SAMPLE_RATE, AudioArray, LeftContext, Utterance, WordTiming


def fitted(utterance: Utterance, room: float) -> Utterance:
    """`utterance` with as much of its left context as fits: its oldest utterances
    dropped while context and utterance together last more than `room` seconds, none
    left if even the last does not fit or the context has no text."""
    left = utterance.left
    while left is not None and left.duration + utterance.duration > room:
        left = left.shorter
    if left is not None and not left.text.strip():
        left = None
    return utterance if left is utterance.left else dataclasses.replace(utterance, left=left)


def filled(utterance: Utterance, room: float) -> Utterance:
    """`utterance` with the last of its left context that fits `room` seconds with it: the
    whole context if it fits; else, where its words are known, its audio and text from
    the first word whose start leaves no more than fits (cut halfway between that word
    and the one before, so the audio kept is the text kept); else `fitted`'s whole
    utterances. Given the room the utterance's own window leaves, the context fills
    padding the encoder runs over anyway: the window stays the one the utterance has
    alone."""
    left = utterance.left
    if left is None:
        return utterance
    free = room - utterance.duration
    if left.duration > free and left.words:
        left = _tail(left, free)
    elif left.duration > free:
        return fitted(utterance, room)
    if left is not None and not left.text.strip():
        left = None
    return utterance if left is utterance.left else dataclasses.replace(utterance, left=left)


def _tail(left: LeftContext, seconds: float) -> LeftContext | None:
    """The context's last words that, with the audio from halfway before the first of
    them, last at most `seconds`; None if not even the last word does."""
    words = left.words
    for i, word in enumerate(words):
        cut = (words[i - 1].end + word.start) / 2 if i else 0.0
        if left.duration - cut <= seconds:
            first = round(cut * SAMPLE_RATE)
            kept = tuple(
                dataclasses.replace(w, start=round(w.start - cut, 3), end=round(w.end - cut, 3))
                for w in words[i:]
            )
            text = "".join(w.word for w in kept).strip()
            return LeftContext(left.audio[first:], text, words=kept)
    return None


def window_audio(utterance: Utterance) -> AudioArray:
    """What goes in the encoder window: the context's audio, then the utterance's."""
    if utterance.left is None:
        return utterance.audio
    return np.concatenate([utterance.left.audio, utterance.audio]).astype(np.float32, copy=False)


def span(utterance: Utterance) -> float:
    """Seconds of `window_audio(utterance)`."""
    return utterance.duration + (utterance.left.duration if utterance.left else 0.0)


def lead_trimmed(tokens: list[int], spell: Callable[[int], str]) -> int:
    """How many tokens at the start of a continuation hold no letter or digit: the full
    stop or comma the context's text lacked (". Thanks Marcus" after "...release status"),
    which belongs to the context, not to this utterance."""
    count = 0
    while count < len(tokens) and not any(c.isalnum() for c in spell(tokens[count])):
        count += 1
    return count


REPEAT_WORDS = 4  # this many words in a row said again make a repeat


def _words(text: str) -> list[str]:
    """The text's words, case and punctuation aside."""
    return re.findall(r"[\w']+", text.casefold())


def repeats_itself(text: str) -> bool:
    """Whether the text's first REPEAT_WORDS words (case and punctuation aside) come again
    later in it: the utterance said twice."""
    words = _words(text)
    head = words[:REPEAT_WORDS]
    if len(head) < REPEAT_WORDS:
        return False
    return any(words[i : i + REPEAT_WORDS] == head for i in range(1, len(words) - REPEAT_WORDS + 1))


def repeats_context(text: str, said: str) -> bool:
    """Whether `text` (case and punctuation aside) holds REPEAT_WORDS words in a row that
    its context's text `said` holds too, or is shorter and all of it stands in `said` word
    for word: the context read again. The second catches the short final that came back
    once per utterance ("That's the answer." four times in a row, each behind the one
    before); a real repeat ("Yes." after "Yes.") only costs a decoding without the
    context, which gives it back."""
    words, before = _words(text), _words(said)
    if 0 < len(words) < REPEAT_WORDS:
        return any(before[i : i + len(words)] == words for i in range(len(before) - len(words) + 1))
    runs = {tuple(before[i : i + REPEAT_WORDS]) for i in range(len(before) - REPEAT_WORDS + 1)}
    return any(
        tuple(words[i : i + REPEAT_WORDS]) in runs for i in range(len(words) - REPEAT_WORDS + 1)
    )


def shifted(
    words: tuple[WordTiming, ...], seconds: float, duration: float
) -> tuple[WordTiming, ...]:
    """Word times aligned over the whole window, moved `seconds` (the context's length)
    back onto the utterance's own time and kept inside [0, duration]."""

    def inside(time: float) -> float:
        return round(min(max(time - seconds, 0.0), duration), 3)

    return tuple(dataclasses.replace(w, start=inside(w.start), end=inside(w.end)) for w in words)
