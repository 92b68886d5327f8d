"""`python -m server`: run Parley under uvicorn with graceful drain.

uvicorn closes every WebSocket with 1012 the moment it starts shutting down, before the
application's lifespan can act. This entry point drains the sessions first (each sends
its last finals and `session.ended`, then closes 1012), then lets uvicorn shut down.

`uvicorn_config()` is the one place uvicorn is configured; the tests' in-process servers
use it too, so they run the WebSocket implementation production runs.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from engine.memory import fix_mmap_threshold
from server.app import RecognizerFactory, create_app, drain, whisper_recognizer
from server.logs import configure
from server.settings import Settings
from server.state import AppState
from server.uploads.sandbox import SandboxUnavailable

# uvicorn's sans-I/O implementation over the websockets library: what `--ws auto` picks,
# and what `--ws websockets` will point at (the legacy implementation is deprecated). It
# pauses reading until the app takes each message (a client cannot queue frames in the
# server), waits for the transport to drain before each send (a slow reader pushes back on
# the writer, which the outbox turns into 1008 slow_consumer), and pings idle peers.
WS_IMPLEMENTATION = "websockets-sansio"


def uvicorn_config(app: Starlette, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for `settings`: WebSocket implementation, frame size,
    keepalive pings (a half-open peer is dropped after ping interval + timeout)."""
    options: dict[str, Any] = {
        "host": settings.server.host,
        "port": settings.server.port,
        "ws": WS_IMPLEMENTATION,
        "ws_max_size": settings.streams.max_frame_bytes * 4,  # the app refuses > max_frame_bytes
        "ws_per_message_deflate": False,
        "ws_ping_interval": settings.streams.ws_ping_interval_s,
        "ws_ping_timeout": settings.streams.ws_ping_timeout_s,
        # The app reads X-Forwarded-For itself (server/auth/access.py ProxyHeaders: it must know
        # a forwarded address from the socket's peer); uvicorn's own rewrite would hide it.
        "proxy_headers": False,
        "lifespan": "on",
        "log_config": None,
        "timeout_graceful_shutdown": int(settings.server.drain_timeout_s) + 5,
    }
    return uvicorn.Config(app, **{**options, **overrides})


class ParleyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises a captured signal after shutdown, so the process would report
        # "killed by SIGTERM", or print a KeyboardInterrupt traceback after Ctrl-C. A
        # drained shutdown is an orderly exit, however it was asked for: status 0.
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._captured_signals.remove(sig)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state: AppState | None = getattr(self.app.state, "parley", None)
        if state is not None and state.settings.server.drain_grace_s > 0:
            # /readyz says 503 draining while the balancer's health check notices; new
            # streams get 1013, the open ones go on.
            state.registry.start_draining()
            await asyncio.sleep(state.settings.server.drain_grace_s)
        for server in self.servers:  # stop accepting before the drain
            server.close()
        if state is not None:
            await drain(state)
        await super().shutdown(sockets)


def _parser() -> argparse.ArgumentParser:
    sections = [
        f"{title}:\n"
        + "\n".join(
            f"  {name:<34} {meaning} (default: {default or 'unset'})"
            for name, default, meaning in rows
        )
        for title, rows in Settings.describe_groups()
    ]
    epilog = "environment variables (read once at start), by group:\n\n" + "\n\n".join(sections)
    parser = argparse.ArgumentParser(
        prog="python -m server",
        description="Parley: real-time meeting transcription server.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", help="overrides PARLEY_HOST")
    parser.add_argument("--port", type=int, help="overrides PARLEY_PORT")
    return parser


def main(argv: list[str] | None = None, recognizer: RecognizerFactory = whisper_recognizer) -> int:
    """Serve until SIGTERM; `recognizer` builds the engine (benchmarks pass a stand-in)."""
    args = _parser().parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        settings = Settings.from_env(**overrides)
    except ValueError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    configure(settings.server.log_level, settings.server.log_format)
    if settings.server.malloc_mmap_threshold_kb > 0:  # before the app makes its buffers
        fix_mmap_threshold(settings.server.malloc_mmap_threshold_kb * 1024)
    try:
        app = create_app(settings, recognizer)
    except (ValueError, OSError, SandboxUnavailable) as exc:  # keys, keys file, sandbox
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    server = ParleyServer(uvicorn_config(app, settings), app)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
