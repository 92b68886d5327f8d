"""Numbers in a transcript's words, spoken or written: found, read as digits, and written
as numerals. Sans-I/O: tokens (words with their leading space and punctuation, as the
model writes them) in, spans out; session/text_filter.py applies them.

A *run* is a stretch of number tokens: digits as written ("4111", "4,111", "5th",
"4111-1111"), number words ("four", "forty-one", "eleven", "hundred", "double four",
"oh" between two numbers) and "and" inside a number ("one hundred and five"). A run ends
at a word that is not a number, at an ordinal and after a sentence's end (". ? ! ; :").

Its `digits` are every digit it says, in order, however they were spoken: "four one one
one", "4111" and "forty one eleven" all say 4111 (each spoken number is read as a
number, "forty one" 41 and "eleven" 11, then they follow each other). Redaction matches
on them.

A lone "hundred", "thousand", ... stays a word ("a thousand thoughts"). "one" alone is a
word more often than a number ("no one", "the one", "one of them"):
a run that is a lone "one" counts only before a unit ("one percent", "one dollar",
"one pm") or after a word that announces a number ("page one", "version one"). Likewise
"first", "second" and "third" are numbers only after a tens word ("twenty first").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4,
    "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
}  # fmt: skip
_TEENS = {
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
}  # fmt: skip
_TENS = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
}  # fmt: skip
_SCALES = {"thousand": 1000, "million": 1_000_000, "billion": 1_000_000_000}
_ORDINAL_UNITS = {"first": 1, "second": 2, "third": 3}  # numbers only after a tens word
_ORDINALS = {
    "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9,
    "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13, "fourteenth": 14,
    "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18,
    "nineteenth": 19, "twentieth": 20, "thirtieth": 30, "fortieth": 40, "fiftieth": 50,
    "sixtieth": 60, "seventieth": 70, "eightieth": 80, "ninetieth": 90,
}  # fmt: skip
_REPEATS = {"double": 2, "triple": 3}
_LONE_WORDS = {"hundred", *_SCALES}  # alone, a word ("a thousand", "a million times")
_ZEROS = {"oh", "o"}  # zero between two numbers ("four oh one")
_CONNECTORS = {"and", *_ZEROS, *_ORDINAL_UNITS}  # number words only where a run has them


def word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


# What makes a lone "one" a number: a unit after it, or a word before it.
ONE_UNITS = word_set(
    "percent dollar dollars cent cents euro euros hour hours minute minutes second seconds "
    "am pm a.m p.m o'clock point thousand million billion hundred"
)
ONE_CUES = word_set(
    "number page step version chapter line item level room floor plus minus times "
    "equals gate platform channel track zone"
)
_SENTENCE_END = set(".?!;:")
_TOKEN = re.compile(r"^(\s*)([^\w]*)(.*?)([^\w]*)$", re.DOTALL)
_SEPARATORS = re.compile(r"[-,/]")
_LITERAL = re.compile(r"\d(?:[\d,.:]*\d)?(?:st|nd|rd|th|s)?")


@dataclass(frozen=True, slots=True)
class Token:
    """One word: `lead` (its space and opening punctuation, "$" of "$5"), `core` (the
    word) and `tail` (closing punctuation)."""

    lead: str
    core: str
    tail: str

    @classmethod
    def parse(cls, text: str) -> Token:
        match = _TOKEN.match(text)
        assert match is not None  # the pattern matches any string
        space, opening, core, closing = match.groups()
        return cls(space + opening, core, closing)

    @property
    def key(self) -> str:
        return self.core.lower()

    @property
    def ends_sentence(self) -> bool:
        return any(c in _SENTENCE_END for c in self.tail)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One number of a run: its digits as written, whether an ordinal, whether written
    in digits by the model (a literal), and the tokens it came from."""

    digits: str
    first: int  # token index
    last: int  # token index (inclusive)
    ordinal: bool = False
    literal: bool = False


@dataclass(frozen=True, slots=True)
class Run:
    """Tokens `start`..`end` (exclusive) of number tokens."""

    start: int
    end: int
    chunks: tuple[Chunk, ...]

    @property
    def digits(self) -> str:
        return "".join(c.digits for c in self.chunks)


def _parts(core: str) -> list[str]:
    return [p for p in _SEPARATORS.split(core.lower()) if p]


def garbled(core: str) -> bool:
    """A digit string the model mangled ("6,700-80-I-N"): 3 digits or more, and no
    fewer digits than letters. Its digits count; its letters are dropped."""
    digits = sum(c.isdigit() for c in core)
    return digits >= 3 and digits * 2 >= sum(c.isalnum() for c in core)


def _is_number_part(part: str) -> bool:
    return (
        part in _UNITS
        or part in _TEENS
        or part in _TENS
        or part in _SCALES
        or part == "hundred"
        or part in _ORDINALS
        or part in _REPEATS
        or _LITERAL.fullmatch(part) is not None
    )


def _numeric(tokens: Sequence[Token], i: int, in_run: bool) -> bool:
    """Whether token `i` can belong to a run (`in_run`: the token before it does)."""
    parts = _parts(tokens[i].core)
    if not parts:
        return False
    if all(_is_number_part(p) for p in parts):
        if parts[0] in _REPEATS:  # "double four": only before a number
            return i + 1 < len(tokens) and _plain_number(tokens[i + 1])
        return True
    if garbled(tokens[i].core):
        return True
    previous = tokens[i - 1].key if i else ""
    if len(parts) == 1 and parts[0] in _ORDINAL_UNITS:
        return in_run and previous.split("-")[-1] in _TENS
    if in_run and len(parts) == 1 and parts[0] in _ZEROS:
        return i + 1 < len(tokens) and _plain_number(tokens[i + 1])
    if in_run and parts == ["and"]:
        after_scale = previous in _SCALES or previous == "hundred"
        return after_scale and i + 1 < len(tokens) and _plain_number(tokens[i + 1])
    return False


def _plain_number(token: Token) -> bool:
    parts = _parts(token.core)
    return bool(parts) and all(
        p in _UNITS or p in _TEENS or p in _TENS or _LITERAL.fullmatch(p) for p in parts
    )


def find_runs(tokens: Sequence[Token]) -> list[Run]:
    """Every run of number tokens, in order (a lone "one" only where it is a number)."""
    runs: list[Run] = []
    i = 0
    while i < len(tokens):
        if not _numeric(tokens, i, False):
            i += 1
            continue
        start = i
        while True:
            ordinal = tokens[i].key in _ORDINALS or tokens[i].key in _ORDINAL_UNITS
            if tokens[i].ends_sentence or ordinal:
                break
            if i + 1 >= len(tokens) or not _numeric(tokens, i + 1, True):
                break
            i += 1
        end = i + 1
        i = end
        if end - start == 1 and tokens[start].key == "one" and not _one_is_number(tokens, start):
            continue
        if end - start == 1 and tokens[start].key in _LONE_WORDS:  # "a thousand thoughts"
            continue
        runs.append(Run(start, end, tuple(read_chunks(tokens, start, end))))
    return runs


def _one_is_number(tokens: Sequence[Token], i: int) -> bool:
    after = tokens[i + 1].key if i + 1 < len(tokens) else ""
    before = tokens[i - 1].key if i else ""
    return after in ONE_UNITS or before in ONE_CUES


def read_chunks(tokens: Sequence[Token], start: int, end: int) -> list[Chunk]:
    """The numbers tokens `start`..`end` say, one after another: "forty one eleven" is
    41 then 11; "one hundred and five" 105; "four one" 4 then 1."""
    chunks: list[Chunk] = []
    builder = _Builder()
    repeat = 1
    for index in range(start, end):
        parts = _parts(tokens[index].core)
        if not all(_is_number_part(p) or p in _CONNECTORS for p in parts):
            chunks += builder.flush()  # a garbled digit string: its digits as they come
            chunks.append(Chunk(re.sub(r"\D", "", tokens[index].core), index, index, literal=True))
            continue
        for part in parts:
            if part == "and":
                continue
            if part in _REPEATS:
                repeat = _REPEATS[part]
                continue
            literal = _LITERAL.fullmatch(part)
            if literal is not None:
                chunks += builder.flush()
                digits = re.sub(r"\D", "", part)
                chunks.append(Chunk(digits * repeat, index, index, literal=True))
            elif repeat > 1 and part in _UNITS:
                chunks += builder.flush()
                chunks.append(Chunk(str(_UNITS[part]) * repeat, index, index))
            else:
                chunks += builder.add(part, index)
            repeat = 1
    return chunks + builder.flush()


class _Builder:
    """One spoken number being read: it ends where the next word cannot go on with it."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.total = 0
        self.current = 0
        self.last = ""  # the kind of the word before: unit, teen, tens, hundred, scale
        self.first = -1
        self.at = -1
        self.zero = False

    def flush(self) -> list[Chunk]:
        if self.first < 0:
            return []
        value = self.total + self.current
        chunk = Chunk("0" if self.zero else str(value), self.first, self.at)
        self._reset()
        return [chunk]

    def _fits(self, kind: str, value: int) -> bool:
        last = self.last
        if self.zero or not last:
            return not self.zero
        if kind == "unit":
            return (last == "tens" and value > 0) or last in ("hundred", "scale")
        if kind in ("teen", "tens"):
            return last in ("hundred", "scale")
        if kind == "hundred":
            return last in ("unit", "teen", "tens")
        return last != "scale"  # a scale after a number

    def add(self, part: str, index: int) -> list[Chunk]:
        out: list[Chunk] = []
        kind, value, ordinal = _kind(part)
        if kind == "zero" or not self._fits(kind, value):
            out = self.flush()
        if self.first < 0:
            self.first = index
        self.at = index
        if kind == "zero":
            self.zero, self.last = True, "unit"
            return out + self.flush()
        if kind == "hundred":
            self.current = (self.current or 1) * 100
        elif kind == "scale":
            self.total += (self.current or 1) * value
            self.current = 0
        else:
            self.current += value
        self.last = kind
        if ordinal:
            chunk = self.flush()[0]
            return [*out, Chunk(chunk.digits, chunk.first, chunk.last, ordinal=True)]
        return out


def _kind(part: str) -> tuple[str, int, bool]:
    """(kind, value, ordinal) of a number word."""
    if part in _ZEROS or part == "zero":
        return "zero", 0, False
    if part in _UNITS:
        return "unit", _UNITS[part], False
    if part in _TEENS:
        return "teen", _TEENS[part], False
    if part in _TENS:
        return "tens", _TENS[part], False
    if part == "hundred":
        return "hundred", 100, False
    if part in _SCALES:
        return "scale", _SCALES[part], False
    if part in _ORDINAL_UNITS:
        return "unit", _ORDINAL_UNITS[part], True
    value = _ORDINALS[part]
    return ("unit" if value < 10 else "teen" if value < 20 else "tens"), value, True


def ordinal_suffix(value: int) -> str:
    if value % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(value % 10, "th")


def write_chunks(chunks: Sequence[Chunk]) -> str:
    """A group of numbers as numerals: digit-by-digit speech ("four one one one", "forty
    one eleven", "nineteen eighty four") joined into one number, other numbers apart."""
    written = [c.digits + ordinal_suffix(int(c.digits)) if c.ordinal else c.digits for c in chunks]
    if len(chunks) < 2 or any(c.ordinal for c in chunks):
        return " ".join(written)
    short = all(len(c.digits) <= 2 or c.literal for c in chunks)
    first, second = chunks[0], chunks[-1]
    hour_and_minutes = (
        len(chunks) == 2 and len(first.digits) == 1 and len(second.digits) == 2
    ) and not (first.literal or second.literal)
    if short and not hour_and_minutes:
        return "".join(written)
    return " ".join(written)
