"""The hallucination guard: decide whether a decoded utterance is speech at all.

Whisper, fed silence or noise, often still writes something ("you", "Thank you.", a
phrase or a "." repeated until the token budget runs out). Three signals, each checked on
the corpus (real speech) and on silence, white / brown noise from -70 to -10 dBFS, hum,
a tone and clicks:

- Whisper's own rule (openai/whisper `transcribe.py`): no_speech_prob > 0.6 and
  avg_logprob < -1. It misses digital silence, where tiny.en writes "you" with
  no_speech_prob 0.99 but avg_logprob -0.7; so above 0.9 the no-speech probability alone
  decides. On the corpus's speech (every language) it never exceeded 0.33.
- A loop: text that compresses far better than language does (zlib ratio > 2.4, the
  constant Whisper uses for its temperature fallback), or decoding that ran out of its
  token budget without ending. Noise loops as ". . . ."; real speech loops too when the
  encoder window leaves it little trailing silence, which is why the recognizer retries a
  looped utterance on the full window before this guard drops it.
- Text with no letter or digit at all ("." or "...").
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Sequence
from dataclasses import dataclass


class Verdict(enum.Enum):
    SPEECH = "speech"
    NO_SPEECH = "no_speech"  # the model says, or its output shows, there is nothing to say
    LOOP = "loop"  # the decoder repeated itself


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Thresholds: Whisper's defaults, plus the no-speech level that decides on its own."""

    no_speech_threshold: float = 0.6
    logprob_threshold: float = -1.0
    certain_no_speech_threshold: float = 0.9
    compression_ratio_threshold: float = 2.4

    def __post_init__(self) -> None:
        for name in ("no_speech_threshold", "certain_no_speech_threshold"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} {value} is not in [0, 1]")
        if self.logprob_threshold > 0.0:
            raise ValueError(f"logprob_threshold {self.logprob_threshold} must be <= 0")
        if self.compression_ratio_threshold <= 1.0:
            raise ValueError("compression_ratio_threshold must be > 1")


def compression_ratio(text: str) -> float:
    """Bytes of `text` over bytes of its zlib compression (0 for empty text)."""
    data = text.encode("utf-8")
    if not data:
        return 0.0
    return len(data) / len(zlib.compress(data))


def looped(text: str, exhausted: bool, config: GuardConfig) -> bool:
    """Whether decoding went round in circles (or never ended)."""
    return exhausted or compression_ratio(text) > config.compression_ratio_threshold


def first_cycle(tokens: Sequence[int], min_period: int = 1) -> int | None:
    """How many of a looping decoding's `tokens` to keep: up to the end of the first
    cycle of the span (of `min_period` tokens or more) that then repeats, whole, at least
    once more until the end (None when no span does). "A B C D C D C" keeps "A B C D".

    In a short window tiny.en often reads the speech once, then reads it again into the
    window's trailing silence: the first cycle is what was said. Of the periods that
    repeat, the shortest wins (it cuts earliest)."""
    n = len(tokens)
    for period in range(min_period, n // 2 + 1):
        start = n  # the periodic tail is tokens[start:], each equal to the one `period` back
        while start - period > 0 and tokens[start - 1] == tokens[start - 1 - period]:
            start -= 1
        if n - start >= period:  # at least one whole repeat after the first cycle
            return start
    return None


def judge(
    text: str,
    *,
    avg_logprob: float,
    no_speech_prob: float,
    exhausted: bool,
    config: GuardConfig,
) -> Verdict:
    """Whether `text` should be kept (SPEECH) or replaced by empty text, and why."""
    if not any(character.isalnum() for character in text):
        return Verdict.NO_SPEECH
    if no_speech_prob > config.certain_no_speech_threshold:
        return Verdict.NO_SPEECH
    if no_speech_prob > config.no_speech_threshold and avg_logprob < config.logprob_threshold:
        return Verdict.NO_SPEECH
    if looped(text, exhausted, config):
        return Verdict.LOOP
    return Verdict.SPEECH
