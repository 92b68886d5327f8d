"""Edges of the server's front door on the in-process app, authentication off (a
developer's machine): which pages may open sockets, and refusals whose reasons carry
what the client sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import pytest

from server.gate import MAX_CLOSE_REASON, close_reason
from tests.appserver import AppServer, serve_app
from tests.hardclient import STOP, error_of, exchange


@pytest.fixture(scope="module")
async def app() -> AsyncIterator[AppServer]:
    """Authentication off, nothing configured: the embedded defaults."""
    async with serve_app() as server:
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
