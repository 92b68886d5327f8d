"""Keyterms: the words a stream or an upload expects (names, products, jargon).

A client names them as repeated `keyterm` query parameters (v1 streams and uploads,
Deepgram's `keyterm`/`keywords`), in the OpenAI session's transcription `prompt`, or
mid-stream in a `configure` message (v1) or a `Configure` message (Deepgram), which
replaces the list. The list is bounded: at most MAX_KEYTERMS terms, each at most
MAX_KEYTERM_CHARS characters, MAX_KEYTERMS_CHARS in all (the engine reads at most
`engine.whisper.keyterms.MAX_TOKENS` tokens of them). More is refused with `too_many_keyterms`
(close 4400 on a socket, HTTP 400 on a request); an empty or blank term with
`bad_config`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

MAX_KEYTERMS = 100
MAX_KEYTERM_CHARS = 100
MAX_KEYTERMS_CHARS = 2000
PROMPT_TERM_WORDS = 4  # a longer part of an OpenAI prompt is prose, not a term


def parse_keyterms(values: Iterable[str]) -> tuple[str, ...]:
    """The terms, stripped, inner whitespace collapsed, duplicates dropped (first kept);
    raise ProtocolError when one is blank or the list exceeds its bounds."""
    terms: list[str] = []
    for value in values:
        term = " ".join(value.split())
        if not term:
            raise ProtocolError(
                ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, "a keyterm must not be blank"
            )
        if len(term) > MAX_KEYTERM_CHARS:
            raise _too_many(f"a keyterm has at most {MAX_KEYTERM_CHARS} characters")
        if term not in terms:
            terms.append(term)
        if len(terms) > MAX_KEYTERMS:
            raise _too_many(f"at most {MAX_KEYTERMS} keyterms")
    if sum(map(len, terms)) > MAX_KEYTERMS_CHARS:
        raise _too_many(f"keyterms have at most {MAX_KEYTERMS_CHARS} characters in all")
    return tuple(terms)


def keyterms_field(data: dict[str, Any], name: str = "keyterms") -> tuple[str, ...]:
    """A JSON message's list of terms under `name` (a list of strings), parsed."""
    values = data.get(name)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            CloseCode.INVALID_PAYLOAD,
            f'"{name}" must be a list of strings',
        )
    return parse_keyterms(values)


def configure_keyterms(text: str) -> tuple[str, ...]:
    """The terms of a `configure` text frame (already known to be valid JSON)."""
    data = orjson.loads(text)
    return keyterms_field(data if isinstance(data, dict) else {})


def prompt_terms(prompt: str) -> tuple[str, ...]:
    """The terms of an OpenAI transcription `prompt`: its comma-, semicolon- or
    newline-separated parts of at most PROMPT_TERM_WORDS words (a glossary such as
    "Kubernetes, Anya Petrova, OAuth"); longer parts (prose) are not terms, and are
    dropped."""
    parts = [p for chunk in prompt.replace(";", ",").splitlines() for p in chunk.split(",")]
    return parse_keyterms(p for p in parts if 0 < len(p.split()) <= PROMPT_TERM_WORDS)


def keyword_terms(values: Iterable[str]) -> list[str]:
    """Deepgram's `keywords` (`word` or `word:boost`) as keyterms: the boost is dropped
    (Parley's bonus is fixed), and a keyword with a negative boost (Deepgram: suppress
    it) is not a keyterm."""
    terms = []
    for value in values:
        word, _, boost = value.rpartition(":")
        try:
            if boost and word and float(boost) < 0:
                continue
            terms.append(word if word and boost else value)
        except ValueError:
            terms.append(value)  # a colon that is part of the word
    return terms


def _too_many(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.TOO_MANY_KEYTERMS, CloseCode.BAD_REQUEST, message)
