"""Keyterms written where the model heard something that sounds like them.

The prompt and the logit bonuses (`engine.whisper.keyterms`) only help where the model
already gives a term some probability; a word it has never seen (a rare name, a new
product) it writes as the English words it sounds like ("Cuban eat" for *Kubernetes*).
After decoding, `rewrite` looks for such spans: one to three words of the hypothesis
whose phonetic key is within a small edit distance of a keyterm's, where the model was
itself unsure (the span's mean word probability below `Match.max_probability`). The span
becomes one word with the term's text: its leading space and the punctuation around it
kept, its start the first word's and its end the last word's, its probability the span's
mean.

The phonetic key is Metaphone (`jellyfish.metaphone`) of the letters with the spaces
removed, so a term split across words by the model ("Cuban eat") keys as one; the
distance is the keys' edit distance (`distance`: a swap of letters that sound alike, or
adding or dropping a weak H, W or Y, costs half an edit) over the term key's length less
one: short keys match too many words, so they are held closer. Guards against
writing a term that was not said: the span must be unsure, its key and the term's long
enough, their letter counts within a factor of two, a term is written once per utterance
and not when the hypothesis has it already. Thresholds: bench/keyterms.py (tuned on its TUNING set;
docs/performance.md#keyterms).

Sans-I/O: words and terms in, words out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import jellyfish

from engine.api import WordTiming

# Punctuation kept around a replaced span (Whisper's prepended and appended marks).
_LEADING = "\"'“¿([{-"
_TRAILING = "\"'.。,，!！?？:：”)]}、"


# Metaphone letters that sound alike: one swapped for another of its group costs half an
# edit; H and W (often silent between letters) cost half an edit to add or drop.
_GROUPS = ("BFPV", "SXJ", "T0D", "MN", "LR", "KQ")
_ALIKE = frozenset((a, b) for group in _GROUPS for a in group for b in group if a != b)
_WEAK = frozenset("HWY")


@dataclass(frozen=True, slots=True)
class Match:
    """When a span may be written as a term.

    `max_probability`: the span's mean word probability must be below it (the model was
    unsure). `max_distance`: the keys' edit distance over the term key's length less one,
    at most (a term of a three-letter key takes only half-edits, one of seven three edits).
    `min_key`: the shortest term key matched (shorter keys match too many words).
    `max_words`: the longest span of hypothesis words tried.
    """

    max_probability: float = 0.7
    max_distance: float = 0.4
    min_key: int = 3
    max_words: int = 3


@dataclass(frozen=True, slots=True)
class _Term:
    text: str
    key: str
    letters: int


@dataclass(frozen=True, slots=True)
class _Candidate:
    distance: float
    start: int  # the span's first word
    stop: int  # one past its last
    term: _Term


def letters(text: str) -> str:
    """The lowercase letters of `text` (digits and marks dropped)."""
    return "".join(c for c in text.lower() if c.isalpha())


def key(text: str) -> str:
    """The phonetic key of `text`'s letters, spaces removed."""
    only = letters(text)
    return jellyfish.metaphone(only) if only else ""


def distance(a: str, b: str) -> float:
    """The edit distance of two phonetic keys, sound-alike swaps and weak letters at half
    an edit."""
    previous = [0.0]
    for c in b:
        previous.append(previous[-1] + (0.5 if c in _WEAK else 1.0))
    for x in a:
        current = [previous[0] + (0.5 if x in _WEAK else 1.0)]
        for j, y in enumerate(b, start=1):
            swap = 0.0 if x == y else 0.5 if (x, y) in _ALIKE else 1.0
            current.append(
                min(
                    previous[j - 1] + swap,
                    previous[j] + (0.5 if x in _WEAK else 1.0),
                    current[j - 1] + (0.5 if y in _WEAK else 1.0),
                )
            )
        previous = current
    return previous[-1]


def _terms(terms: Sequence[str], match: Match) -> list[_Term]:
    out = []
    for text in terms:
        text = text.strip()
        k = key(text)
        if len(k) >= match.min_key:
            out.append(_Term(text, k, len(letters(text))))
    return out


def _present(words: Sequence[WordTiming], term: str) -> bool:
    """Whether the hypothesis has `term` already (letters compared, case aside)."""
    want = letters(term)
    joined = [letters(w.word) for w in words]
    return any(
        "".join(joined[i:j]) == want
        for i in range(len(joined))
        for j in range(i + 1, min(len(joined), i + 4) + 1)
    )


def candidates(words: Sequence[WordTiming], terms: Sequence[str], match: Match) -> list[_Candidate]:
    """Every (span, term) that may be replaced, best (smallest distance, then shortest
    span: no word more than needed) first."""
    out = []
    for term in _terms(terms, match):
        if _present(words, term.text):
            continue
        for start in range(len(words)):
            for stop in range(start + 1, min(len(words), start + match.max_words) + 1):
                span = words[start:stop]
                said = "".join(w.word for w in span)
                if not letters(span[-1].word) or not letters(span[0].word):
                    continue
                if any(w.word.rstrip()[-1:] in _TRAILING for w in span[:-1]):
                    continue  # not across a comma or a sentence's end
                mean = sum(w.probability for w in span) / len(span)
                if mean >= match.max_probability:
                    continue
                count = len(letters(said))
                if not term.letters / 2 <= count <= term.letters * 2:
                    continue
                span_key = key(said)
                if len(span_key) < 2:
                    continue
                apart = distance(span_key, term.key) / (len(term.key) - 1)
                if apart <= match.max_distance:
                    out.append(_Candidate(apart, start, stop, term))
    out.sort(key=lambda c: (c.distance, c.stop - c.start, c.start))
    return out


def _merged(span: Sequence[WordTiming], term: str) -> WordTiming:
    first, last = span[0].word, span[-1].word
    space = first[: len(first) - len(first.lstrip())]
    body = first.lstrip()
    lead = body[: len(body) - len(body.lstrip(_LEADING))]
    trail = last[len(last.rstrip(_TRAILING)) :]
    return WordTiming(
        word=f"{space}{lead}{term}{trail}",
        start=span[0].start,
        end=span[-1].end,
        probability=round(sum(w.probability for w in span) / len(span), 4),
    )


def rewrite(
    words: Sequence[WordTiming], terms: Sequence[str], match: Match = Match()
) -> tuple[WordTiming, ...]:
    """`words` with each unsure span that sounds like a term written as it (each term at
    most once, spans not overlapping, the closest matches first)."""
    if not terms or not words:
        return tuple(words)
    taken = [False] * len(words)
    written: set[str] = set()
    replaced: dict[int, tuple[int, str]] = {}  # span start: (stop, term)
    for c in candidates(words, terms, match):
        if c.term.text in written or any(taken[c.start : c.stop]):
            continue
        written.add(c.term.text)
        taken[c.start : c.stop] = [True] * (c.stop - c.start)
        replaced[c.start] = (c.stop, c.term.text)
    out: list[WordTiming] = []
    i = 0
    while i < len(words):
        if i in replaced:
            stop, term = replaced[i]
            out.append(_merged(words[i:stop], term))
            i = stop
        else:
            out.append(words[i])
            i += 1
    return tuple(out)


def token_words(pieces: Sequence[str], logprobs: Sequence[float]) -> tuple[WordTiming, ...]:
    """Words from decoded token texts and their log-probabilities, without timings (a
    word begins at a token that begins with a space; its probability is its tokens'
    mean, as `engine.whisper.alignment` computes it): for utterances that did not ask for
    word timings."""
    words: list[tuple[str, list[float]]] = []
    for piece, logprob in zip(pieces, logprobs, strict=True):
        if not words or piece.startswith(" "):
            words.append((piece, [math.exp(logprob)]))
        else:
            text, probabilities = words[-1]
            words[-1] = (text + piece, [*probabilities, math.exp(logprob)])
    return tuple(WordTiming(text, 0.0, 0.0, sum(p) / len(p)) for text, p in words if text.strip())
