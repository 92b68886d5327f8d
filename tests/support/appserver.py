"""The real Parley app under uvicorn in the test's own event loop, with a fake engine:
seconds to start, no model to load, so each test can have the settings it needs."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn

from bench.fake_recognizer import FakeRecognizer
from engine.recognizer import Recognizer
from server.__main__ import uvicorn_config
from server.app import create_app
from server.settings import Settings
from server.state import AppState
from tests.support.timeouts import REPLY_TIMEOUT, START_TIMEOUT


@dataclass
class AppServer:
    port: int
    state: AppState

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = REPLY_TIMEOUT,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request, off the event loop (the server shares it)."""
        data = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body)

        def call() -> tuple[int, dict[str, str], bytes]:
            req = urllib.request.Request(
                self.http_url + path, data=data, method=method, headers=headers or {}
            )
            try:
                with urllib.request.urlopen(req, timeout=timeout) as response:
                    return response.status, dict(response.headers), response.read()
            except urllib.error.HTTPError as exc:
                return exc.code, dict(exc.headers), exc.read()

        return await asyncio.to_thread(call)


def serving(recognizer: Recognizer) -> Callable[[Settings], Recognizer]:
    """A recognizer factory for `serve_app` that hands out this one recognizer."""
    return lambda settings: recognizer


@contextlib.asynccontextmanager
async def serve_app(
    recognizer: Callable[[Settings], Recognizer] = lambda s: FakeRecognizer(),
    /,
    **settings: Any,
) -> AsyncIterator[AppServer]:
    """Serve `create_app(Settings(**settings))` on a free loopback port until the block ends.
    The port is bound here and handed to uvicorn: picking a free port and binding it later
    leaves a moment in which another process on a busy machine can take it."""
    listening = socket.socket()
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(("127.0.0.1", 0))
    port: int = listening.getsockname()[1]
    config_settings = Settings.from_env({}, port=port, **{"static_dir": "/nonexistent", **settings})
    app = create_app(config_settings, recognizer)
    server = uvicorn.Server(uvicorn_config(app, config_settings, host="127.0.0.1"))
    serving = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        async with asyncio.timeout(START_TIMEOUT):
            # uvicorn has no started event; its own tests/utils.py run_server polls this flag
            while not server.started:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            state: AppState = app.state.parley
            assert state.loader is not None
            await state.loader
        yield AppServer(port, state)
    finally:
        server.should_exit = True
        await serving
