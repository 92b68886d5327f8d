"""Server logging: client faults that uvicorn logs as server errors become warnings."""

from __future__ import annotations

import logging
import sys

from server.logs import ClientFaultsAsWarnings


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
