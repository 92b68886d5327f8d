"""How a live stream ends: why, with which close code, and what is flushed.

`stop`, a clean client close and server shutdown finalize the utterance in progress; a
dropped connection does not (the client resumes and re-sends that audio). Finals already
cut are always committed. The reader returns the `Ending` it saw; when the writer or the
committer ends first, `first_ending` says what that means for the stream.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from session.outbox import SlowConsumer
from store.errors import SourceSuperseded, StoreError
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError


class EndReason(enum.Enum):
    STOP = "stop"
    CLIENT_CLOSED = "client_closed"
    CONNECTION_LOST = "connection_lost"
    PROTOCOL_ERROR = "protocol_error"
    LIMIT = "limit"  # the connection's idle or duration limit
    SHUTDOWN = "shutdown"
    SLOW_CONSUMER = "slow_consumer"
    SUPERSEDED = "superseded"  # the source was resumed on another connection
    STORE_FAILED = "store_failed"
    INTERNAL_ERROR = "internal_error"


CLIENT_GONE = frozenset({EndReason.CLIENT_CLOSED, EndReason.CONNECTION_LOST})


@dataclass(frozen=True, slots=True)
class Ending:
    reason: EndReason
    close_code: CloseCode
    flush: bool  # finalize the utterance in progress
    error: ProtocolError | None = None


STOPPED = Ending(EndReason.STOP, CloseCode.NORMAL, flush=True)
SHUTDOWN = Ending(EndReason.SHUTDOWN, CloseCode.SERVICE_RESTART, flush=True)
CLIENT_CLOSED = Ending(EndReason.CLIENT_CLOSED, CloseCode.NORMAL, flush=True)
CONNECTION_LOST = Ending(EndReason.CONNECTION_LOST, CloseCode.GOING_AWAY, flush=False)
INTERNAL_ERROR = Ending(EndReason.INTERNAL_ERROR, CloseCode.INTERNAL_ERROR, flush=False)


def disconnected(code: int) -> Ending:
    """The client's socket closed with `code`."""
    if code in (CloseCode.NORMAL, CloseCode.GOING_AWAY):
        return CLIENT_CLOSED
    return CONNECTION_LOST


def refused(reason: EndReason, error: ProtocolError) -> Ending:
    """The stream broke a rule (a protocol error, a connection limit): flush, then close."""
    return Ending(reason, error.close_code, flush=True, error=error)


async def first_ending(
    done: set[asyncio.Task[Any]],
    reader: asyncio.Task[Ending],
    writer: asyncio.Task[None],
    committer: asyncio.Task[None],
) -> Ending:
    """How the stream ends, given the tasks that ended first (`done`)."""
    if reader in done:
        return reader.result()
    # The writer or committer ended first: the client is gone or too slow, or a bug.
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    task = writer if writer in done else committer
    error = task.exception()
    if task is committer and error is not None:
        return committer_failed(error)
    if isinstance(error, SlowConsumer):
        return Ending(
            EndReason.SLOW_CONSUMER,
            CloseCode.POLICY_VIOLATION,
            flush=True,
            error=ProtocolError(ErrorCode.SLOW_CONSUMER, CloseCode.POLICY_VIOLATION, str(error)),
        )
    if task is writer:  # send failed: the connection is gone
        return CONNECTION_LOST
    raise RuntimeError("committer ended before the stream") from error


def committer_failed(error: BaseException) -> Ending:
    """How a stream ends when logging a final failed."""
    if isinstance(error, SourceSuperseded):
        return Ending(
            EndReason.SUPERSEDED,
            CloseCode.CONFLICT,
            flush=False,
            error=ProtocolError(
                ErrorCode.CONFLICT,
                CloseCode.CONFLICT,
                "this source was resumed on another connection",
            ),
        )
    if isinstance(error, StoreError):
        return Ending(
            EndReason.STORE_FAILED,
            CloseCode.TRY_AGAIN_LATER,
            flush=False,
            error=ProtocolError(
                ErrorCode.OVERLOADED,
                CloseCode.TRY_AGAIN_LATER,
                f"meeting store unavailable ({error}); resume later from resume_from",
            ),
        )
    raise RuntimeError("committer failed") from error
