"""ProtocolError: bad input from a client, with the `error` code and the close code (or,
on HTTP, the status) the server answers with."""

from __future__ import annotations

from wire import build
from wire.codes import CloseCode, ErrorCode
from wire.messages import ErrorMessage


class ProtocolError(Exception):
    """Bad input from a client. Carries the `error` code and the close code to use."""

    def __init__(
        self,
        code: ErrorCode,
        close_code: CloseCode,
        message: str,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.close_code = close_code
        self.message = message
        self.retry_after = retry_after  # seconds a client should wait before retrying

    def to_message(self) -> ErrorMessage:
        return build.error(self.code, self.message, retry_after=self.retry_after)
