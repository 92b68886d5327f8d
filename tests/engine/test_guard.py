"""The hallucination guard's rules, without the model."""

from __future__ import annotations

import pytest

from engine.whisper.guard import GuardConfig, Verdict, compression_ratio, first_cycle, judge

GUARD = GuardConfig()


def verdict(text: str, logprob: float, no_speech: float, exhausted: bool = False) -> Verdict:
    return judge(
        text, avg_logprob=logprob, no_speech_prob=no_speech, exhausted=exhausted, config=GUARD
    )


def test_confident_speech_is_kept() -> None:
    """Typical corpus speech (no_speech below 0.35, logprob above -0.7) passes."""
    assert verdict("Go forward ten meters.", -0.3, 0.02) is Verdict.SPEECH
    assert verdict("Montreal forced, for a stilliner.", -0.69, 0.30) is Verdict.SPEECH


def test_whispers_own_no_speech_rule() -> None:
    """no_speech_prob > 0.6 with avg_logprob < -1 is silence; either alone is not."""
    assert verdict("I'm going to do it.", -1.57, 0.92) is Verdict.NO_SPEECH
    assert verdict("I'm going to do it.", -1.57, 0.55) is Verdict.SPEECH
    assert verdict("I'm going to do it.", -0.9, 0.85) is Verdict.SPEECH


def test_certain_no_speech_decides_alone() -> None:
    """Digital silence gives 'you' at no_speech 0.99 with a confident decoder: dropped."""
    assert verdict("you", -0.62, 0.99) is Verdict.NO_SPEECH


def test_text_without_letters_or_digits_is_not_speech() -> None:
    """A lone '.' or '...' is what Whisper writes for noise."""
    assert verdict(".", -0.1, 0.1) is Verdict.NO_SPEECH
    assert verdict(" ... ", -0.1, 0.1) is Verdict.NO_SPEECH


def test_loops_are_dropped() -> None:
    """A repeated phrase, or a decoding cut off by its budget, is a loop."""
    loop = "Go forward 10 meters. " * 8
    assert compression_ratio(loop) > 2.4
    assert verdict(loop, -0.1, 0.02) is Verdict.LOOP
    assert verdict("He was not an old-s-y-y-y", -0.2, 0.03, exhausted=True) is Verdict.LOOP
    assert compression_ratio("") == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"no_speech_threshold": 1.5},
        {"certain_no_speech_threshold": -0.1},
        {"logprob_threshold": 0.5},
        {"compression_ratio_threshold": 1.0},
    ],
)
def test_nonsense_thresholds_are_refused(kwargs: dict[str, float]) -> None:
    """GuardConfig validates its thresholds at construction."""
    with pytest.raises(ValueError):
        GuardConfig(**kwargs)


def test_first_cycle_keeps_what_was_read_before_it_repeats() -> None:
    """A decoding that repeats a span until it ends keeps up to that span's first end."""
    assert first_cycle([1, 2, 3, 4, 3, 4, 3]) == 4  # "A B C D C D C" keeps "A B C D"
    assert first_cycle([7, 8, 9] * 3) == 3
    assert first_cycle([1, 2, 3, 1, 2]) is None  # no whole repeat yet
    assert first_cycle([1, 2, 3]) is None
    assert first_cycle([]) is None
    assert first_cycle([1, 2, 5, 5]) == 3  # one token repeated ("no, no" ...)
    assert first_cycle([1, 2, 5, 5], min_period=3) is None  # ... is no phrase
