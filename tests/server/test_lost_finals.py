"""No silent loss: a final that is neither logged nor sent is counted in the close and in
`session.ended` (`finals_lost`), at shutdown (1012) and after the commit timeout (1013)."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect

from bench.fake_recognizer import FakeRecognizer
from server.app import drain
from server.settings import Settings
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP
from tests.support.wsclient import BYTES_PER_SECOND, StreamResult, receive_all, stream_url

PHRASE = 3 * BYTES_PER_SECOND  # "And so my fellow Americans," then a pause


def held() -> FakeRecognizer:
    """The fake engine with every batch held until the test releases it (it never does)."""
    return FakeRecognizer(gated=True)


async def test_shutdown_with_a_final_held_says_how_many_were_lost() -> None:
    """A final waits on a batch that does not end before the drain timeout: the server
    stops the engine, and the client gets `session.ended` (`shutdown`, `finals_lost` 1)
    and close 1012, not 1011 and not a bare close."""
    recognizer = held()

    def engine(settings: Settings) -> FakeRecognizer:
        return recognizer

    async with serve_app(engine, drain_timeout_s=1.0) as server:
        result = StreamResult()
        url = stream_url(server.ws_url, "shutdown", participant="ana", interim_results=False)
        async with connect(url) as ws:
            receiving = asyncio.create_task(receive_all(ws, result))
            await ws.send(clip("en_jfk").pcm16()[:PHRASE] + bytes(BYTES_PER_SECOND))
            await asyncio.wait_for(asyncio.to_thread(recognizer.entered.wait, 5), 6)
            await drain(server.state)  # what SIGTERM does first (server/__main__.py)
            await asyncio.wait_for(receiving, 5)
    ended = result.messages[-1]
    assert result.close_code == 1012, (result.close_code, result.messages[-2:])
    assert ended["type"] == "session.ended" and ended["reason"] == "shutdown"
    assert ended["finals_lost"] == 1 and ended["finals"] == 0 and ended["utterances"] == 1
    assert "1 finals lost" in result.close_reason


async def test_stop_past_the_commit_timeout_says_how_many_were_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After `stop`, the last final does not come within the commit timeout: the client
    gets `session.ended` with `finals_lost` 1, an `error` `overloaded` and close 1013 (it
    resumes to get the final), not a clean 1000."""
    monkeypatch.setattr("session.actor.COMMIT_TIMEOUT", 0.5)
    recognizer = held()

    def engine(settings: Settings) -> FakeRecognizer:
        return recognizer

    async with serve_app(engine) as server:
        result = StreamResult()
        url = stream_url(server.ws_url, "timeout", participant="ana", interim_results=False)
        async with connect(url) as ws:
            receiving = asyncio.create_task(receive_all(ws, result))
            await ws.send(clip("en_jfk").pcm16()[:PHRASE])
            await ws.send(STOP)
            await asyncio.wait_for(receiving, 5)
        recognizer.release()
    assert result.close_code == 1013, (result.close_code, result.messages[-2:])
    ended = next(m for m in result.messages if m["type"] == "session.ended")
    assert ended["finals_lost"] == 1 and ended["finals"] == 0
    error = result.messages[-1]
    assert error["type"] == "error" and error["code"] == "overloaded"
    assert "1 finals lost" in error["message"]
