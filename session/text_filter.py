"""A transcript's text as the client asked for it (wire/text_options.py): redacted,
numbers written as numerals, profanity masked. Sans-I/O: applied once where a final's
or a partial's text and words are made (session/committer.py, session/partial_sender.py),
so the client, the meeting's listeners and the stored log all get the same text and the
unredacted one is never stored or sent.

Text and words go through the same steps, token by token (a token: a word with its
leading space and punctuation), so they agree: a span that becomes one thing ("[PCI]",
"4111", "25%") is one word, from its first word's start to its last's end, with the
lowest probability among them.

- Redaction (session/spoken_numbers.py finds the runs of numbers and their digits,
  however they were spoken): `pci` a run (or a part of one, on word boundaries) of 13-19
  digits that passes the Luhn check → `[PCI]`; `ssn` 9 digits → `[SSN]`; `numbers`
  any run with a digit → `[NUMBER]`. A span is written once, whole, with the first
  label that matches in that order.
- Numerals: what is left of each run (split at commas) written as digits, "percent"
  after it as "%", "dollars" as "$", "am"/"pm" after an hour as "3:30 PM".
- Profanity: each word of the list below masked with an asterisk per letter, as
  Deepgram masks it ("****"), its punctuation kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.api import WordTiming
from session.spoken_numbers import Chunk, Run, Token, find_runs, read_chunks, word_set, write_chunks
from wire.text_options import Redaction, TextOptions

PCI_DIGITS = range(13, 20)
SSN_DIGITS = 9
# After a card's or a social security number's words, the digits a slightly mangled
# transcription of one gives (tiny.en drops or repeats a spoken digit now and then).
CUE_TOKENS = 6
LONG_RUN_DIGITS = 40  # a longer run goes whole with pci, unsearched
CUED_PCI_DIGITS = range(12, 23)
CUED_SSN_DIGITS = range(7, 13)
_CUES = {
    Redaction.PCI: word_set("card credit debit visa mastercard amex number"),
    Redaction.SSN: word_set("social security ssn"),
}
_WORDS = re.compile(r"\s*\S+")
_CURRENCY = {"dollar": "$", "dollars": "$", "euro": "€", "euros": "€"}
_MERIDIEM = {"am": "AM", "a.m": "AM", "pm": "PM", "p.m": "PM"}
# Masked when profanity_filter is on: the common English swear words and slurs, with
# their usual forms. Short on purpose: a longer list (better-profanity's 900 entries)
# masks words a meeting says innocently ("kill", "god", "sex", "suck").
PROFANITY = word_set(
    """
    fuck fucks fucked fucker fuckers fucking fuckin motherfucker motherfuckers
    motherfucking fuckhead fuckface shit shits shitty shitting shitted bullshit horseshit
    shithead shitheads bitch bitches bitching bitchy bastard bastards asshole assholes
    arsehole arseholes dickhead dickheads cunt cunts twat twats wanker wankers prick
    pricks slut sluts whore whores douchebag douchebags jackass dumbass dumbasses damn
    damned dammit goddamn goddamned goddammit piss pissed pissing bollocks bugger
    nigger niggers nigga niggas faggot faggots fag fags retard retards
    """
)


@dataclass(frozen=True, slots=True)
class Edit:
    """Tokens `start`..`end` (exclusive) become `text` (with its leading space)."""

    start: int
    end: int
    text: str


class TextFilter:
    def __init__(self, options: TextOptions) -> None:
        self.options = options

    def text(self, text: str, *, partial: bool = False) -> str:
        """`text` as asked for (unchanged with every option off). A `partial`'s last run
        of digits may be the start of a card or an SSN still being said: with pci or ssn
        asked, it is redacted whatever its length."""
        if not self.options.active or not text:
            return text
        pieces = _WORDS.findall(text)
        out = _apply(pieces, self.edits([Token.parse(p) for p in pieces], open_end=partial))
        head = text[: len(text) - len(text.lstrip())]
        return head + "".join(out).lstrip() if out else text

    def words(self, words: Sequence[WordTiming]) -> tuple[WordTiming, ...]:
        """`words` as asked for: an edited span is one word over the span's time."""
        if not self.options.active:
            return tuple(words)
        out: list[WordTiming] = []
        edits = {e.start: e for e in self.edits([Token.parse(w.word) for w in words])}
        i = 0
        while i < len(words):
            edit = edits.get(i)
            if edit is None:
                out.append(words[i])
                i += 1
                continue
            span = words[edit.start : edit.end]
            probability = min(w.probability for w in span)
            out.append(WordTiming(edit.text, span[0].start, span[-1].end, probability))
            i = edit.end
        return tuple(out)

    def edits(self, tokens: Sequence[Token], *, open_end: bool = False) -> list[Edit]:
        """What changes, in order, spans not overlapping (`open_end`: the last run may
        go on)."""
        edits: list[Edit] = []
        for run in find_runs(tokens):
            edits += self._run_edits(tokens, run, open_end and run.end == len(tokens))
        if self.options.profanity_filter:
            edited = {i for e in edits for i in range(e.start, e.end)}
            for i, token in enumerate(tokens):
                if i not in edited and _profane(token):
                    masked = "".join("*" if c.isalnum() else c for c in token.core)
                    edits.append(Edit(i, i + 1, token.lead + masked + token.tail))
        return sorted(edits, key=lambda e: e.start)

    def _run_edits(self, tokens: Sequence[Token], run: Run, open_end: bool) -> list[Edit]:
        asked = self.options.redact
        redacted = _redactions(run.chunks, asked, cues(tokens, run.start))
        going_on = [r for r in (Redaction.PCI, Redaction.SSN) if r in asked and open_end]
        if going_on and not redacted and run.digits:
            redacted = [(run.start, run.end, going_on[0])]
        edits = [
            Edit(start, end, tokens[start].lead + label.placeholder + tokens[end - 1].tail)
            for start, end, label in redacted
        ]
        if not self.options.numerals:
            return edits
        covered = {i for start, end, _ in redacted for i in range(start, end)}
        group: list[int] = []
        for i in range(run.start, run.end):
            if i not in covered:
                group.append(i)
            ends = i in covered or tokens[i].tail.strip() or i == run.end - 1
            if ends and group:
                edit = _numerals(tokens, group[0], group[-1] + 1, run.end)
                if edit is not None:
                    edits.append(edit)
                group = []
        # a later group may have consumed no token of an edit before it: keep them apart
        return _disjoint(edits)


def _disjoint(edits: list[Edit]) -> list[Edit]:
    out: list[Edit] = []
    for edit in sorted(edits, key=lambda e: e.start):
        if not out or edit.start >= out[-1].end:
            out.append(edit)
    return out


def luhn(digits: str) -> bool:
    """Whether `digits` pass the Luhn check (every second digit from the right doubled)."""
    if not digits.isdigit():
        return False
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _matches(label: Redaction, digits: str) -> bool:
    if label is Redaction.PCI:
        return len(digits) in PCI_DIGITS and luhn(digits)
    if label is Redaction.SSN:
        return len(digits) == SSN_DIGITS
    return bool(digits)


def _nearly(label: Redaction, digits: str, cued: frozenset[Redaction]) -> bool:
    """What a run no part of which `_matches` is still redacted as: a card inside a
    longer run of digits (a Luhn-valid stretch), and, after a card's or a social
    security number's words (`cued`), digits about as many as one has."""
    if label is Redaction.PCI:
        if label in cued and len(digits) in CUED_PCI_DIGITS:
            return True
        if len(digits) > LONG_RUN_DIGITS:  # nearly sure to hold a Luhn-valid stretch
            return True
        return len(digits) > PCI_DIGITS[-1] and any(
            luhn(digits[i : i + n]) for n in PCI_DIGITS for i in range(len(digits) - n + 1)
        )
    return label is Redaction.SSN and label in cued and len(digits) in CUED_SSN_DIGITS


def cues(tokens: Sequence[Token], start: int) -> frozenset[Redaction]:
    """The labels whose words come in the CUE_TOKENS before token `start`, in its
    sentence ("card", "social security")."""
    found: set[Redaction] = set()
    for token in reversed(tokens[max(0, start - CUE_TOKENS) : start]):
        if token.ends_sentence:
            break
        for label, words in _CUES.items():
            if token.key in words:
                found.add(label)
    return frozenset(found)


def _redactions(
    chunks: Sequence[Chunk], asked: frozenset[Redaction], cued: frozenset[Redaction]
) -> list[tuple[int, int, Redaction]]:
    """The token spans of a run (its `chunks`, the numbers it says) to redact: the whole
    if it matches or nearly matches (`_nearly`; `cued`: the labels whose words came before
    it), or else its parts that match (numbers one after another, on word boundaries):
    cards first, then SSNs, from the left, each the longest that matches where it
    starts."""
    if not chunks or not asked:
        return []
    labels = [r for r in (Redaction.PCI, Redaction.SSN, Redaction.NUMBERS) if r in asked]
    whole = "".join(c.digits for c in chunks)
    for label in labels:
        if _matches(label, whole) or _nearly(label, whole, cued):
            return [(chunks[0].first, chunks[-1].last + 1, label)]
    spans: list[tuple[int, int, Redaction]] = []
    taken: set[int] = set()  # chunks already redacted
    for label in (r for r in labels if r is not Redaction.NUMBERS):
        first = 0
        while first < len(chunks):
            end = _longest(chunks, first, label, taken)
            if end is None:
                first += 1
                continue
            spans.append((chunks[first].first, chunks[end - 1].last + 1, label))
            taken.update(range(first, end))
            first = end
    return sorted(spans)


def _longest(chunks: Sequence[Chunk], first: int, label: Redaction, taken: set[int]) -> int | None:
    """Where the longest stretch of `chunks` from `first` that `label` redacts ends (on
    word boundaries, through no chunk `taken`); None if none does."""
    if first and chunks[first].first == chunks[first - 1].last:
        return None  # inside a token ("four-one")
    found = None
    digits = ""
    for end in range(first + 1, len(chunks) + 1):
        if end - 1 in taken:
            break
        digits += chunks[end - 1].digits
        if len(digits) > PCI_DIGITS[-1]:
            break
        on_boundary = end == len(chunks) or chunks[end].first != chunks[end - 1].last
        if on_boundary and _matches(label, digits):
            found = end
    return found


def _numerals(tokens: Sequence[Token], start: int, end: int, run_end: int) -> Edit | None:
    """Tokens `start`..`end` of a run as numerals, with the unit after them ("percent",
    "dollars", "pm") where it follows the run; None when nothing changes."""
    chunks = read_chunks(tokens, start, end)
    if not chunks:
        return None
    written = write_chunks(chunks)
    last = end - 1
    after = tokens[end].key if end == run_end and end < len(tokens) else ""
    if not tokens[last].tail.strip() and after:
        if after in ("percent", "per-cent"):
            written, last = written + "%", end
        elif after in _CURRENCY and not tokens[start].lead.strip():
            written, last = _CURRENCY[after] + written, end
        elif after in _MERIDIEM and (time := _time(chunks)) is not None:
            written, last = f"{time} {_MERIDIEM[after]}", end
    literal = all(c.literal for c in chunks) and last == end - 1
    if literal:
        return None
    return Edit(start, last + 1, tokens[start].lead + written + tokens[last].tail)


def _time(chunks: Sequence[Chunk]) -> str | None:
    """An hour (1-12), with its minutes where said ("three thirty", "three oh five")."""
    values = [int(c.digits) for c in chunks if not c.ordinal]
    if len(values) != len(chunks) or not values or not 1 <= values[0] <= 12:
        return None
    if len(values) == 1:
        return str(values[0])
    if len(values) == 2 and 0 <= values[1] <= 59:
        return f"{values[0]}:{values[1]:02d}"
    if len(values) == 3 and values[1] == 0 and 0 <= values[2] <= 9:
        return f"{values[0]}:0{values[2]}"
    return None


def _profane(token: Token) -> bool:
    key = token.key
    return key in PROFANITY or (key.endswith("'s") and key[:-2] in PROFANITY)


def _apply(pieces: Sequence[str], edits: Sequence[Edit]) -> list[str]:
    out: list[str] = []
    i = 0
    for edit in edits:
        out += pieces[i : edit.start]
        out.append(edit.text)
        i = edit.end
    return out + list(pieces[i:])
