"""Wire protocol v1: every message the server sends or accepts, and the close codes.

The contract lives in docs/protocol.md; this module is its executable form. Messages are
plain dicts typed as TypedDicts so they serialise with orjson as they are. Audio only ever
travels in binary frames; JSON text frames carry control messages.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import orjson

PROTOCOL_VERSION = 1
SAMPLE_RATE = 16_000  # the model's rate; every stream is resampled to it
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 48_000

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses. 4xxx mirror the HTTP status of the cause."""

    NORMAL = 1000  # `stop` finished, or the client closed
    GOING_AWAY = 1001
    UNSUPPORTED_DATA = 1003  # a binary frame on a listener socket, or text where audio belongs
    INVALID_PAYLOAD = 1007  # odd byte count for s16, NaN/Inf floats, bad JSON
    POLICY_VIOLATION = 1008  # control message illegal in this state
    MESSAGE_TOO_BIG = 1009  # frame over `max_frame_bytes`
    INTERNAL_ERROR = 1011  # a bug or an engine failure; the session is over, the server is not
    SERVICE_RESTART = 1012  # the server is shutting down; reconnect (and resume) elsewhere
    TRY_AGAIN_LATER = 1013  # at capacity; retry with backoff
    BAD_REQUEST = 4400  # bad query parameters (encoding, sample rate, ids)
    UNAUTHORIZED = 4401  # no, a bad, a used or an expired credential; or none in time
    FORBIDDEN = 4403  # another tenant's meeting, an Origin not allowed, a token for elsewhere
    NOT_FOUND = 4404  # unknown meeting or resume token
    TIMEOUT = 4408  # idle too long without audio or keepalive
    CONFLICT = 4409  # resume of a source that is still connected
    MAX_DURATION = 4413  # the stream reached PARLEY_MAX_SESSION_S (its finals were all sent)
    TOO_MANY_REQUESTS = 4429  # a quota: streams per key, listeners per meeting


class ErrorCode(enum.StrEnum):
    """Machine-readable `code` of an `error` message."""

    BAD_CONFIG = "bad_config"
    INVALID_AUDIO = "invalid_audio"
    INVALID_MESSAGE = "invalid_message"
    FRAME_TOO_LARGE = "frame_too_large"
    UNSUPPORTED_DATA = "unsupported_data"
    OVERLOADED = "overloaded"
    SLOW_CONSUMER = "slow_consumer"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"
    UNAUTHORIZED = "unauthorized"
    TIMEOUT = "timeout"
    CONFLICT = "conflict"
    MAX_DURATION = "max_duration"
    QUOTA_EXCEEDED = "quota_exceeded"


class Encoding(enum.StrEnum):
    PCM_S16LE = "pcm_s16le"
    PCM_F32LE = "pcm_f32le"

    @property
    def sample_width(self) -> int:
        return 2 if self is Encoding.PCM_S16LE else 4


# ---------------------------------------------------------------- server → client


class Word(TypedDict):
    word: str
    start: float
    end: float


class Timing(TypedDict):
    """Server-side latency breakdown of one final, in seconds."""

    queue: float
    inference: float
    total: float  # from the end of the utterance's audio arriving to the final being sent


class SessionStarted(TypedDict):
    type: Literal["session.started"]
    protocol: int
    session_id: str
    meeting_id: str
    participant: str
    config: dict[str, Any]
    resume_token: str
    resume_from: float  # seconds of audio the client must (re)send from; 0.0 on a new stream
    resumed: bool  # this connection continues an earlier one of the same source
    last_seq: int  # highest `seq` of the meeting when the session started


class SessionLanguage(TypedDict):
    """A `language=auto` stream's language, pinned once (v1 extension)."""

    type: Literal["session.language"]
    language: str
    # The model's probability of `language` over the utterances it was detected from;
    # None when it was not detected on this connection (an English-only model, a resume).
    probability: float | None
    utterances: int  # how many of the source's utterances it was detected from


class SpeechStarted(TypedDict):
    type: Literal["vad.speech_started"]
    t: float


class SpeechStopped(TypedDict):
    type: Literal["vad.speech_stopped"]
    t: float


class TranscriptPartial(TypedDict):
    type: Literal["transcript.partial"]
    utterance_id: str
    participant: str
    text: str
    start: float
    end: float


class TranscriptFinal(TypedDict):
    type: Literal["transcript.final"]
    utterance_id: str
    seq: int
    participant: str
    text: str
    start: float
    end: float
    language: str
    words: NotRequired[list[Word]]
    timing: NotRequired[Timing]


class ErrorMessage(TypedDict):
    type: Literal["error"]
    code: str
    message: str
    retry_after: NotRequired[float]  # seconds; with `overloaded` and `quota_exceeded`


class FinalizeDone(TypedDict):
    """Internal, not protocol v1: sent only to a connection that asks for it (the compat
    adapters, which must know which final a `finalize` produced). It follows, in order,
    the final of `utterance_id` (the utterance the finalize closed; None if none was in
    progress), or takes its place when that final was empty."""

    type: Literal["finalize.done"]
    utterance_id: str | None


class SessionEnded(TypedDict):
    type: Literal["session.ended"]
    reason: str
    audio_seconds: float
    utterances: int
    finals: int


ServerMessage = (
    SessionStarted
    | SessionLanguage
    | SpeechStarted
    | SpeechStopped
    | TranscriptPartial
    | TranscriptFinal
    | ErrorMessage
    | SessionEnded
    | FinalizeDone
)


def error_message(
    code: ErrorCode, message: str, *, retry_after: float | None = None
) -> ErrorMessage:
    error: ErrorMessage = {"type": "error", "code": code.value, "message": message}
    if retry_after is not None:
        error["retry_after"] = retry_after
    return error


def encode(message: ServerMessage) -> str:
    return orjson.dumps(message).decode()


# ---------------------------------------------------------------- client → server


class ControlType(enum.StrEnum):
    FINALIZE = "finalize"  # flush the current utterance now
    STOP = "stop"  # flush, send every final, then `session.ended`, close 1000
    KEEPALIVE = "keepalive"
    AUTH = "auth"  # credentials as the first message; a no-op once authenticated


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
        return error_message(self.code, self.message, retry_after=self.retry_after)


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


def validate_id(kind: str, value: str) -> str:
    """Meeting ids and participant names become store keys: allow a safe alphabet only."""
    if not _ID_PATTERN.match(value):
        raise ProtocolError(
            ErrorCode.BAD_CONFIG,
            CloseCode.BAD_REQUEST,
            f"{kind} must be 1-128 characters of letters, digits, '_', '.', '-' "
            "and start with a letter or digit",
        )
    return value


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """The effective configuration of one audio stream, from the query string."""

    meeting_id: str
    participant: str
    language: str
    sample_rate: int
    encoding: Encoding
    interim_results: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "language": self.language,
            "sample_rate": self.sample_rate,
            "encoding": self.encoding.value,
            "interim_results": self.interim_results,
        }


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_stream_config(
    meeting_id: str, query: dict[str, str], default_language: str
) -> StreamConfig:
    """Validate the stream socket's query parameters; raise ProtocolError on bad input."""

    def bad(message: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, message)

    validate_id("meeting_id", meeting_id)
    participant = validate_id("participant", query.get("participant", "speaker"))
    language = query.get("language", default_language)
    if not re.fullmatch(r"[a-z]{2,3}|auto", language):
        raise bad(f"language must be an ISO 639-1 code such as 'en' or 'auto', not {language!r}")
    try:
        sample_rate = int(query.get("sample_rate", str(SAMPLE_RATE)))
    except ValueError:
        raise bad("sample_rate must be an integer") from None
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise bad(f"sample_rate must lie in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    try:
        encoding = Encoding(query.get("encoding", Encoding.PCM_S16LE.value))
    except ValueError:
        raise bad("encoding must be one of: " + ", ".join(e.value for e in Encoding)) from None
    interim = query.get("interim_results", "true").lower()
    if interim not in _TRUE | _FALSE:
        raise bad("interim_results must be true or false")
    return StreamConfig(
        meeting_id=meeting_id,
        participant=participant,
        language=language,
        sample_rate=sample_rate,
        encoding=encoding,
        interim_results=interim in _TRUE,
    )
