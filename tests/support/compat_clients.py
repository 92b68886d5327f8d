"""The vendors' official SDKs pointed at a Parley server, for the compat tests.

deepgram-sdk's async client still speaks through `websockets.legacy`, which warns on
import and on use: the compat test modules ignore exactly those DeprecationWarnings
(WEBSOCKETS_LEGACY), and the SDK is imported here under the same filter, since a module
imported at collection time is outside any test's marks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import orjson
import pytest
import soxr
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

WEBSOCKETS_LEGACY = pytest.mark.filterwarnings(
    r"ignore:websockets\..* is deprecated:DeprecationWarning"
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"websockets\..* is deprecated", DeprecationWarning)
    from deepgram import AsyncDeepgramClient
    from deepgram.core.api_error import ApiError
    from deepgram.environment import DeepgramClientEnvironment
    from openai import AsyncOpenAI
    from openai.types.realtime import RealtimeTranscriptionSessionCreateRequestParam
    from openai.types.realtime import (
        realtime_transcription_session_audio_input_turn_detection_param as turn_detection,
    )

__all__ = ["ApiError", "AsyncOpenAI"]


def deepgram_client(http_url: str, ws_url: str, api_key: str = "unused") -> AsyncDeepgramClient:
    environment = DeepgramClientEnvironment(
        base=http_url, production=ws_url, agent=ws_url, agent_rest=http_url
    )
    return AsyncDeepgramClient(api_key=api_key, environment=environment)


def openai_client(http_url: str, api_key: str = "sk-unused") -> AsyncOpenAI:
    """The GA realtime client derives ws:// from base_url; the beta one needs it given."""
    ws_url = "ws" + http_url.removeprefix("http")
    return AsyncOpenAI(
        api_key=api_key,
        base_url=http_url + "/v1",
        websocket_base_url=ws_url + "/v1",
        max_retries=0,
    )


@dataclass
class Received:
    """What a socket received (as the SDK parsed it), and how it closed."""

    messages: list[Any] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None
    error: BaseException | None = None

    def of_type(self, kind: str) -> list[Any]:
        return [m for m in self.messages if getattr(m, "type", None) == kind]

    async def wait_for(self, predicate: Callable[[Received], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self.arrived.clear()
                await self.arrived.wait()


async def receive_deepgram(connection: Any, into: Received) -> None:
    """Read a Deepgram SDK connection until it closes (by any code)."""
    try:
        async for message in connection:
            into.messages.append(message)
            into.arrived.set()
    except Exception as exc:  # the SDK raises the websockets close error as it is
        into.error = exc
    into.close_code = connection._websocket.close_code
    into.arrived.set()


async def receive_openai(connection: Any, into: Received) -> None:
    try:
        async for event in connection:
            into.messages.append(event)
            into.arrived.set()
    except Exception as exc:
        into.error = exc
    into.close_code = connection._connection.close_code
    into.arrived.set()


def pcm16_at(samples: np.ndarray[Any, Any], rate: int) -> bytes:
    """16 kHz float samples as PCM16 at `rate`."""
    if rate != 16_000:
        samples = soxr.resample(samples, 16_000, rate)
    return bytes((np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes())


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def drain(ws: ClientConnection) -> list[Any]:
    """Every JSON message a raw websockets client receives until the close (any code)."""
    messages: list[Any] = []
    with contextlib.suppress(ConnectionClosed):
        async for raw in ws:
            messages.append(orjson.loads(raw))
    return messages


def transcription_session(**vad: Any) -> RealtimeTranscriptionSessionCreateRequestParam:
    """A GA `session.update` session: PCM16 at 24 kHz, English, server VAD."""
    return {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": cast(turn_detection.ServerVad, {"type": "server_vad", **vad}),
            }
        },
    }
