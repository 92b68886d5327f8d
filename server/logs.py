"""Structured logging: one JSON object per line (or plain text), tracebacks included."""

from __future__ import annotations

import logging
import re
import sys
import time
from contextvars import ContextVar
from typing import Any

import orjson

# Attributes every LogRecord has; anything else was passed through `extra=` and is logged.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


_SECRET_PARAM = re.compile(r"((?:access_token|resume_token)=)[^&\s\"']+")


class RedactTokens(logging.Filter):
    """Blank credentials in query strings (uvicorn logs each WebSocket's path and query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _SECRET_PARAM.sub(r"\1…", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


# Client faults that uvicorn's websockets-sansio implementation logs at ERROR with a
# traceback, though it handles them as the protocol says (closing 1007). They are the
# client's error, not the server's: one WARNING line each, no traceback.
_CLIENT_FAULTS = frozenset({"Invalid UTF-8 sequence received from client."})


# After the app refuses a WebSocket with an HTTP denial response (the compat endpoints'
# 401/403), the sans-I/O implementation logs this at ERROR: it never marks such a handshake
# complete (Kludex/uvicorn#3138). uvicorn has already logged the refusal with its status at
# INFO, as it does every refusal; this line says nothing more, so it is dropped. Without a
# denial it is the app's bug and stays an ERROR.
_INCOMPLETE_HANDSHAKE = "ASGI callable returned without completing handshake."
_denied: ContextVar[bool] = ContextVar("parley_websocket_denied", default=False)


def note_denial() -> None:
    """Record that this connection's app refused it with an HTTP denial response. uvicorn
    runs each connection's app in a task of its own, whose context this marks."""
    _denied.set(True)


class ClientFaultsAsWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "uvicorn.error":
            return True
        if record.msg in _CLIENT_FAULTS:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return not (record.msg == _INCOMPLETE_HANDSHAKE and _denied.get())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactTokens())
    handler.addFilter(ClientFaultsAsWarnings())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
