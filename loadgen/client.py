"""One audio source streamed through protocol v1, with the timing every report is built on.

`stream_source` connects one `…/stream` socket, waits for `session.started`, sends the
track in fixed-size binary frames paced at `speed` x real time (or as fast as the socket
takes them), then `finalize` and `stop`, and reads until `session.ended`. It records the
wall time at which every frame left (`SendClock`), so that each partial and final gets its
latency as docs/protocol.md#server--client defines it: receive time - time the audio at
its `end` was sent. It never raises for anything the server or the network does: the
outcome lands in the `SourceLog` (`failure` is None for a clean session).
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import numpy as np
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from loadgen.audio import Samples
from wire.codes import DEFAULT_SAMPLE_RATE, CloseCode, Encoding
from wire.control import ControlType, control_message
from wire.messages import (
    ErrorMessage,
    SessionEnded,
    SessionLanguage,
    SessionStarted,
    TranscriptFinal,
    TranscriptPartial,
)

DEFAULT_SERVER = "ws://127.0.0.1:8000"
Clock = Callable[[], float]


def websocket_base(server: str) -> str:
    """Normalise a server address to a ws(s):// base URL: 'http://h:1' → 'ws://h:1'."""
    if "://" not in server:
        server = "ws://" + server
    parts = urlsplit(server)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"server URL must be ws://, wss://, http:// or https://, not {server!r}")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def stream_url(
    server: str,
    meeting_id: str,
    participant: str,
    *,
    language: str = "en",
    interim_results: bool = True,
) -> str:
    """The protocol v1 stream URL for one participant of a meeting, 16 kHz s16 audio."""
    query = urlencode(
        {
            "participant": participant,
            "language": language,
            "sample_rate": DEFAULT_SAMPLE_RATE,
            "encoding": Encoding.PCM_S16LE.value,
            "interim_results": "true" if interim_results else "false",
        }
    )
    return f"{websocket_base(server)}/v1/meetings/{quote(meeting_id, safe='')}/stream?{query}"


@dataclass(frozen=True, slots=True)
class Track:
    """The audio of one source: pieces played back to back (shared arrays, never copied whole)."""

    pieces: tuple[Samples, ...]

    @property
    def total_samples(self) -> int:
        return sum(len(piece) for piece in self.pieces)

    def frames(self, frame_samples: int) -> Iterator[Samples]:
        """Consecutive frames of `frame_samples` samples (the last one may be shorter)."""
        if frame_samples <= 0:
            raise ValueError("frame_samples must be positive")
        buffer: list[Samples] = []
        have = 0
        for piece in self.pieces:
            position = 0
            while position < len(piece):
                take = min(frame_samples - have, len(piece) - position)
                buffer.append(piece[position : position + take])
                have += take
                position += take
                if have == frame_samples:
                    yield buffer[0] if len(buffer) == 1 else np.concatenate(buffer)
                    buffer, have = [], 0
        if have:
            yield buffer[0] if len(buffer) == 1 else np.concatenate(buffer)


class SendClock:
    """When the frame holding each sample of a stream left the client."""

    def __init__(self) -> None:
        self._ends: list[int] = []  # exclusive end sample of each frame sent, increasing
        self._times: list[float] = []

    @property
    def samples_sent(self) -> int:
        return self._ends[-1] if self._ends else 0

    def record(self, end_sample: int, sent_at: float) -> None:
        if self._ends and end_sample <= self._ends[-1]:
            raise ValueError("frames must be recorded in stream order")
        self._ends.append(end_sample)
        self._times.append(sent_at)

    def sample_sent_at(self, index: int) -> float | None:
        """Time the sample at `index` was sent, or None if it has not been sent yet."""
        position = bisect.bisect_right(self._ends, max(0, index))
        return self._times[position] if position < len(self._times) else None

    def start_sent_at(self, seconds: float) -> float | None:
        """Time the first sample of audio starting at `seconds` was sent."""
        return self.sample_sent_at(round(seconds * DEFAULT_SAMPLE_RATE))

    def end_sent_at(self, seconds: float) -> float | None:
        """Time all audio up to `seconds` had been sent (its last sample left)."""
        return self.sample_sent_at(round(seconds * DEFAULT_SAMPLE_RATE) - 1)


@dataclass(frozen=True, slots=True)
class FinalEvent:
    message: TranscriptFinal
    received: float  # on the run's clock
    latency: float | None  # None when `end` lies past the audio sent (a server bug)


@dataclass(frozen=True, slots=True)
class PartialEvent:
    message: TranscriptPartial
    received: float
    latency: float | None
    since_start: float | None  # receive time - time the audio at `start` was sent


@dataclass(frozen=True, slots=True)
class StreamOptions:
    speed: float | None = 1.0  # x real time; None: as fast as the socket accepts
    frame_ms: int = 40
    language: str = "en"
    interim_results: bool = True
    token: str | None = None
    open_timeout: float = 20.0  # connect + `session.started`
    drain_timeout: float = 120.0  # after `stop`, until `session.ended`

    def __post_init__(self) -> None:
        if self.speed is not None and not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError("speed must be a positive number (or None for as fast as possible)")
        if not 10 <= self.frame_ms <= 200:
            raise ValueError("frame_ms must lie in 10..200")

    @property
    def frame_samples(self) -> int:
        return DEFAULT_SAMPLE_RATE * self.frame_ms // 1000


@dataclass(slots=True)
class SourceLog:
    """Everything observed on one source's socket."""

    meeting_id: str
    participant: str
    clock: SendClock = field(default_factory=SendClock)
    started: SessionStarted | None = None
    language: SessionLanguage | None = None  # what a language=auto stream was pinned to
    finals: list[FinalEvent] = field(default_factory=list)
    partials: list[PartialEvent] = field(default_factory=list)
    send_lags: list[float] = field(default_factory=list)  # per paced frame: sent - due
    server_errors: list[ErrorMessage] = field(default_factory=list)
    ended: SessionEnded | None = None
    close_code: int | None = None
    failure: str | None = None  # first thing that went wrong; None for a clean session
    detail: str = ""
    malformed: int = 0
    foreign: int = 0  # transcripts of other participants seen on this socket
    done: bool = False

    def fail(self, key: str, detail: str = "") -> None:
        if self.failure is None:
            self.failure, self.detail = key, detail


OnEvent = Callable[[SourceLog, FinalEvent | PartialEvent], None]


def _check_transcript(message: dict[str, Any], kind: str) -> tuple[float, float]:
    """`start` and `end` of a transcript message; ValueError if a field it needs is amiss."""
    needed: dict[str, type | tuple[type, ...]] = {
        "utterance_id": str,
        "text": str,
        "start": (int, float),
        "end": (int, float),
    }
    if kind == "transcript.final":
        needed["seq"] = int
    for name, kinds in needed.items():
        if not isinstance(message.get(name), kinds):
            raise ValueError(f"{kind} without a valid {name!r}")
    return float(message["start"]), float(message["end"])


def _handle(log: SourceLog, raw: str, now: float, on_event: OnEvent | None) -> bool:
    """Record one server message; True once `session.ended` has arrived."""
    message: Any = orjson.loads(raw)
    if not isinstance(message, dict):
        raise ValueError("a server message must be a JSON object")
    kind = message.get("type")
    event: FinalEvent | PartialEvent | None = None
    if kind in ("transcript.partial", "transcript.final"):
        if message.get("participant", log.participant) != log.participant:
            log.foreign += 1
            return False
        start, end = _check_transcript(message, kind)
        end_sent = log.clock.end_sent_at(end)
        latency = None if end_sent is None else now - end_sent
        if kind == "transcript.final":
            event = FinalEvent(cast(TranscriptFinal, message), now, latency)
            log.finals.append(event)
        else:
            start_sent = log.clock.start_sent_at(start)
            since_start = None if start_sent is None else now - start_sent
            event = PartialEvent(cast(TranscriptPartial, message), now, latency, since_start)
            log.partials.append(event)
    elif kind == "session.started":
        log.started = cast(SessionStarted, message)
    elif kind == "session.language":
        log.language = cast(SessionLanguage, message)
    elif kind == "error":
        log.server_errors.append(cast(ErrorMessage, message))
    elif kind == "session.ended":
        log.ended = cast(SessionEnded, message)
        return True
    if event is not None and on_event is not None:
        on_event(log, event)
    return False


async def _receive(
    ws: ClientConnection,
    log: SourceLog,
    started: asyncio.Event,
    clock: Clock,
    on_event: OnEvent | None,
) -> None:
    try:
        async for raw in ws:
            if isinstance(raw, bytes):
                log.malformed += 1
                continue
            try:
                ended = _handle(log, raw, clock(), on_event)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.malformed += 1
                continue
            if log.started is not None:
                started.set()
            if ended:
                return
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else 1006
        log.close_code = code
        log.fail(str(code), exc.rcvd.reason if exc.rcvd is not None else "no close frame")
        return
    log.close_code = ws.close_code
    if log.ended is None:
        log.fail(str(ws.close_code), "closed before session.ended")


async def _send(
    ws: ClientConnection, log: SourceLog, track: Track, options: StreamOptions, clock: Clock
) -> None:
    speed = options.speed
    t0 = clock()
    sent = 0
    try:
        for frame in track.frames(options.frame_samples):
            sent += len(frame)
            due = t0 + sent / DEFAULT_SAMPLE_RATE / speed if speed is not None else 0.0
            if speed is not None and (delay := due - clock()) > 0:
                await asyncio.sleep(delay)
            await ws.send(frame.tobytes())
            now = clock()
            log.clock.record(sent, now)
            if speed is not None:
                log.send_lags.append(max(0.0, now - due))
            else:
                await asyncio.sleep(0)  # let the receiver and other sources run
        await ws.send(control_message(ControlType.FINALIZE))
        await ws.send(control_message(ControlType.STOP))
    except ConnectionClosed:
        return  # the receiver records why


async def _run_socket(
    ws: ClientConnection,
    log: SourceLog,
    track: Track,
    options: StreamOptions,
    clock: Clock,
    on_event: OnEvent | None,
) -> None:
    started = asyncio.Event()
    receiver = asyncio.create_task(_receive(ws, log, started, clock, on_event))
    waiter = asyncio.create_task(started.wait())
    sender: asyncio.Task[None] | None = None
    try:
        await asyncio.wait(
            {waiter, receiver}, timeout=options.open_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if not started.is_set():
            if not receiver.done():
                log.fail("no_session_started", f"nothing within {options.open_timeout:g} s")
            return
        sender = asyncio.create_task(_send(ws, log, track, options, clock))
        await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
        if receiver.done():
            return  # closed by the server while sending: `failure` says why
        await sender
        try:
            async with asyncio.timeout(options.drain_timeout):
                await receiver
        except TimeoutError:
            log.fail("drain_timeout", f"no session.ended {options.drain_timeout:g} s after stop")
    finally:
        for task in (waiter, receiver, sender):
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for t in (waiter, receiver, sender) if t is not None), return_exceptions=True
        )


async def stream_source(
    log: SourceLog,
    server: str,
    track: Track,
    options: StreamOptions,
    *,
    clock: Clock,
    on_event: OnEvent | None = None,
) -> SourceLog:
    """Stream `track` as `log.participant` of `log.meeting_id`; fill in and return `log`."""
    url = stream_url(
        server,
        log.meeting_id,
        log.participant,
        language=options.language,
        interim_results=options.interim_results,
    )
    headers = {"Authorization": f"Bearer {options.token}"} if options.token else None
    try:
        async with connect(
            url,
            additional_headers=headers,
            compression=None,  # PCM does not deflate well; save both sides the CPU
            open_timeout=options.open_timeout,
            close_timeout=5.0,
            max_size=2**22,
        ) as ws:
            await _run_socket(ws, log, track, options, clock, on_event)
        if log.close_code is None:
            log.close_code = ws.close_code
    except InvalidStatus as exc:
        log.fail(
            f"http_{exc.response.status_code}", (exc.response.body or b"").decode(errors="replace")
        )
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        log.fail("connect_failed", f"{type(exc).__name__}: {exc}")
    finally:
        log.done = True
    if log.failure is None and log.close_code not in (None, CloseCode.NORMAL):
        log.fail(str(log.close_code), "session ended with a non-normal close")
    return log
