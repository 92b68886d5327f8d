"""Client helpers for the hardening tests: open a socket with given credentials, send
frames, collect what comes back until the close."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.wsclient import StreamResult, receive_all

STOP = orjson.dumps({"type": "stop"}).decode()
SEND_TIMEOUT = 1.0  # seconds one frame may take to go out


@dataclass(frozen=True)
class RawText:
    """Bytes sent as a text frame as they are (invalid UTF-8 included)."""

    data: bytes


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def exchange(
    url: str,
    frames: Sequence[bytes | str | RawText] = (),
    *,
    headers: dict[str, str] | None = None,
    subprotocols: Sequence[str] | None = None,
    origin: str | None = None,
    timeout: float = 20.0,
    linger: float | None = None,
    until: Callable[[StreamResult], bool] | None = None,
) -> StreamResult:
    """Connect, send `frames`, and collect every message until the server closes (or,
    with `linger`, for that many seconds, then close). With `until`, first wait (up to
    `timeout`) until what arrived satisfies it or the server closed, then linger: a fixed
    wait alone is too short for what a loaded machine takes to arrive."""
    result = StreamResult()
    try:
        ws = await connect(
            url,
            additional_headers=headers,
            subprotocols=list(subprotocols) if subprotocols else None,  # type: ignore[arg-type]
            origin=origin,  # type: ignore[arg-type]
            max_size=None,
            open_timeout=timeout,
            close_timeout=1.0,  # a server that stopped reading mid-frame cannot answer a close
        )
    except InvalidStatus as exc:
        result.close_code = -exc.response.status_code  # refused at upgrade: -HTTP status
        return result
    try:
        receiver = asyncio.create_task(receive_all(ws, result))
        for frame in frames:
            if receiver.done():
                break
            try:
                async with asyncio.timeout(SEND_TIMEOUT):
                    if isinstance(frame, RawText):
                        await ws.send(frame.data, text=True)
                    else:
                        await ws.send(frame)
            except TimeoutError:  # the server stopped reading (it refused this frame)
                ws.transport.abort()
                break
            except Exception:  # the server closed while we were sending
                break
        if until is not None:
            async with asyncio.timeout(timeout):
                await result.wait_for(lambda r: until(r) or r.close_code is not None)
        if linger is None:
            await asyncio.wait_for(receiver, timeout)
        else:
            done, _ = await asyncio.wait({receiver}, timeout=linger)
            if not done:
                await ws.close()
                await asyncio.wait_for(receiver, timeout)
    finally:
        # CPython 3.11 asyncio: abort() on a transport whose close flushed a big write
        # later raises AttributeError (its loop is gone); the connection is over anyway.
        with contextlib.suppress(AttributeError):
            await ws.close()
    return result


def error_of(result: StreamResult) -> dict[str, Any] | None:
    errors = result.of_type("error")
    return errors[-1] if errors else None
