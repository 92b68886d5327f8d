"""Prompts of previous text on the real model: followed, per row, with drafts, or off."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.corpus import clips
from engine.api import Utterance
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig

pytestmark = pytest.mark.slow

HESTER = "en_ls_1221-135766-0002"  # "... affected Hester Prynne less with hope ..."
# Clips that all fit the 10 s window: batch-mates cannot change a row's window.
SAME_WINDOW = ("en_lj_LJ001-0004", "en_lj_LJ001-0008", "en_ls_61-")
PROMPT = "Hester Prynne stood on the scaffold, and the crowd looked on."


@pytest.fixture(scope="module")
def recognizer(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en)


def test_a_prompt_with_a_rare_spelling_is_followed(recognizer: WhisperRecognizer) -> None:
    audio = clips((HESTER,))[0].audio()
    plain, prompted = recognizer.transcribe([Utterance(audio), Utterance(audio, prompt=PROMPT)])
    assert "Prynne" not in plain.text, plain.text  # tiny.en alone writes "Hester Prin"
    assert "Hester Prynne" in prompted.text, prompted.text


def test_a_prompted_row_decodes_alike_whatever_its_batch_mates(
    recognizer: WhisperRecognizer,
) -> None:
    """A row with a prompt beside rows without one and with a longer one: every row's
    text and scores equal its decoding alone."""
    audio = [clips((HESTER,))[0].audio(), *(clip.audio() for clip in clips(SAME_WINDOW))]
    batch = [
        Utterance(audio[0], prompt=PROMPT),
        Utterance(audio[1]),
        Utterance(audio[2], prompt=" ".join([PROMPT] * 4)),
        Utterance(audio[3]),
    ]
    together = recognizer.transcribe(batch)
    alone = [recognizer.transcribe([utterance])[0] for utterance in batch]
    assert [r.text for r in together] == [r.text for r in alone]
    for mixed, single in zip(together, alone, strict=True):
        assert mixed.avg_logprob == pytest.approx(single.avg_logprob, abs=1e-4)
        assert mixed.no_speech_prob == pytest.approx(single.no_speech_prob, abs=1e-4)
    assert "Prynne" in together[0].text


def test_drafts_with_prompts_change_nothing_but_the_work(
    recognizer: WhisperRecognizer,
) -> None:
    """In float32, a prompted final decodes to the same text from a partial's draft (its
    first 60 %, decoded with the same prompt), from a wrong draft, and from none."""
    audio = clips((HESTER,))[0].audio()
    partial = recognizer.transcribe([Utterance(audio[: len(audio) * 3 // 5], prompt=PROMPT)])[0]
    assert partial.text
    plain = Utterance(audio, prompt=PROMPT)
    drafted = [
        dataclasses.replace(plain, draft=partial.text),
        dataclasses.replace(plain, draft="Something else entirely was said."),
        plain,
    ]
    texts = [r.text for r in recognizer.transcribe(drafted)]
    assert texts == [texts[2]] * 3, texts


def test_prompts_off_decodes_as_without_a_prompt(tiny_en: Path) -> None:
    """prompt_tokens=0 ignores prompts: the very decoding of a prompt-less utterance."""
    off = WhisperRecognizer(tiny_en, WhisperRecognizerConfig(prompt_tokens=0))
    audio = clips((HESTER,))[0].audio()
    ignored, plain = off.transcribe([Utterance(audio, prompt=PROMPT), Utterance(audio)])
    # The same text and words; the two rows' float32 products may differ in the last
    # digits (a batched matrix product need not round row 0 as it rounds row 1).
    assert ignored.text == plain.text
    assert [(w.word, w.start, w.end) for w in ignored.words] == [
        (w.word, w.start, w.end) for w in plain.words
    ]
    assert ignored.avg_logprob == pytest.approx(plain.avg_logprob, abs=1e-4)
    assert ignored.no_speech_prob == pytest.approx(plain.no_speech_prob, abs=1e-4)
    assert "Prynne" not in ignored.text


def test_prompt_tokens_must_leave_room_to_decode(tiny_en: Path) -> None:
    with pytest.raises(ValueError, match="prompt_tokens must be at most 220"):
        WhisperRecognizer(tiny_en, WhisperRecognizerConfig(prompt_tokens=221))
