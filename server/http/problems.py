"""One HTTP error path. Route handlers raise; the handlers here, installed on the app as
Starlette's `exception_handlers`, render every refusal the same way: the status, a JSON
body `{"error": {"code", "message"}}`, and the headers the refusal calls for
(`WWW-Authenticate` on a 401, `Retry-After` where trying again later helps).

- `ProtocolError` (wire/): the HTTP form of a socket's refusal; a 4xxx close code is its
  HTTP status less 4000, 1013 is 503, anything else 400.
- `Refusal` (an upload's or an enrollment's): its own status and code.
- `StoreError` (the store cannot be reached), `JobsFull` (no room for another upload):
  503 `overloaded`, retry later.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.limits import overloaded
from server.uploads.decode_worker import Refusal
from server.uploads.jobs import JobsFull
from store.errors import StoreError
from wire.codes import CloseCode
from wire.errors import ProtocolError


def problem(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one body of every HTTP refusal."""
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def refusal(error: ProtocolError) -> JSONResponse:
    """The HTTP form of a refusal: 4xxx close codes mirror their HTTP status."""
    close = int(error.close_code)
    status = close - 4000 if close >= 4000 else 503 if close == CloseCode.TRY_AGAIN_LATER else 400
    response = problem(status, error.code.value, error.message)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="parley"'
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(round(error.retry_after))
    return response


async def _on_protocol_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProtocolError)
    return refusal(exc)


async def _on_refusal(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refusal)
    return problem(exc.status, exc.code, exc.message, exc.headers)


async def _on_jobs_full(request: Request, exc: Exception) -> Response:
    return refusal(overloaded(str(exc)))


async def _on_store_error(request: Request, exc: Exception) -> Response:
    return refusal(overloaded(f"store: {exc}"))


EXCEPTION_HANDLERS = {
    ProtocolError: _on_protocol_error,
    Refusal: _on_refusal,
    StoreError: _on_store_error,
    JobsFull: _on_jobs_full,
}
