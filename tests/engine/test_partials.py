"""Partials decoded more cheaply than finals (`Utterance.partial`): a shorter window, a
smaller token budget, no second decoding of a loop; on real speech, the finals' words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench.corpus import clips
from engine.api import SAMPLE_RATE, Utterance
from engine.whisper.int8 import Int8Linear
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from loadgen.wer import ErrorCounts, error_counts

pytestmark = pytest.mark.slow

ENGLISH = ("en_ls_", "en_jfk", "en_lj_LJ0")
PREFIXES = (1.6, 3.2, 4.8)  # seconds of each clip: a live utterance's partials


@pytest.fixture(scope="module")
def recognizer(tiny_en: Path) -> WhisperRecognizer:
    """The server's CPU default (int8 shortlist) with the default partial settings."""
    return WhisperRecognizer(tiny_en, WhisperRecognizerConfig(quantize="int8-shortlist"))


def jfk(seconds: float) -> Utterance:
    return Utterance(clips(("en_jfk",))[0].audio()[: round(seconds * SAMPLE_RATE)])


def test_a_partial_takes_a_shorter_window_than_a_final(recognizer: WhisperRecognizer) -> None:
    """A partial's window holds its audio plus 2 s among 4/6/8 s and the finals' windows;
    a final's its audio plus 1 s among 10/15/20/30 s; a batch takes its rows' largest."""

    def window(seconds: float, partial: bool) -> float:
        return recognizer.window([Utterance(jfk(seconds).audio, partial=partial)])

    assert [window(s, True) for s in (1.0, 2.0, 3.5, 5.5, 7.5, 9.5)] == [4, 4, 6, 8, 10, 15]
    assert [window(s, False) for s in (1.0, 5.5, 9.5)] == [10, 10, 15]
    mixed = [Utterance(jfk(1.0).audio, partial=True), jfk(5.0)]
    assert recognizer.window(mixed) == 10


def partials_against_finals(
    finals: WhisperRecognizer, partials: WhisperRecognizer
) -> tuple[int, int, ErrorCounts]:
    """The first 1.6, 3.2 and 4.8 s of the English clips decoded as finals by `finals`
    and as partials by `partials`: how many prefixes, how many partials came back empty
    (a loop the guard drops), and the other partials' words against the finals'."""
    count = empty = 0
    errors = ErrorCounts(0, 0, 0, 0)
    for clip in clips(ENGLISH):
        for seconds in PREFIXES:
            if seconds >= clip.duration:
                continue
            audio = clip.audio()[: round(seconds * SAMPLE_RATE)]
            final = finals.transcribe([Utterance(audio)])[0].text
            partial = partials.transcribe([Utterance(audio, partial=True)])[0].text
            count += 1
            if not partial:
                empty += 1
            elif final:
                errors += error_counts(final, partial)
    return count, empty, errors


def test_partials_say_what_finals_say(recognizer: WhisperRecognizer) -> None:
    """Partials (short windows) against finals of the same audio: few come back empty
    and the others' words are the finals' (measured: 0 empty of 44, 1.3 % of words
    differ, 2026-12-03; 3 and 2.7 % before partials kept a loop's first reading)."""
    count, empty, errors = partials_against_finals(recognizer, recognizer)
    assert count >= 40, count
    assert empty <= 5, empty
    assert errors.rate <= 0.06, errors


def test_a_looping_partial_is_not_decoded_again(
    tiny_en: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With budgets too small for JFK's first 8 s (12 tokens), decoding runs out of tokens
    (a loop to the guard): a final is decoded again on the 30 s window, a partial is not:
    it comes back empty after one decoding in its 10 s window."""
    tight = WhisperRecognizer(
        tiny_en,
        WhisperRecognizerConfig(max_tokens_per_second=0.5, partial_tokens_per_second=0.5),
    )
    windows: list[float] = []
    forward: Callable[..., object] = tight.forward

    def spy(batch: list[Utterance], window: float, *args: object) -> object:
        windows.append(window)
        return forward(batch, window, *args)

    monkeypatch.setattr(tight, "forward", spy)
    partial = tight.transcribe([Utterance(jfk(8.0).audio, partial=True)])[0]
    assert partial.text == "" and windows == [10.0]
    windows.clear()
    final = tight.transcribe([jfk(8.0)])[0]
    assert final.text == "" and windows == [10.0, 30.0]


@pytest.fixture(scope="module")
def int8_partials(tiny_en: Path) -> WhisperRecognizer:
    """The CPU default since `partial_quantize`: finals through the int8 shortlist, partials
    through int8 copies of the decoder's layers and projection."""
    config = WhisperRecognizerConfig(quantize="int8-shortlist", partial_quantize="int8-decoder")
    return WhisperRecognizer(tiny_en, config)


def test_int8_partials_leave_finals_as_they_were(
    recognizer: WhisperRecognizer, int8_partials: WhisperRecognizer
) -> None:
    """Finals, alone and beside a partial in one batch (a batch with any final decodes
    through the finals' weights), are token for token those of a recognizer without int8
    partials; the finals' decoder keeps its float32 layers (the int8 ones are copies)."""
    audio = clips(("en_lj_LJ001-0004",))[0].audio()
    finals = [Utterance(audio), jfk(8.0)]
    want = recognizer.transcribe(finals)
    assert [r.text for r in int8_partials.transcribe(finals)] == [r.text for r in want]
    mixed = int8_partials.transcribe([Utterance(jfk(3.2).audio, partial=True), finals[1]])
    assert mixed[1].text == want[1].text and mixed[1].words == want[1].words
    decoder = int8_partials.whisper.model.model.decoder
    assert not any(isinstance(module, Int8Linear) for module in decoder.modules())


def test_int8_partials_say_what_finals_say(
    recognizer: WhisperRecognizer, int8_partials: WhisperRecognizer
) -> None:
    """The same prefixes through int8 partials, against float32 finals: as few empty,
    about as many words differing (measured 2026-12-03: 0 empty of 44, 2.3 % of words
    differ, against 1.3 % for float32 partials)."""
    count, empty, errors = partials_against_finals(recognizer, int8_partials)
    assert count >= 40, count
    assert empty <= 5, empty
    assert errors.rate <= 0.06, errors


def test_int8_partials_need_the_cpu_in_float32() -> None:
    with pytest.raises(ValueError, match="int8 partials"):
        WhisperRecognizerConfig(device="cuda", partial_quantize="int8-decoder")
    with pytest.raises(ValueError, match="partial_quantize"):
        WhisperRecognizerConfig(quantize="int8-shortlist", partial_quantize="int8")
    assert not WhisperRecognizerConfig(
        quantize="int8", partial_quantize="int8-decoder"
    ).int8_partials
