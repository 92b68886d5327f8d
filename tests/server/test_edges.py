"""Edges of the server's front door on the in-process app, authentication off (a
developer's machine): which pages may open sockets, and refusals whose reasons carry
what the client sent."""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
from collections.abc import AsyncIterator
from urllib.parse import quote

import pytest
from starlette.applications import Starlette
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from server.__main__ import WS_IMPLEMENTATION, uvicorn_config
from server.limits import ALL
from server.settings import Settings
from server.sockets.gate import MAX_CLOSE_REASON, close_reason
from store.errors import UnknownResumeToken
from store.records import hash_token
from tests.support.appserver import AppServer, serve_app
from tests.support.hardclient import STOP, error_of, exchange
from tests.support.httpclient import multipart, post_form


@pytest.fixture(scope="module")
async def app() -> AsyncIterator[AppServer]:
    """Authentication off, nothing configured: the embedded defaults, but quick pings."""
    async with serve_app(ws_ping_interval_s=0.3, ws_ping_timeout_s=0.3) as server:
        yield server


async def test_a_page_on_the_web_cannot_open_sockets_with_authentication_off(
    app: AppServer,
) -> None:
    """Any site a developer visits could otherwise stream into or listen to their local
    server: a foreign Origin is refused 4403 on both routes; the server's own page and
    pages on loopback hosts pass; clients without an Origin (bots) pass."""
    stream = f"{app.ws_url}/v1/meetings/origins/stream"
    events = f"{app.ws_url}/v1/meetings/origins/events"
    for url in (stream, events):
        evil = await exchange(url, [STOP], origin="https://evil.example")
        assert evil.close_code == 4403, (url, evil.messages)
        assert "PARLEY_ALLOWED_ORIGINS" in error_of(evil)["message"]  # type: ignore[index]
    for origin in (app.http_url, "http://localhost:5173", None):
        ok = await exchange(stream, [STOP], origin=origin)
        assert ok.close_code == 1000, (origin, ok.messages)
        listening = await exchange(events, origin=origin, linger=0.2)
        assert listening.close_code not in (4403, None), (origin, listening.messages)


async def test_refusal_echoing_non_ascii_input_still_closes_with_its_code(app: AppServer) -> None:
    """A bad `language` of 100 'é' is echoed in the refusal: the close reason is cut to
    123 bytes of UTF-8 (not 120 characters, 200 bytes), so the client gets 4400."""
    url = f"{app.ws_url}/v1/meetings/accents/stream?language={quote('é' * 100)}"
    result = await exchange(url, [STOP])
    assert result.close_code == 4400, (result.close_code, result.messages)
    assert error_of(result)["code"] == "bad_config"  # type: ignore[index]
    assert len(result.close_reason.encode()) <= MAX_CLOSE_REASON


def test_close_reason_keeps_whole_characters() -> None:
    """Reasons are cut on a character boundary, whatever the width of the characters."""
    for text in ("a" * 200, "é" * 200, "😀" * 200, "a" + "😀" * 40):
        cut = close_reason(text)
        assert len(cut.encode()) <= MAX_CLOSE_REASON and cut.endswith("...")
        assert text.startswith(cut[:-3])
    assert close_reason("short") == "short"


def test_production_and_tests_run_one_websocket_implementation() -> None:
    """`python -m server` and the tests' servers take uvicorn's config from one function:
    the sans-I/O websockets implementation (not the deprecated legacy one), keepalive
    pings from the settings."""
    config = uvicorn_config(Starlette(), Settings.from_env({}, ws_ping_interval_s=7.0))
    config.load()  # imports the protocol class: the legacy one warns (an error here)
    assert config.ws == WS_IMPLEMENTATION == "websockets-sansio"
    assert config.ws_protocol_class is WebSocketsSansIOProtocol
    assert (config.ws_ping_interval, config.ws_ping_timeout) == (7.0, 20.0)
    assert config.ws_max_size == 4 * Settings().streams.max_frame_bytes


async def test_a_half_open_listener_is_dropped_by_keepalive_pings(app: AppServer) -> None:
    """A listener whose peer completed the handshake and then went silent (no reads, no
    pongs, no close) is dropped after the ping interval and timeout, freeing its slot."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            "GET /v1/meetings/half-open/events HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{app.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    assert (await reader.readline()).startswith(b"HTTP/1.1 101")
    total = app.state.listener_slots.total
    try:
        async with asyncio.timeout(5):
            while total.held(ALL) == 0:  # noqa: ASYNC110 - a counter, no event
                await asyncio.sleep(0.01)
            started = asyncio.get_running_loop().time()
            while total.held(ALL) == 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert asyncio.get_running_loop().time() - started < 2.0
    finally:
        writer.transport.abort()


async def test_ids_with_a_trailing_newline_are_refused(app: AppServer) -> None:
    """`ana%0A` must not reach store keys, logs or SRT labels: a participant, a meeting id
    in the path, a transcript read and an upload field with a trailing newline are all
    refused as bad ids (4400 / 400), and a resume token with one is malformed."""
    streams = {
        "participant": f"{app.ws_url}/v1/meetings/newline/stream?participant=ana%0A",
        "meeting": f"{app.ws_url}/v1/meetings/newline%0A/stream?participant=ana",
        "listener": f"{app.ws_url}/v1/meetings/newline%0A/events",
    }
    for what, url in streams.items():
        result = await exchange(url, [STOP], timeout=10)  # refused however slowly
        assert result.close_code == 4400, (what, result.close_code, result.messages)
    status, _, body = await app.request("GET", "/v1/meetings/newline%0A/transcript")
    assert status == 400, body
    content_type, pieces = multipart(b"RIFF", "x.wav", participant="ana\n")
    upload = await post_form(app.http_url, content_type, pieces)
    assert upload.status == 400 and upload.json()["error"]["code"] == "bad_config", upload.body
    token = secrets.token_urlsafe(32)
    hash_token(token)
    with pytest.raises(UnknownResumeToken, match="malformed"):
        hash_token(token + "\n")
