"""Keyterms on the real model and real speech: a keyterm fixes a word the model gets
wrong, unrelated keyterms change nothing, and a row's keyterms touch no other row."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.corpus import clips
from bench.keyterms import speak
from engine.api import Utterance
from engine.loading import load_whisper
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from server.engine_plan import model_config
from server.settings import Settings

pytestmark = pytest.mark.slow

HESTER = "en_ls_1221-135766-0002"  # "... affected Hester Prynne less with hope ..."
UNRELATED = ("Kubernetes", "Siobhan Nakamura", "Zephyrix")
# bench/keyterms.py's tuning set: tiny.en writes the name as English words it is unsure of.
RARE_SENTENCE = "Please ask Siobhan Nakamura to review the Kubernetes migration before Friday."
RARE_VOICE = "en-us"
RARE_TERMS = ("Siobhan", "Nakamura", "Kubernetes")
RARE_NAME = "Kubernetes"


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


@pytest.fixture(scope="module")
def rewrite_only(tiny_en: Path) -> WhisperRecognizer:
    """Neither prompt nor bonus: only the sound-alike rewrite can write a term."""
    config = WhisperRecognizerConfig(keyterm_prompt=False, keyterm_start=0.0, keyterm_continue=0.0)
    return WhisperRecognizer(tiny_en, config)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng and sox")
def test_a_name_the_model_never_saw_is_written_where_it_sounds_alike(
    rewrite_only: WhisperRecognizer, tmp_path: Path
) -> None:
    """An espeak sentence with a rare name tiny.en writes as unsure English words: with
    its keyterm the name is written in their place (one word, its timings spanning
    theirs), without it not; the text and the words agree."""
    audio = speak(RARE_SENTENCE, RARE_VOICE, tmp_path)
    plain, written = rewrite_only.transcribe(
        [
            Utterance(audio, word_timings=True),
            Utterance(audio, keyterms=RARE_TERMS, word_timings=True),
        ]
    )
    assert RARE_NAME not in plain.text, plain.text
    assert RARE_NAME in written.text, written.text
    assert "".join(w.word for w in written.words).strip() == written.text
    [name] = [w for w in written.words if w.word.strip(" .,") == RARE_NAME]
    assert len(written.words) < len(plain.words)
    assert name.end > name.start


def test_the_servers_settings_read_keyterms_in_the_prompt(tiny_en: Path) -> None:
    """The server decodes without previous text by default (`PARLEY_PROMPT_TOKENS=0`), and
    a stream's keyterms are still read in the prompt: once they shared the previous text's
    room, and the server's finals read none (an outside check saw the same text with and
    without keyterms)."""
    config = model_config(Settings())
    assert config.prompt_tokens == 0
    recognizer = load_whisper(config)
    assert isinstance(recognizer, WhisperRecognizer)
    whisper = recognizer.whisper
    assert whisper.prefix("We met on Monday.", ("Prynne", "Hester")) == [
        whisper.prev,
        *whisper.draft_tokens("Prynne, Hester."),
    ]
    assert whisper.prefix("We met on Monday.") == []
