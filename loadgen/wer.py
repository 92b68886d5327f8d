"""Word and character error rates with one text normaliser per language family.

References are written as their sources wrote them (upper case, digits or words,
"Mr." or "mister", "15th" or "fifteenth", hesitations or none), so both sides are
normalised the same way before scoring: case folded, punctuation dropped, common
abbreviations expanded, numbers (cardinal and ordinal) written out as words in English,
and hesitations ("uh", "um", "hmm": the set Whisper's English normaliser drops, with
"hm") dropped, since Whisper is trained not to write them. Chinese, Japanese and Korean
are scored per character.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

CHARACTER_LANGUAGES = frozenset({"zh", "ja", "ko"})

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))

_ABBREVIATIONS = {
    "mr": "mister",
    "mrs": "missus",
    "dr": "doctor",
    "st": "saint",
    "vs": "versus",
    "ok": "okay",
}


_HESITATIONS = frozenset({"uh", "um", "hm", "hmm", "mm", "mhm", "mmm"})
_ORDINAL = re.compile(r"(\d+)(st|nd|rd|th)")
_IRREGULAR_ORDINALS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def number_to_words(n: int) -> str:
    """Cardinal English words for a non-negative integer: 42 → 'forty two'."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else " " + _ONES[ones])
    for scale, name in _SCALES:
        if n >= scale:
            high, rest = divmod(n, scale)
            words = f"{number_to_words(high)} {name}"
            return words if rest == 0 else f"{words} {number_to_words(rest)}"
    raise AssertionError("unreachable")


def _spoken_number(digits: str) -> str:
    n = int(digits)
    # Years and year-like numbers are read in pairs: 1455 → fourteen fifty five.
    if len(digits) == 4 and 1100 <= n <= 1999 and n % 100 != 0:
        high, low = divmod(n, 100)
        low_words = number_to_words(low) if low >= 10 else "oh " + number_to_words(low)
        return f"{number_to_words(high)} {low_words}"
    return number_to_words(n)


def ordinal_words(n: int) -> str:
    """Ordinal English words for a non-negative integer: 15 → 'fifteenth', 21 → 'twenty first'."""
    *head, last = number_to_words(n).split()
    if last in _IRREGULAR_ORDINALS:
        last = _IRREGULAR_ORDINALS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return " ".join([*head, last])


def normalize(text: str, language: str = "en") -> list[str]:
    """Tokens to score: words, or characters for zh/ja/ko."""
    text = unicodedata.normalize("NFKC", text).casefold()
    if language in CHARACTER_LANGUAGES:
        return [c for c in text if c.isalnum()]
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,000 → 1000
    text = re.sub(r"[-‐‑–—/]", " ", text)
    text = re.sub(r"[^\w\s']", " ", text)
    text = re.sub(r"'(?!\w)|(?<!\w)'", " ", text)  # quotes, not apostrophes
    words: list[str] = []
    for token in text.split():
        if language == "en":
            if token.isdigit():
                words.extend(_spoken_number(token).split())
                continue
            if ordinal := _ORDINAL.fullmatch(token):
                words.extend(ordinal_words(int(ordinal.group(1))).split())
                continue
            if token in _HESITATIONS:
                continue
            token = _ABBREVIATIONS.get(token, token)
        words.append(token)
    return words


@dataclass(frozen=True, slots=True)
class ErrorCounts:
    """Edit operations aligning a hypothesis to a reference."""

    substitutions: int
    deletions: int
    insertions: int
    reference_length: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        if self.reference_length == 0:
            return 0.0 if self.errors == 0 else 1.0
        return self.errors / self.reference_length

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.reference_length + other.reference_length,
        )


def align(reference: Sequence[str], hypothesis: Sequence[str]) -> ErrorCounts:
    """Levenshtein alignment counting substitutions, deletions and insertions."""
    # Each cell holds (cost, substitutions, deletions, insertions) for a prefix pair.
    previous = [(j, 0, 0, j) for j in range(len(hypothesis) + 1)]
    for i, ref_token in enumerate(reference, start=1):
        current = [(i, 0, i, 0)]
        for j, hyp_token in enumerate(hypothesis, start=1):
            diag = previous[j - 1]
            if ref_token == hyp_token:
                best = diag
            else:
                sub = (diag[0] + 1, diag[1] + 1, diag[2], diag[3])
                up = previous[j]
                dele = (up[0] + 1, up[1], up[2] + 1, up[3])
                left = current[j - 1]
                insert = (left[0] + 1, left[1], left[2], left[3] + 1)
                best = min(sub, dele, insert)
            current.append(best)
        previous = current
    _, subs, dels, ins = previous[-1]
    return ErrorCounts(subs, dels, ins, len(reference))


def error_counts(reference: str, hypothesis: str, language: str = "en") -> ErrorCounts:
    return align(normalize(reference, language), normalize(hypothesis, language))


def error_rate(reference: str, hypothesis: str, language: str = "en") -> float:
    """WER, or CER for zh/ja/ko, after normalising both sides."""
    return error_counts(reference, hypothesis, language).rate
