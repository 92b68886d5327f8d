"""Keyterms on the real model and real speech: a keyterm fixes a word the model gets
wrong, unrelated keyterms change nothing, and a row's keyterms touch no other row."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.corpus import clips
from engine.api import Utterance
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig

pytestmark = pytest.mark.slow

HESTER = "en_ls_1221-135766-0002"  # "... affected Hester Prynne less with hope ..."
UNRELATED = ("Kubernetes", "Siobhan Nakamura", "Zephyrix")


@pytest.fixture(scope="module")
def recognizer(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en)


def test_a_keyterm_fixes_a_name_and_unrelated_ones_change_nothing(
    recognizer: WhisperRecognizer,
) -> None:
    """tiny.en writes "Hester Prin"; with the keyterm "Prynne" it writes "Prynne". JFK
    with three unrelated keyterms is transcribed word for word as without them."""
    hester = clips((HESTER,))[0].audio()
    jfk = clips(("en_jfk",))[0].audio()
    plain, fixed, jfk_plain, jfk_unrelated = recognizer.transcribe(
        [
            Utterance(hester),
            Utterance(hester, keyterms=("Prynne",)),
            Utterance(jfk),
            Utterance(jfk, keyterms=UNRELATED),
        ]
    )
    assert "Prynne" not in plain.text, plain.text
    assert "Prynne" in fixed.text, fixed.text
    assert jfk_unrelated.text == jfk_plain.text
    for term in UNRELATED:
        assert term.split()[0] not in jfk_unrelated.text


@pytest.fixture(scope="module")
def prompt_only(tiny_en: Path) -> WhisperRecognizer:
    """The prompt only (boosting off): the other mechanism, on its own."""
    config = WhisperRecognizerConfig(keyterm_start=0.0, keyterm_continue=0.0)
    return WhisperRecognizer(tiny_en, config)


@pytest.mark.parametrize("which", ["recognizer", "prompt_only"])
def test_keyterms_stay_in_their_row_and_drafts_change_nothing(
    which: str, request: pytest.FixtureRequest
) -> None:
    """In a mixed batch a row with keyterms decodes as alone, the rows beside it as
    without; and a row with keyterms and a draft (its plain text's first half, as a
    partial would give) decodes the same as without the draft; with the prompt only too."""
    recognizer: WhisperRecognizer = request.getfixturevalue(which)
    hester = clips((HESTER,))[0].audio()
    lj = clips(("en_lj_LJ001-0004",))[0].audio()
    alone = recognizer.transcribe([Utterance(hester, keyterms=("Prynne",))])[0]
    lj_alone = recognizer.transcribe([Utterance(lj)])[0]
    words = alone.text.split()
    draft = " ".join(words[: len(words) // 2])
    mixed = recognizer.transcribe(
        [
            Utterance(lj),
            Utterance(hester, keyterms=("Prynne",)),
            Utterance(hester, keyterms=("Prynne",), draft=draft),
        ]
    )
    assert mixed[0].text == lj_alone.text
    assert mixed[1].text == alone.text
    assert mixed[2].text == alone.text
