"""Deepgram's error answers: a refused `/v1/listen` handshake (HTTP status, `dg-error`
and `dg-request-id` headers, a JSON body, as Deepgram gives them) and the `Error` message
that comes before a close."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from server.compat.bridge import http_status
from wire.errors import ProtocolError


def denial(request_id: str) -> Any:
    """The HTTP answer to a refused handshake, as Deepgram gives it: `dg-error` and
    `dg-request-id` headers, and a JSON body."""

    def respond(error: ProtocolError) -> Response:
        body = {"err_code": error.code.value, "err_msg": error.message, "request_id": request_id}
        reason = error.message.encode("ascii", "backslashreplace").decode()[:200]
        headers = {"dg-error": reason, "dg-request-id": request_id}  # headers are latin-1
        if error.retry_after is not None:
            headers["retry-after"] = str(round(error.retry_after))
        return Response(
            orjson.dumps(body), http_status(error), headers, media_type="application/json"
        )

    return respond


def error_message(code: str, description: str) -> str:
    return orjson.dumps({"type": "Error", "variant": code, "description": description}).decode()


def farewell(error: ProtocolError) -> str:
    return error_message(error.code.value, error.message)
