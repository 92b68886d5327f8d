"""What a client asks of a transcript's text besides the words: redaction, numerals,
profanity masking (session/text_filter.py applies them).

A v1 stream and an upload name them as query parameters (an upload's form fields too):

- `redact=pci|ssn|numbers|true`, repeatable (or comma-separated): card numbers (13-19
  digits that pass the Luhn check) become `[PCI]`, social security numbers (9 digits)
  `[SSN]`, any run of digits `[NUMBER]` (`true` is `numbers`, as with Deepgram);
- `numerals=true` (or `smart_format=true`): spoken numbers written as digits;
- `profanity_filter=true`: profane words masked with asterisks, letter for letter.

Deepgram's `/v1/listen` takes the same names. A redaction Parley cannot do (`pii`,
`phi`, an entity type) is refused: ignoring it would hand back the text unredacted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

# The options' true/false query parameters (`parse_text_options`' keywords).
TEXT_FLAGS = ("numerals", "smart_format", "profanity_filter")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Redaction(enum.StrEnum):
    PCI = "pci"  # card numbers (Luhn-checked, 13-19 digits)
    SSN = "ssn"  # social security numbers (9 digits)
    NUMBERS = "numbers"  # every run of digits

    @property
    def placeholder(self) -> str:
        """What a redacted span is written as."""
        return {"pci": "[PCI]", "ssn": "[SSN]", "numbers": "[NUMBER]"}[self.value]


@dataclass(frozen=True, slots=True)
class TextOptions:
    redact: frozenset[Redaction] = frozenset()
    numerals: bool = False
    profanity_filter: bool = False

    @property
    def active(self) -> bool:
        """Whether anything changes the text (off: the model's text goes out as it is)."""
        return bool(self.redact) or self.numerals or self.profanity_filter

    def as_dict(self) -> dict[str, Any]:
        """The options in a session's (or a job's) effective config; only those set, so
        nothing changes for a client that asks for none."""
        config: dict[str, Any] = {}
        if self.redact:
            config["redact"] = sorted(r.value for r in self.redact)
        if self.numerals:
            config["numerals"] = True
        if self.profanity_filter:
            config["profanity_filter"] = True
        return config


PLAIN = TextOptions()  # every option off: the model's text as it is


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, message)


def _flag(name: str, value: str | None) -> bool:
    if value is None:
        return False
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _bad(f"{name} must be true or false, not {value[:32]!r}")


def parse_redact(values: Iterable[str]) -> frozenset[Redaction]:
    """Every `redact` value (repeated, or comma-separated): pci, ssn, numbers, true
    (numbers), false (none); anything else is refused (bad_config)."""
    chosen: set[Redaction] = set()
    for value in values:
        for part in value.split(","):
            name = part.strip().lower()
            if name in _FALSE:
                continue
            if name in _TRUE or name == "aggressive_numbers":  # Deepgram's names of numbers
                chosen.add(Redaction.NUMBERS)
                continue
            try:
                chosen.add(Redaction(name))
            except ValueError:
                raise _bad(
                    f"redact={part[:32]!r} is not supported: redact takes pci, ssn, numbers "
                    "or true (Parley would return that text unredacted)"
                ) from None
    return frozenset(chosen)


def parse_text_options(
    redact: Iterable[str],
    *,
    numerals: str | None = None,
    smart_format: str | None = None,
    profanity_filter: str | None = None,
) -> TextOptions:
    """The options from their query values (None: absent); raise ProtocolError on a bad
    value."""
    return TextOptions(
        redact=parse_redact(redact),
        numerals=_flag("numerals", numerals) or _flag("smart_format", smart_format),
        profanity_filter=_flag("profanity_filter", profanity_filter),
    )
