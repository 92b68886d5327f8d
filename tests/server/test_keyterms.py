"""Keyterms on the wire: parsing and bounds, Deepgram's `keyterm`/`keywords`/`Configure`,
the OpenAI prompt, and a real server passing each stream's list (and a `configure`'s
replacement) to the engine with every utterance."""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

import orjson
import pytest
from websockets.asyncio.client import connect

from bench.fake_recognizer import FakeRecognizer
from server.compat.deepgram import DeepgramCodec, parse_options
from server.compat.openai_realtime import RealtimeCodec, Vad
from server.settings import Settings
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP
from tests.support.wsclient import BYTES_PER_SECOND, StreamResult, receive_all, stream_url
from wire.codes import ErrorCode
from wire.errors import ProtocolError
from wire.keyterms import MAX_KEYTERMS, configure_keyterms, parse_keyterms, prompt_terms

PHRASE = 3 * BYTES_PER_SECOND  # "And so my fellow Americans," then a pause


def test_terms_are_tidied_and_deduplicated() -> None:
    assert parse_keyterms(["  Anya   Petrova ", "Kubernetes", "Kubernetes"]) == (
        "Anya Petrova",
        "Kubernetes",
    )


def test_past_the_bounds_is_refused_with_a_named_code() -> None:
    parse_keyterms([f"term{i}" for i in range(MAX_KEYTERMS)])  # at the bound: taken
    # Too many terms, one too long, too many characters in all (21 distinct terms of 99).
    for terms in (
        [f"term{i}" for i in range(MAX_KEYTERMS + 1)],
        ["x" * 101],
        [f"{i:02}" + "y" * 97 for i in range(21)],
    ):
        with pytest.raises(ProtocolError) as refused:
            parse_keyterms(terms)
        assert refused.value.code is ErrorCode.TOO_MANY_KEYTERMS
        assert refused.value.close_code == 4400
    with pytest.raises(ProtocolError) as blank:
        parse_keyterms(["ok", "  "])
    assert blank.value.code is ErrorCode.BAD_CONFIG


def test_a_configure_message_needs_a_list_of_strings() -> None:
    assert configure_keyterms('{"type": "configure", "keyterms": ["Zephyrix"]}') == ("Zephyrix",)
    assert configure_keyterms('{"type": "configure", "keyterms": []}') == ()
    with pytest.raises(ProtocolError) as refused:
        configure_keyterms('{"type": "configure", "keyterms": "Zephyrix"}')
    assert refused.value.code is ErrorCode.INVALID_MESSAGE


def test_an_openai_prompt_gives_its_short_parts_as_terms() -> None:
    prompt = "Kubernetes, Anya Petrova; OAuth\nThis is a long sentence of prose about a meeting."
    assert prompt_terms(prompt) == ("Kubernetes", "Anya Petrova", "OAuth")


def test_deepgram_keyterms_and_keywords_with_boosts() -> None:
    options = parse_options(
        {},
        meeting_id="m",
        default_language="en",
        keyterms=["Anya Petrova"],
        keywords=["Zephyrix:2", "kubectl", "um:-10", "12:30:5"],
    )
    assert options.keyterms == ("Anya Petrova", "Zephyrix", "kubectl", "12:30")
    assert options.stream_config().keyterms == options.keyterms


def test_deepgram_configure_replaces_the_list_or_fails_without_closing() -> None:
    options = parse_options({}, meeting_id="m", default_language="en", keyterms=["Anya"])
    codec = DeepgramCodec(options, request_id="r", model_name="tiny.en")
    inbound = codec.from_client({"text": '{"type": "Configure", "keyterms": ["Zephyrix"]}'})
    assert [orjson.loads(m["text"]) for m in inbound.to_actor] == [
        {"type": "configure", "keyterms": ["Zephyrix"]}
    ]
    reply = orjson.loads(inbound.replies[0])
    assert reply["type"] == "ConfigureSuccess" and reply["keyterms"] == ["Zephyrix"]
    too_many = orjson.dumps({"type": "Configure", "keyterms": [f"t{i}" for i in range(101)]})
    refused = codec.from_client({"text": too_many.decode()})
    assert refused.to_actor == []
    failure = orjson.loads(refused.replies[0])
    assert failure["type"] == "ConfigureFailure" and failure["err_code"] == "too_many_keyterms"
    kept = codec.from_client({"text": '{"type": "Configure", "keyterms": null}'})
    assert orjson.loads(kept.replies[0])["keyterms"] == ["Zephyrix"]


def test_openai_prompt_sets_the_streams_terms_and_updates_them_once_started() -> None:
    vad = Vad(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500)
    codec = RealtimeCodec(session_id="s", beta=False, vad=vad, default_language="en", model="m")

    def update(prompt: str) -> str:
        session = {"audio": {"input": {"transcription": {"prompt": prompt, "language": "en"}}}}
        return orjson.dumps({"type": "session.update", "session": session}).decode()

    before = codec.from_client({"text": update("Kubernetes, OAuth")})
    assert before.to_actor == []  # before audio: the stream starts with them
    assert codec.stream_config("m", "p").keyterms == ("Kubernetes", "OAuth")
    codec.started = True
    after = codec.from_client({"text": update("Zephyrix")})
    assert [orjson.loads(m["text"]) for m in after.to_actor] == [
        {"type": "configure", "keyterms": ["Zephyrix"]}
    ]


async def test_a_stream_sends_its_keyterms_and_a_configure_replaces_them() -> None:
    """Utterances before `configure` carry the query's keyterms, those after it the new
    list; the stream's `session.started` config names them."""
    recognizer = FakeRecognizer()

    def engine(settings: Settings) -> FakeRecognizer:
        return recognizer

    async with serve_app(engine) as server:
        result = StreamResult()
        terms = urlencode([("keyterm", "Anya Petrova"), ("keyterm", "Kubernetes")])
        url = stream_url(server.ws_url, "kt", participant="ana", interim_results=False)
        async with connect(f"{url}&{terms}") as ws:
            receiving = asyncio.create_task(receive_all(ws, result))
            pcm = clip("en_jfk").pcm16()
            await ws.send(pcm[:PHRASE] + bytes(BYTES_PER_SECOND))
            while not any(m["type"] == "transcript.final" for m in result.messages):
                result.arrived.clear()
                await asyncio.wait_for(result.arrived.wait(), 10)
            await ws.send(orjson.dumps({"type": "configure", "keyterms": ["Zephyrix"]}).decode())
            await ws.send(pcm[PHRASE:])
            await ws.send(STOP)
            await asyncio.wait_for(receiving, 20)
    assert result.close_code == 1000, result.messages[-2:]
    started = result.messages[0]
    assert started["config"]["keyterms"] == ["Anya Petrova", "Kubernetes"]
    sent = [terms for _, terms in recognizer.keyterms]
    assert sent[0] == ("Anya Petrova", "Kubernetes")
    assert sent[-1] == ("Zephyrix",)


async def test_too_many_keyterms_close_the_stream_4400() -> None:
    recognizer = FakeRecognizer()

    def engine(settings: Settings) -> FakeRecognizer:
        return recognizer

    async with serve_app(engine) as server:
        result = StreamResult()
        terms = urlencode([("keyterm", f"term{i}") for i in range(MAX_KEYTERMS + 1)])
        url = stream_url(server.ws_url, "kt-many", participant="ana")
        async with connect(f"{url}&{terms}") as ws:
            await asyncio.wait_for(receive_all(ws, result), 10)
    assert result.close_code == 4400
    assert result.messages[-1]["code"] == "too_many_keyterms"
