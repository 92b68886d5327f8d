"""The protocol's numbers and names: version, sample rates, close codes, error codes,
audio encodings."""

from __future__ import annotations

import enum

PROTOCOL_VERSION = 1
# A stream's rate when its query names none (the model's rate: such a stream is not
# resampled). Any rate in MIN..MAX is accepted and resampled.
DEFAULT_SAMPLE_RATE = 16_000
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 48_000


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
    FORBIDDEN = 4403  # another tenant's meeting, an Origin not allowed, a token for elsewhere,
    # protected mode (no API key configured: loopback clients only)
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
    PROTECTED_MODE = "protected_mode"  # no API key configured, and the client is not loopback
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"  # no upload sandbox here, a remote client
    HOST_NOT_ALLOWED = "host_not_allowed"  # protected mode, a Host not this machine's name
    TOO_MANY_KEYTERMS = "too_many_keyterms"  # over the keyterm list's bounds (wire.keyterms)


class Encoding(enum.StrEnum):
    PCM_S16LE = "pcm_s16le"
    PCM_F32LE = "pcm_f32le"

    @property
    def sample_width(self) -> int:
        return 2 if self is Encoding.PCM_S16LE else 4
