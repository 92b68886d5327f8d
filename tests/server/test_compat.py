"""The compat endpoints' contract on the real app (fake engine, real VAD), driven by the
vendors' official SDKs where they can say it: refused parameters and credentials,
keepalive against the idle limit, bad audio and bad messages, session configuration."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from bench.fake_recognizer import FakeRecognizer
from engine.api import Transcription, Utterance
from tests.support.appserver import AppServer, serve_app, serving
from tests.support.compat_clients import (
    WEBSOCKETS_LEGACY,
    ApiError,
    Received,
    b64,
    deepgram_client,
    drain,
    openai_client,
    pcm16_at,
    receive_deepgram,
    receive_openai,
    transcription_session,
)
from tests.support.corpus import clip

pytestmark = WEBSOCKETS_LEGACY

KEY = "compat-test-key-0123456789"
IDLE_S = 1.0


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[AppServer]:
    """One app for the module: authentication on, a short idle limit."""
    async with serve_app(api_keys=f"acme:{KEY}", idle_timeout_s=IDLE_S) as app:
        yield app


def speech() -> bytes:
    return clip("en_jfk").pcm16()[: 16_000 * 2 * 3]  # 3 s: speech from 0.35 s


async def refusal(
    server: AppServer, path: str, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """The HTTP answer to a WebSocket handshake the server refuses."""
    with pytest.raises(InvalidStatus) as refused:
        async with connect(server.ws_url + path, additional_headers=headers):
            pass
    response = refused.value.response
    return response.status_code, dict(response.headers), bytes(response.body or b"")


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("encoding=mulaw&sample_rate=8000", "encoding"),
        ("channels=99&multichannel=true", "channels"),  # past PARLEY_MAX_CHANNELS
        ("channels=2&multichannel=maybe", "multichannel"),
        ("channels=2&multichannel=true&participant=a,b,c", "participant"),
        ("sample_rate=4000", "sample_rate"),
        ("sample_rate=fast", "sample_rate"),
        ("interim_results=maybe", "interim_results"),
        ("utterance_end_ms=-5", "utterance_end_ms"),
        ("endpointing=soon", "endpointing"),
        ("callback=https://example.invalid/hook", "callback"),
        ("redact=pii", "redact"),  # pci, ssn and numbers are honoured
        ("language=fr", "language"),  # the fake model is English-only
        ("language=en_US!", "language"),
        ("encoding=%C3%A9", "encoding"),  # echoed in the dg-error header: kept latin-1
        ("meeting_id=../etc", "meeting_id"),
    ],
)
async def test_deepgram_refuses_bad_parameters_with_400(
    server: AppServer, query: str, reason: str
) -> None:
    """A malformed or unsupported parameter: HTTP 400, the reason in `dg-error` and the
    JSON body, as Deepgram answers; the SDK raises ApiError(400)."""
    status, headers, body = await refusal(
        server, f"/v1/listen?{query}", {"Authorization": f"Token {KEY}"}
    )
    assert status == 400
    assert reason in headers["dg-error"] and headers["dg-request-id"]
    answer = orjson.loads(body)
    assert answer["err_code"] == "bad_config" and reason in answer["err_msg"]
    client = deepgram_client(server.http_url, server.ws_url, KEY)
    with pytest.raises(ApiError) as raised:
        options = {"additional_query_parameters": dict(parse_qsl(query))}
        async with client.listen.v1.connect(model="nova-3", request_options=options):
            pass
    assert raised.value.status_code == 400


async def test_deepgram_credentials_map_onto_api_keys(server: AppServer) -> None:
    """`Token KEY` and `Bearer KEY` open a stream; no key, a wrong key, another scheme or an
    API key in the URL are 401; ignored parameters do not refuse."""
    for header in (f"Token {KEY}", f"Bearer {KEY}"):
        async with connect(
            server.ws_url + "/v1/listen?model=nova-3&keywords=parley:2&tag=t&profanity_filter=true",
            additional_headers={"Authorization": header},
        ) as ws:
            await ws.send('{"type": "CloseStream"}')
            metadata = orjson.loads(await ws.recv())
            assert metadata["type"] == "Metadata" and metadata["duration"] == 0
            await ws.wait_closed()
            assert ws.close_code == 1000
    for headers, path in [
        ({}, "/v1/listen"),
        ({"Authorization": "Token wrong-key-0123456789"}, "/v1/listen"),
        ({"Authorization": f"Basic {KEY}"}, "/v1/listen"),
        ({}, f"/v1/listen?access_token={KEY}"),
    ]:
        status, _, body = await refusal(server, path, headers)
        assert status == 401, (headers, path)
        assert orjson.loads(body)["err_code"] == "unauthorized"
    client = deepgram_client(server.http_url, server.ws_url, "wrong-key-0123456789")
    with pytest.raises(ApiError) as raised:
        async with client.listen.v1.connect(model="nova-3"):
            pass
    assert raised.value.status_code == 401


async def test_deepgram_keepalive_holds_an_idle_stream_open(server: AppServer) -> None:
    """The SDK's KeepAlive keeps a stream without audio open past the idle limit; once it
    stops, the stream is closed 4408 with an Error naming the timeout."""
    client = deepgram_client(server.http_url, server.ws_url, KEY)
    async with client.listen.v1.connect(model="nova-3") as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        for _ in range(int(3 * IDLE_S / 0.25)):  # three idle limits
            await connection.send_keep_alive()
            await asyncio.sleep(0.25)
        assert not reader.done(), received.messages
        await asyncio.wait_for(reader, 5 * IDLE_S)
    assert received.close_code == 4408
    [error] = received.of_type("Error")
    assert error.variant == "timeout" and "keepalive" in error.description


async def test_deepgram_bad_audio_gets_protocol_v1_protections(server: AppServer) -> None:
    """An odd-length linear16 frame closes 1007, a frame over the limit 1009, an unknown
    message 1007: each after an Error saying why (the same checks as protocol v1)."""
    limit = server.state.settings.streams.max_frame_bytes
    cases: list[tuple[bytes | str, int, str]] = [
        (bytes(641), 1007, "invalid_audio"),
        (bytes(limit + 2), 1009, "frame_too_large"),
        ('{"type": "Dance"}', 1007, "invalid_message"),
        ("not json", 1007, "invalid_message"),
    ]
    for frame, code, variant in cases:
        async with connect(
            server.ws_url + "/v1/listen?encoding=linear16&sample_rate=16000",
            additional_headers={"Authorization": f"Token {KEY}"},
            max_size=None,
        ) as ws:
            await ws.send(speech()[:6400])
            await ws.send(frame)
            messages = await drain(ws)
        assert ws.close_code == code, (variant, messages)
        assert messages[-1]["type"] == "Error" and messages[-1]["variant"] == variant


async def test_deepgram_empty_frame_closes_like_closestream(server: AppServer) -> None:
    """An empty binary frame (Deepgram's older close) ends the stream with Metadata, 1000."""
    async with connect(
        server.ws_url + "/v1/listen", additional_headers={"Authorization": f"Token {KEY}"}
    ) as ws:
        await ws.send(speech())
        await ws.send(b"")
        messages = await drain(ws)
    assert ws.close_code == 1000
    assert messages[-1]["type"] == "Metadata" and messages[-1]["duration"] == 3.0
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert finals and all(m["channel"]["alternatives"][0]["transcript"] for m in finals)


async def test_openai_session_configuration_and_refusals(server: AppServer) -> None:
    """The SDK's transcription session: created, then updated with Parley's real turn
    detection; an unsupported format or event is an `error` event and the session goes
    on; audio is transcribed; a wrong key is refused 401 before the upgrade."""
    client = openai_client(server.http_url, KEY)
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        received = Received()
        reader = asyncio.create_task(receive_openai(connection, received))
        await connection.session.update(
            session={
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcmu"}}},
            }
        )
        await connection.send({"type": "response.create"})
        await connection.session.update(session=transcription_session(silence_duration_ms=900))
        await received.wait_for(lambda r: bool(r.of_type("session.updated")), 5)
        updated = received.of_type("session.updated")[0].session
        assert updated.audio.input.transcription.model == "gpt-4o-transcribe"
        own = round(server.state.settings.segmenter.min_silence_ms)
        assert updated.audio.input.turn_detection.silence_duration_ms == own  # Parley's own
        errors = received.of_type("error")
        assert [e.error.code for e in errors] == ["unsupported_audio_format", None]
        assert "response.create" in errors[1].error.message
        pcm24 = pcm16_at(clip("en_jfk").samples()[: 16_000 * 3], 24_000)
        await connection.input_audio_buffer.append(audio=b64(pcm24))
        await connection.input_audio_buffer.commit()
        await received.wait_for(
            lambda r: bool(r.of_type("conversation.item.input_audio_transcription.completed")), 10
        )
        assert received.of_type("session.created")
        assert not reader.done()
        await connection.close()
        await reader
    with pytest.raises(InvalidStatus) as refused:
        async with openai_client(server.http_url, "sk-wrong-0123456789").realtime.connect(
            extra_query={"intent": "transcription"}
        ):
            pass
    assert refused.value.response.status_code == 401


async def test_openai_bad_audio_closes_1007(server: AppServer) -> None:
    """An append that is not base64, or PCM16 of an odd byte count: `error`, close 1007."""
    for audio in ("***", b64(bytes(641))):
        async with connect(
            server.ws_url + "/v1/realtime?intent=transcription",
            additional_headers={"Authorization": f"Bearer {KEY}"},
        ) as ws:
            assert orjson.loads(await ws.recv())["type"] == "session.created"
            await ws.send(
                orjson.dumps({"type": "input_audio_buffer.append", "audio": audio}).decode()
            )
            messages = await drain(ws)
        assert ws.close_code == 1007, messages
        assert messages[-1]["type"] == "error"
        assert messages[-1]["error"]["code"] == "invalid_audio"


async def test_openai_session_without_audio_times_out(server: AppServer) -> None:
    """A session that configures itself but sends no audio is closed 4408 at the idle
    limit, with an `error` event."""
    async with connect(
        server.ws_url + "/v1/realtime?intent=transcription",
        additional_headers={"Authorization": f"Bearer {KEY}"},
    ) as ws:
        await ws.send('{"type": "session.update", "session": {"type": "transcription"}}')
        messages = await drain(ws)
    assert ws.close_code == 4408
    assert [m["type"] for m in messages] == ["session.created", "session.updated", "error"]
    assert messages[-1]["error"]["code"] == "timeout"


async def test_meeting_token_opens_a_compat_stream_of_its_meeting(server: AppServer) -> None:
    """A meeting token (for browsers) opens a Deepgram stream of its meeting, as
    `access_token` or as Deepgram's subprotocol pair; spent, it opens nothing more."""
    tokens = []
    for _ in range(2):
        status, _, body = await server.request(
            "POST",
            "/v1/meetings/compat-room/tokens",
            body={"scope": "stream"},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert status == 201
        tokens.append(orjson.loads(body)["token"])
    async with connect(
        server.ws_url + f"/v1/listen?meeting_id=compat-room&access_token={tokens[0]}"
    ) as ws:
        await ws.send('{"type": "CloseStream"}')
        assert orjson.loads(await ws.recv())["type"] == "Metadata"
    async with connect(
        server.ws_url + "/v1/listen?meeting_id=compat-room",
        subprotocols=[Subprotocol("token"), Subprotocol(tokens[1])],
    ) as ws:
        assert ws.subprotocol == "token"
        await ws.send('{"type": "CloseStream"}')
        assert orjson.loads(await ws.recv())["type"] == "Metadata"
    status, _, _ = await refusal(
        server, f"/v1/listen?meeting_id=compat-room&access_token={tokens[0]}", {}
    )
    assert status == 401


async def test_openai_beta_flavour(server: AppServer) -> None:
    """The SDK's beta client (`OpenAI-Beta: realtime=v1`): transcription_session.created and
    .updated with `input_audio_format: pcm16`, then transcripts as in the GA flavour."""
    client = openai_client(server.http_url, KEY)
    async with client.beta.realtime.connect(
        model="gpt-4o-transcribe", extra_query={"intent": "transcription"}
    ) as connection:
        await connection.transcription_session.update(
            session={
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": {"type": "server_vad"},
            }
        )
        await connection.input_audio_buffer.append(
            audio=b64(pcm16_at(clip("en_jfk").samples()[: 16_000 * 3], 24_000))
        )
        await connection.input_audio_buffer.commit()
        kinds = []
        async with asyncio.timeout(10):
            async for event in connection:
                kinds.append(event.type)
                if event.type == "transcription_session.updated":
                    assert event.session.input_audio_format == "pcm16"
                if event.type == "conversation.item.input_audio_transcription.completed":
                    break
        await connection.close()
    assert kinds[:2] == ["transcription_session.created", "transcription_session.updated"]
    assert "input_audio_buffer.committed" in kinds


async def test_deepgram_two_finalize_in_flight_get_two_answers(server: AppServer) -> None:
    """The SDK sends two Finalize back to back in mid-speech: the first closes the
    utterance (its final is from_finalize), the second finds nothing in progress and gets
    its own empty from_finalize Results (before, the first's final answered both)."""
    client = deepgram_client(server.http_url, server.ws_url, KEY)
    async with client.listen.v1.connect(model="nova-3", encoding="linear16") as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        await connection.send_media(speech()[: 16_000 * 2 * 2])  # 2 s: inside "Americans"
        await connection.send_finalize()
        await connection.send_finalize()

        def answered(r: Received) -> list[Any]:
            return [m for m in r.of_type("Results") if m.from_finalize]

        await received.wait_for(lambda r: len(answered(r)) >= 2, 10)
        await connection.send_close_stream()
        await asyncio.wait_for(reader, 10)
    first, second = (m.channel.alternatives[0].transcript for m in answered(received))
    assert first and second == ""
    assert received.messages[-1].type == "Metadata"


async def test_openai_commit_on_silence_is_answered_with_commit_empty(server: AppServer) -> None:
    """The SDK commits a buffer of silence: OpenAI's `input_audio_buffer_commit_empty`
    error comes back (before, no reply at all), the session goes on, and a commit in
    speech is answered by its item's committed and completed events."""
    client = openai_client(server.http_url, KEY)
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        received = Received()
        reader = asyncio.create_task(receive_openai(connection, received))
        await connection.session.update(session=transcription_session())
        await connection.input_audio_buffer.append(audio=b64(bytes(24_000 * 2)))  # 1 s
        await connection.input_audio_buffer.commit()
        await received.wait_for(lambda r: bool(r.of_type("error")), 10)
        [error] = received.of_type("error")
        assert error.error.code == "input_audio_buffer_commit_empty"
        pcm24 = pcm16_at(clip("en_jfk").samples()[: 16_000 * 2], 24_000)  # 2 s, in speech
        await connection.input_audio_buffer.append(audio=b64(pcm24))
        await connection.input_audio_buffer.commit()
        done = "conversation.item.input_audio_transcription.completed"
        await received.wait_for(lambda r: bool(r.of_type(done)), 10)
        [committed] = received.of_type("input_audio_buffer.committed")
        assert committed.item_id == received.of_type(done)[0].item_id
        assert len(received.of_type("error")) == 1
        await connection.close()
        await reader


async def test_openai_beta_flavour_from_a_browsers_subprotocol(server: AppServer) -> None:
    """A browser cannot set the OpenAI-Beta header: it offers the `openai-beta.realtime-v1`
    subprotocol instead, and gets the beta flavour."""
    async with connect(
        server.ws_url + "/v1/realtime?intent=transcription",
        additional_headers={"Authorization": f"Bearer {KEY}"},
        subprotocols=[Subprotocol("realtime"), Subprotocol("openai-beta.realtime-v1")],
    ) as ws:
        assert ws.subprotocol == "realtime"
        first = orjson.loads(await ws.recv())
    assert first["type"] == "transcription_session.created"


async def test_a_realtime_session_configuring_itself_holds_a_place_and_ends_on_drain() -> None:
    """A realtime socket that has not sent audio yet counts against the stream bound (a
    second stream is refused 503) and is closed 1012 with an `error` event when the
    server drains (before, it waited outside both until its idle limit)."""
    async with serve_app(max_sessions=1, idle_timeout_s=30.0) as app:
        async with connect(app.ws_url + "/v1/realtime?intent=transcription") as ws:
            assert orjson.loads(await ws.recv())["type"] == "session.created"
            status, _, _ = await refusal(app, "/v1/listen", {})
            assert status == 503
            drained = asyncio.create_task(app.state.registry.drain(5.0))
            messages = await drain(ws)
            await drained
        assert ws.close_code == 1012
        assert messages[-1]["type"] == "error"
        assert messages[-1]["error"]["code"] == "shutting_down"


class SlowFinals(FakeRecognizer):
    """Words that grow with the audio ("w1 w2 ...", one per 0.25 s: a partial's text is a
    prefix of its final's), and finals that take FINAL_S while partials run at once on
    the other worker: the next utterance's partials come before this one's final."""

    FINAL_S = 1.5

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: Callable[[], bool] | None = None
    ) -> list[Transcription]:
        if any(u.word_timings for u in batch):
            time.sleep(self.FINAL_S)
        return [
            dataclasses.replace(t, text=" ".join(f"w{i}" for i in range(len(u.audio) // 4000)))
            for u, t in zip(batch, super().transcribe(batch, should_stop), strict=True)
        ]


async def test_openai_overlapping_utterances_deltas_add_up_to_each_transcript() -> None:
    """The SDK streams JFK's four phrases while each final takes 1.5 s, so an utterance's
    deltas come before the previous one's final: concatenated per item, as OpenAI
    documents, the deltas give exactly each completed transcript (before, the previous
    item's deltas were sent again in full)."""
    done = "conversation.item.input_audio_transcription.completed"
    async with serve_app(serving(SlowFinals()), model_workers=2, idle_timeout_s=30.0) as app:
        client = openai_client(app.http_url)
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
            received = Received()
            reader = asyncio.create_task(receive_openai(connection, received))
            await connection.session.update(session=transcription_session())
            pcm24 = pcm16_at(clip("en_jfk").samples(), 24_000)
            step = 24_000 * 2 // 10  # 100 ms
            for offset in range(0, len(pcm24), step):
                await connection.input_audio_buffer.append(audio=b64(pcm24[offset : offset + step]))
                await asyncio.sleep(0.05)  # 2x real time
            await connection.input_audio_buffer.commit()
            await received.wait_for(lambda r: len(r.of_type(done)) >= 3, 30)
            await asyncio.sleep(2 * SlowFinals.FINAL_S)  # any last final
            await connection.close()
            await reader
    said: dict[str, str] = {}
    open_items: set[str] = set()  # items with deltas, not yet completed
    overlapped = False
    for event in received.messages:
        if event.type == "conversation.item.input_audio_transcription.delta":
            overlapped |= bool(open_items - {event.item_id})
            open_items.add(event.item_id)
            said[event.item_id] = said.get(event.item_id, "") + event.delta
        elif event.type == done:
            open_items.discard(event.item_id)
    completed = {e.item_id: e.transcript for e in received.of_type(done) if e.transcript}
    assert overlapped, "no delta of an item came before the previous item's final"
    assert {item: said.get(item, "") for item in completed} == completed


async def test_deepgram_stops_before_their_finals_keep_speech_final() -> None:
    """The SDK streams JFK while each final takes 1.5 s, so the next phrase's speech stop
    comes before this phrase's final: every final is still speech-final and followed by
    UtteranceEnd (before, a stop that came early was overwritten and lost)."""
    async with serve_app(serving(SlowFinals()), model_workers=2, idle_timeout_s=30.0) as app:
        client = deepgram_client(app.http_url, app.ws_url)
        async with client.listen.v1.connect(
            model="nova-3", encoding="linear16", sample_rate=16000, utterance_end_ms=1000
        ) as connection:
            received = Received()
            reader = asyncio.create_task(receive_deepgram(connection, received))
            pcm = clip("en_jfk").pcm16()
            for offset in range(0, len(pcm), 3200):
                await connection.send_media(pcm[offset : offset + 3200])
                await asyncio.sleep(0.05)  # 2x real time
            await connection.send_close_stream()
            await asyncio.wait_for(reader, 30)
    finals = [m for m in received.of_type("Results") if m.is_final]
    assert len(finals) >= 3
    assert all(m.speech_final for m in finals)
    assert len(received.of_type("UtteranceEnd")) == len(finals)


async def test_openai_session_update_of_another_shape_is_an_error_event(server: AppServer) -> None:
    """A `session.update` whose `audio`, `audio.input` or `audio.input.format` is not an
    object, or whose `eagerness` is not a string, gets an `error` event naming that field,
    and the session goes on (it ended 1011 with an AttributeError, or was dropped without
    a close frame: bench/fuzz_sessions.py seeds 20 and 2605)."""
    async with connect(
        server.ws_url + "/v1/realtime?intent=transcription",
        additional_headers={"Authorization": f"Bearer {KEY}"},
    ) as ws:
        assert orjson.loads(await ws.recv())["type"] == "session.created"
        shapes: list[tuple[dict[str, Any], str]] = [
            ({"audio": "x"}, "session.audio"),
            ({"audio": {"input": ["pcm16"]}}, "session.audio.input"),
            ({"audio": {"input": {"format": "pcm16"}}}, "session.audio.input.format"),
            (  # the socket was dropped without a close frame: TypeError, unhashable list
                {
                    "audio": {
                        "input": {"turn_detection": {"type": "semantic_vad", "eagerness": ["low"]}}
                    }
                },
                "session.audio.input.turn_detection.eagerness",
            ),
        ]
        for session, param in shapes:
            update = {"type": "session.update", "session": {"type": "transcription", **session}}
            await ws.send(orjson.dumps(update).decode())
            error = orjson.loads(await ws.recv())
            assert error["type"] == "error", error
            assert error["error"]["param"] == param
        await ws.send('{"type": "session.update", "session": {"type": "transcription"}}')
        assert orjson.loads(await ws.recv())["type"] == "session.updated"
