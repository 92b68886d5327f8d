"""What a client names in a socket's URL: ids (validated: they become store keys) and
the stream socket's query parameters."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wire.codes import (
    DEFAULT_SAMPLE_RATE,
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    CloseCode,
    Encoding,
    ErrorCode,
)
from wire.errors import ProtocolError
from wire.keyterms import parse_keyterms
from wire.text_options import PLAIN, TextOptions, parse_text_options

_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # fullmatch: "$" takes a "\n"
_LANGUAGE = re.compile(r"[a-z]{2,3}|auto")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def validate_id(kind: str, value: str) -> str:
    """Meeting ids and participant names become store keys: allow a safe alphabet only."""
    if not _ID_PATTERN.fullmatch(value):
        raise ProtocolError(
            ErrorCode.BAD_CONFIG,
            CloseCode.BAD_REQUEST,
            f"{kind} must be 1-128 characters of letters, digits, '_', '.', '-' "
            "and start with a letter or digit",
        )
    return value


def is_language(value: str) -> bool:
    """A language parameter: an ISO 639 code such as 'en', or 'auto' (detect once)."""
    return _LANGUAGE.fullmatch(value) is not None


def parse_flag(value: str) -> bool | None:
    """A true/false parameter (1/0, yes/no, on/off too); None when it is neither."""
    value = value.lower()
    return True if value in _TRUE else False if value in _FALSE else None


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """The effective configuration of one audio stream, from the query string."""

    meeting_id: str
    participant: str
    language: str
    sample_rate: int
    encoding: Encoding
    interim_results: bool
    diarize: bool = False  # label each final's speaker (a source carrying several voices)
    keyterms: tuple[str, ...] = ()  # words to expect (`wire.keyterms`)
    text: TextOptions = PLAIN  # redaction, numerals, profanity (`wire.text_options`)

    def as_dict(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "language": self.language,
            "sample_rate": self.sample_rate,
            "encoding": self.encoding.value,
            "interim_results": self.interim_results,
        }
        if self.diarize:  # absent otherwise: nothing changes for streams without it
            config["diarize"] = True
        if self.keyterms:  # likewise
            config["keyterms"] = list(self.keyterms)
        config.update(self.text.as_dict())  # likewise: only the options asked for
        return config


def parse_stream_config(
    meeting_id: str,
    query: dict[str, str],
    default_language: str,
    keyterms: Sequence[str] = (),
    redact: Sequence[str] = (),
) -> StreamConfig:
    """Validate the stream socket's query parameters (`keyterms`, `redact`: every
    `keyterm` and `redact` parameter's value, the ones that repeat); raise ProtocolError
    on bad input."""

    def bad(message: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, message)

    validate_id("meeting_id", meeting_id)
    participant = validate_id("participant", query.get("participant", "speaker"))
    language = query.get("language", default_language)
    if not is_language(language):
        raise bad(f"language must be an ISO 639-1 code such as 'en' or 'auto', not {language!r}")
    try:
        sample_rate = int(query.get("sample_rate", str(DEFAULT_SAMPLE_RATE)))
    except ValueError:
        raise bad("sample_rate must be an integer") from None
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise bad(f"sample_rate must lie in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    try:
        encoding = Encoding(query.get("encoding", Encoding.PCM_S16LE.value))
    except ValueError:
        raise bad("encoding must be one of: " + ", ".join(e.value for e in Encoding)) from None
    interim = parse_flag(query.get("interim_results", "true"))
    if interim is None:
        raise bad("interim_results must be true or false")
    diarize = parse_flag(query.get("diarize", "false"))
    if diarize is None:
        raise bad("diarize must be true or false")
    return StreamConfig(
        meeting_id=meeting_id,
        participant=participant,
        language=language,
        sample_rate=sample_rate,
        encoding=encoding,
        interim_results=interim,
        diarize=diarize,
        keyterms=parse_keyterms(keyterms),
        text=parse_text_options(
            redact,
            numerals=query.get("numerals"),
            smart_format=query.get("smart_format"),
            profanity_filter=query.get("profanity_filter"),
        ),
    )


def parse_channels(raw: str | None, limit: int) -> int:
    """A stream's `channels`: interleaved channels in its audio, 1 (the default) to
    `limit`; ProtocolError (bad_config) otherwise."""
    if raw is None:
        return 1
    if not raw.isdigit() or not 1 <= int(raw) <= limit:
        raise ProtocolError(
            ErrorCode.BAD_CONFIG,
            CloseCode.BAD_REQUEST,
            f"channels must be an integer in 1..{limit} (PARLEY_MAX_CHANNELS), not {raw[:32]!r}",
        )
    return int(raw)


def channel_participants(raw: str, channels: int) -> tuple[str, ...]:
    """Each channel's participant: `ana,bo` names them in channel order (as many names as
    channels, all different); one name numbers them by channel index (`ana-0`, `ana-1`)."""
    if channels == 1:
        return (validate_id("participant", raw),)
    names = raw.split(",")
    if len(names) == 1:
        names = [f"{raw}-{c}" for c in range(channels)]
    if len(names) != channels or len(set(names)) != channels:
        raise ProtocolError(
            ErrorCode.BAD_CONFIG,
            CloseCode.BAD_REQUEST,
            f"participant must name all {channels} channels, each differently "
            "(participant=ana,bo), or be one name the channels are numbered after",
        )
    return tuple(validate_id("participant", name) for name in names)
