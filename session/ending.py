"""How a live stream ends: why, with which close code, and what is flushed.

`stop`, a clean client close and server shutdown finalize the utterance in progress; a
dropped connection does not (the client resumes and re-sends that audio). Finals already
cut are always committed. The reader returns the `Ending` it saw; when the writer, the
committer or the outbox's overflow ends first, `first_ending` says what that means for
the stream. The actor counts the cut utterances that got no final (the engine stopped
or died, or the last finals outlived the commit timeout) and says so in the close.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from engine.api import SAMPLE_RATE, EngineDead, SchedulerStopped
from session.stream_state import SessionTotals
from store.errors import SourceSuperseded, StoreError
from wire import build
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError
from wire.messages import ServerMessage


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

    def close_reason(self, lost: int) -> str:
        """The close frame's reason: says how many finals were `lost`, if any."""
        return f"{self.reason.value}; {lost} finals lost" if lost else self.reason.value

    def error_message(self, lost: int) -> str:
        """The `error` message's text: says how many finals were `lost`, if any."""
        message = self.error.message if self.error is not None else self.reason.value
        return f"{message}; {lost} finals lost" if lost else message


STOPPED = Ending(EndReason.STOP, CloseCode.NORMAL, flush=True)
SHUTDOWN = Ending(EndReason.SHUTDOWN, CloseCode.SERVICE_RESTART, flush=True)
CLIENT_CLOSED = Ending(EndReason.CLIENT_CLOSED, CloseCode.NORMAL, flush=True)
CONNECTION_LOST = Ending(EndReason.CONNECTION_LOST, CloseCode.GOING_AWAY, flush=False)
INTERNAL_ERROR = Ending(EndReason.INTERNAL_ERROR, CloseCode.INTERNAL_ERROR, flush=False)
SUPERSEDED = Ending(
    EndReason.SUPERSEDED,
    CloseCode.CONFLICT,
    flush=False,
    error=ProtocolError(
        ErrorCode.CONFLICT, CloseCode.CONFLICT, "this source was resumed on another connection"
    ),
)


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
    overflow: asyncio.Task[None],
) -> Ending:
    """How the stream ends, given the tasks that ended first (`done`)."""
    if overflow in done:  # the client is too slow, whatever the reader was doing
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        return slow_consumer(overflow.exception())
    if reader in done:
        return reader.result()
    # The writer or committer ended first: the client is gone, or a failure.
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    task = writer if writer in done else committer
    error = None if task.cancelled() else task.exception()
    if task is committer and error is not None:
        return committer_failed(error)
    if task is writer:  # send failed: the connection is gone
        return CONNECTION_LOST
    raise RuntimeError("committer ended before the stream") from error


def slow_consumer(error: BaseException | None) -> Ending:
    return Ending(
        EndReason.SLOW_CONSUMER,
        CloseCode.POLICY_VIOLATION,
        flush=True,  # the utterance in progress is logged and published; a resume replays it
        error=ProtocolError(
            ErrorCode.SLOW_CONSUMER,
            CloseCode.POLICY_VIOLATION,
            str(error or "client left too many messages unread"),
        ),
    )


def commit_timeout(timeout: float) -> Ending:
    """After `stop`, the last finals took longer than `timeout` to commit."""
    return Ending(
        EndReason.STOP,
        CloseCode.TRY_AGAIN_LATER,
        flush=False,
        error=ProtocolError(
            ErrorCode.OVERLOADED,
            CloseCode.TRY_AGAIN_LATER,
            f"the last finals were not transcribed within {timeout:g} s",
        ),
    )


def committer_failed(error: BaseException) -> Ending:
    """How a stream ends when committing a final failed (the log, or the engine)."""
    if isinstance(error, SourceSuperseded):
        return SUPERSEDED
    if isinstance(error, SchedulerStopped):  # the server is stopping
        return SHUTDOWN
    if isinstance(error, EngineDead):
        return Ending(
            EndReason.INTERNAL_ERROR,
            CloseCode.INTERNAL_ERROR,
            flush=False,
            error=ProtocolError(ErrorCode.INTERNAL, CloseCode.INTERNAL_ERROR, str(error)),
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


def last_messages(ending: Ending, totals: SessionTotals, lost: int) -> list[ServerMessage]:
    """What a client still there gets last: `session.ended` after `stop` or at shutdown
    (with the count of finals lost), then `error` when the stream broke (the close with
    its code follows)."""
    messages: list[ServerMessage] = []
    if ending.reason in {EndReason.STOP, EndReason.SHUTDOWN}:
        messages.append(
            build.session_ended(
                reason=ending.reason.value,
                audio_seconds=round(totals.audio_samples / SAMPLE_RATE, 3),
                utterances=totals.utterances,
                finals=totals.finals,
                finals_lost=lost,
            )
        )
    if ending.error is not None:
        messages.append(build.error(ending.error.code, ending.error_message(lost)))
    return messages
