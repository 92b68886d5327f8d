"""Deepgram's text shapes: plain (without `punctuate`) and sentences (with it).

The text options (`redact`, `numerals`, `profanity_filter`) are applied before the text
comes here (session/text_filter.py); their marks survive the plain shape: a redaction's
placeholder (`[PCI]`) and a profanity mask (`****`) are kept as they are.
"""

from __future__ import annotations

import re

_PUNCTUATION = re.compile(r"[^\w\s']|(?<!\w)'|'(?!\w)")
_KEPT = re.compile(r"(\[[A-Z]+\]|\*+)")  # split keeps them: every second part


def plain(text: str) -> str:
    """Deepgram's text without `punctuate`: lower case, no punctuation (but the marks of
    redaction and of the profanity filter)."""
    parts = _KEPT.split(text)
    kept = (p if i % 2 else _PUNCTUATION.sub("", p.lower()) for i, p in enumerate(parts))
    return " ".join("".join(kept).split())


def sentence(text: str, *, ending: bool) -> str:
    """Text as `punctuate=true` promises it: a capital first letter and, where `ending`
    (the speech stopped), a full stop after a last word Whisper left bare."""
    return ended(capitalized(text)) if ending else capitalized(text)


def capitalized(text: str) -> str:
    head = len(text) - len(text.lstrip())
    return text[:head] + text[head : head + 1].upper() + text[head + 1 :]


def ended(text: str) -> str:
    stripped = text.rstrip()
    return stripped + "." if stripped and stripped[-1].isalnum() else text
