"""Server logging: client faults that uvicorn logs as server errors become warnings."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator

from server.logs import ClientFaultsAsWarnings, note_denial
from tests.support.appserver import serve_app
from tests.support.hardclient import RawText, bearer, exchange


def _record(message: str, *, exc: bool) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            b"\xff".decode()
        except UnicodeDecodeError:
            exc_info = sys.exc_info()
    return logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, message, (), exc_info)


def test_invalid_utf8_from_a_client_is_a_warning_without_traceback() -> None:
    """A client's invalid UTF-8 text frame is logged as one WARNING line, not an ERROR."""
    record = _record("Invalid UTF-8 sequence received from client.", exc=True)
    assert ClientFaultsAsWarnings().filter(record)
    assert record.levelno == logging.WARNING and record.levelname == "WARNING"
    assert record.exc_info is None


def test_other_errors_keep_their_level_and_traceback() -> None:
    """Anything else uvicorn logs at ERROR stays an ERROR with its traceback."""
    record = _record("Exception in ASGI application", exc=True)
    assert ClientFaultsAsWarnings().filter(record)
    assert record.levelno == logging.ERROR and record.exc_info is not None


def test_an_incomplete_handshake_is_dropped_only_after_a_denial() -> None:
    """uvicorn's "returned without completing handshake" stays an ERROR (the app's bug)
    unless this connection's app refused it with a denial response."""
    message = "ASGI callable returned without completing handshake."
    assert ClientFaultsAsWarnings().filter(record := _record(message, exc=False))
    assert record.levelno == logging.ERROR

    def after_denial() -> bool:
        note_denial()
        return ClientFaultsAsWarnings().filter(_record(message, exc=False))

    assert contextvars.copy_context().run(after_denial) is False


@contextlib.contextmanager
def server_log() -> Iterator[list[logging.LogRecord]]:
    """The WARNING and higher records that the server's log handler (its filters) lets
    through while the block runs."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(logging.WARNING)
    handler.addFilter(ClientFaultsAsWarnings())
    logging.getLogger().addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger().removeHandler(handler)


async def test_refused_sockets_log_no_errors() -> None:
    """Under real uvicorn, sockets refused for their Origin or credentials (4403/4401 on
    protocol v1, HTTP 403/401 on the compat endpoints) log nothing at WARNING or above;
    invalid UTF-8 from a client logs one WARNING without a traceback."""
    key = "k" * 20
    async with serve_app(api_keys=f"acme:{key}", allowed_origins="https://app.example") as app:
        stream = f"{app.ws_url}/v1/meetings/m-logs/stream?participant=p"
        listen = f"{app.ws_url}/v1/listen?encoding=linear16&sample_rate=16000"
        realtime = f"{app.ws_url}/v1/realtime?intent=transcription"
        evil = "https://evil.example"
        with server_log() as records:
            refused = [
                await exchange(stream, headers=bearer(key), origin=evil),
                await exchange(stream, headers=bearer("x" * 20)),
                await exchange(listen, headers={"Authorization": f"Token {key}"}, origin=evil),
                await exchange(listen, headers={"Authorization": f"Token {'x' * 20}"}),
                await exchange(realtime, headers=bearer("x" * 20)),
            ]
            await asyncio.sleep(0.2)  # uvicorn logs after the app returns
            assert [r.close_code for r in refused] == [4403, 4401, -403, -401, -401]
            assert records == []
            garbled = await exchange(stream, [RawText(b"\xff\xfe")], headers=bearer(key))
            async with asyncio.timeout(10):  # logged after the app returns: however late
                while not records:  # noqa: ASYNC110 - a log handler, no event
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # room for a second record, which would be a fault
    assert garbled.close_code == 1007
    assert [(r.levelname, r.msg, r.exc_info) for r in records] == [
        ("WARNING", "Invalid UTF-8 sequence received from client.", None)
    ]
