"""Multilingual meetings end to end on Whisper base: detection per source, finals per language."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from loadgen.wer import CHARACTER_LANGUAGES, ErrorCounts, error_counts
from tests.support.corpus import Clip, clip, clips
from tests.support.servers import ServerProcess, start_server
from tests.support.wsclient import StreamResult, stream_pcm

pytestmark = pytest.mark.slow

SPEED = 4.0  # faster than real time: the model, not the pacing, sets the runtime
DRAIN = 400.0  # seconds for the last finals after `stop` (2 shared cores, base model)
MAX_ERROR_RATE = 0.35  # aggregate WER of word languages, CER of zh/ja/ko
MIN_DETECTED = 9  # of the 11 non-English clips


@pytest.fixture(scope="module")
def base_server() -> Iterator[ServerProcess]:
    """One server on Whisper base (multilingual) for the whole module."""
    server = start_server({"PARLEY_MODEL": "base"})
    yield server
    server.stop()


async def stream_auto(
    server: ServerProcess, meeting: str, item: Clip, **params: Any
) -> StreamResult:
    return await stream_pcm(
        server.ws_url,
        meeting,
        item.pcm16(),
        speed=SPEED,
        trailing_silence=1.0,
        drain_timeout=DRAIN,
        language="auto",
        interim_results=False,
        **params,
    )


def pinned_language(result: StreamResult) -> str | None:
    """The language the stream's one `session.language` message pinned."""
    pins = result.of_type("session.language")
    assert len(pins) <= 1, pins
    return pins[0]["language"] if pins else None


async def test_non_english_clips_are_detected_and_transcribed(base_server: ServerProcess) -> None:
    """The 11 non-English clips with language=auto, all at once: at least 9 detected right,
    aggregate WER (CER for zh/ja/ko) at most 0.35."""
    selected = [c for c in clips().values() if c.language != "en"]
    assert len(selected) == 11, [c.id for c in selected]
    results = await asyncio.gather(*(stream_auto(base_server, c.id, c) for c in selected))
    words = ErrorCounts(0, 0, 0, 0)
    characters = ErrorCounts(0, 0, 0, 0)
    detected = 0
    print(f"\n{'clip':32} lang detected   p     rate  kind")
    for item, result in zip(selected, results, strict=True):
        assert result.close_code == 1000 and result.finals, (item.id, result.messages)
        language = pinned_language(result)
        probability = result.of_type("session.language")[0]["probability"] if language else None
        counts = error_counts(item.reference, result.text, item.language)
        if item.language in CHARACTER_LANGUAGES:
            characters += counts
        else:
            words += counts
        detected += language == item.language
        kind = "CER" if item.language in CHARACTER_LANGUAGES else "WER"
        print(
            f"{item.id:32} {item.language:4} {language or '-':8} {probability or 0:.2f} "
            f"{counts.rate:6.3f} {kind}  {result.text}"
        )
    print(f"detected {detected}/11; WER {words.rate:.3f}; CER {characters.rate:.3f}")
    assert detected >= MIN_DETECTED
    assert words.rate <= MAX_ERROR_RATE, words
    assert characters.rate <= MAX_ERROR_RATE, characters


async def test_english_and_spanish_participants_get_their_own_language(
    base_server: ServerProcess,
) -> None:
    """One meeting, an English and a Spanish participant streaming at once with
    language=auto: each participant's finals come in its own language."""
    english, spanish = clip("en_jfk"), clip("es_leopard_test_es")
    results = await asyncio.gather(
        stream_auto(base_server, "ml-meeting", english, participant="ana"),
        stream_auto(base_server, "ml-meeting", spanish, participant="bea"),
    )
    for item, result in zip((english, spanish), results, strict=True):
        assert pinned_language(result) == item.language, (item.id, result.messages)
        languages = Counter(f["language"] for f in result.finals)
        assert languages and set(languages) == {item.language}, (item.id, result.finals)
        rate = error_counts(item.reference, result.text, item.language).rate
        print(f"\n{item.id}: {item.language} {dict(languages)} WER {rate:.3f} {result.text}")
        assert rate <= MAX_ERROR_RATE, (item.id, result.text)
    seqs = sorted(f["seq"] for result in results for f in result.finals)
    assert seqs == list(range(1, len(seqs) + 1))  # one meeting, one gap-free sequence
