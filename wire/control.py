"""Client → server JSON text frames: the control messages and the `auth` message.
(Audio only ever travels in binary frames.)"""

from __future__ import annotations

import enum
import math
from typing import Any

import orjson

from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError


class ControlType(enum.StrEnum):
    FINALIZE = "finalize"  # flush the current utterance now
    STOP = "stop"  # flush, send every final, then `session.ended`, close 1000
    KEEPALIVE = "keepalive"
    AUTH = "auth"  # credentials as the first message; a no-op once authenticated
    CONFIGURE = "configure"  # {"keyterms": [...]}: replace the stream's keyterms
    # A resumed stream's first message, before its audio: `{"type": "resend", "from": S}`,
    # the client re-sends its audio from second S (`send_from` ≤ S ≤ `resume_from`).
    RESEND = "resend"


def control_message(kind: ControlType) -> str:
    """The text frame a client sends for a control message without fields."""
    return orjson.dumps({"type": kind.value}).decode()


def parse_control(text: str) -> ControlType:
    """Parse a JSON text frame into a control message type, or raise ProtocolError."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE, CloseCode.INVALID_PAYLOAD, f"text frame is not JSON: {exc}"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            CloseCode.INVALID_PAYLOAD,
            'a text frame must be a JSON object with a string "type"',
        )
    try:
        return ControlType(data["type"])
    except ValueError:
        known = ", ".join(t.value for t in ControlType)
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            CloseCode.INVALID_PAYLOAD,
            f"unknown message type {data['type'][:64]!r}; expected one of: {known}",
        ) from None


def parse_resend(text: str) -> float:
    """The `from` of a `resend` frame (finite seconds, ≥ 0), or raise ProtocolError."""
    data: Any = orjson.loads(text)  # parse_control has accepted it as a JSON object
    number = finite_number(data.get("from"))
    if number is None or number < 0:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            CloseCode.INVALID_PAYLOAD,
            'a resend message needs "from": the second its audio starts at (>= 0)',
        )
    return number


def finite_number(value: object) -> float | None:
    """`value` as a finite float; None if it is no number (a bool is none), NaN, ±inf or
    too large for a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def parse_auth(text: str | None) -> str | None:
    """The token of an `{"type": "auth", "token": "..."}` frame; None if `text` is not one."""
    try:
        data: Any = orjson.loads(text) if text is not None else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("type") != ControlType.AUTH.value:
        return None
    token = data.get("token")
    return token if isinstance(token, str) else None
