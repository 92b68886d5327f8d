"""Every message the server sends, as TypedDicts (they serialise with orjson as they
are), and `Final`: one final transcript as the protocol carries it, parsed.

Build messages with `wire.build`, never inline: it is the one place that knows their
fields and precision. Every message a stream's socket carries is `OnChannel`: on a
multichannel stream's socket it has `channel`, added as it goes out
(server/sockets/channels.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict


class Word(TypedDict):
    """One word of a final: its text as the model wrote it, with its leading space (the
    words concatenated, then stripped, make the final's text), its span in stream seconds
    and the model's probability of it."""

    word: str
    start: float
    end: float
    probability: NotRequired[float]  # absent from finals logged before words had it


class WallTime(TypedDict):
    """When a final was spoken, in Unix seconds (v1 extension): its source's `origin` plus
    its `start` and `end`. Every source of a meeting shares this one timeline."""

    start: float
    end: float


class Timing(TypedDict):
    """Server-side latency breakdown of one final, in seconds."""

    queue: float
    inference: float
    total: float  # from the end of the utterance's audio arriving to the final being sent


class OnChannel(TypedDict):
    """What every message on a stream's socket may carry: on a multichannel stream (v1
    extension, `channels=N`), the 0-based channel it belongs to; absent otherwise."""

    channel: NotRequired[int]


class SessionStarted(OnChannel):
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
    # Unix seconds of the source's time 0 (v1 extension): when its stream first started;
    # a resumed source keeps its own. Absent for a source logged before origins were kept.
    origin: NotRequired[float]
    # A resumed stream only (v1 extension): the earliest second (≤ `resume_from`) a client
    # that sends `resend` re-sends its audio from: the utterances before `resume_from` the
    # next final is decoded behind (its left context), heard and never transcribed again.
    send_from: NotRequired[float]


class SessionLanguage(OnChannel):
    """A `language=auto` stream's language, pinned once (v1 extension)."""

    type: Literal["session.language"]
    language: str
    # The model's probability of `language` over the utterances it was detected from;
    # None when it was not detected on this connection (an English-only model, a resume).
    probability: float | None
    utterances: int  # how many of the source's utterances it was detected from


class SpeechStarted(OnChannel):
    type: Literal["vad.speech_started"]
    t: float
    # The id of the final this speech will make, if it makes one (a burst too short for a
    # final makes none, and the next speech gets the same id).
    utterance_id: str


class SpeechStopped(OnChannel):
    type: Literal["vad.speech_stopped"]
    t: float


class TurnEnded(OnChannel):
    """The speaker's turn ended with utterance `utterance_id` (v1 extension, streams that
    ask with `turn_events=true`): its `transcript.final` follows. `eager`: it probably
    ended (the turn model's probability passed the stream's `turn_eager`), the utterance
    is still open: `turn.resumed`, or `turn.ended` without `eager`, follows. `t`: where
    its speech ended (stream seconds); `probability`: the turn model's that the turn was
    complete, null when a silence ended it without the model."""

    type: Literal["turn.ended"]
    utterance_id: str
    t: float
    probability: float | None
    eager: bool


class TurnResumed(OnChannel):
    """Speech came back after an eager `turn.ended` of `utterance_id` (v1 extension)."""

    type: Literal["turn.resumed"]
    utterance_id: str
    t: float


class TranscriptPartial(OnChannel):
    type: Literal["transcript.partial"]
    utterance_id: str
    participant: str
    text: str
    start: float
    end: float


class TranscriptFinal(OnChannel):
    type: Literal["transcript.final"]
    utterance_id: str
    seq: int
    participant: str
    text: str
    start: float
    end: float
    language: str
    words: NotRequired[list[Word]]
    # Where the final lies on the meeting's one timeline (v1 extension; absent for a file
    # that stands alone and for finals logged before sources kept their origin).
    wall_time: NotRequired[WallTime]
    timing: NotRequired[Timing]
    # `diarize=true` sources only: "S1", "S2", … stable within the source (v1 extension).
    speaker: NotRequired[str]


class TranscriptSpeaker(OnChannel):
    """A logged final's speaker label changed after a re-clustering (v1 extension)."""

    type: Literal["transcript.speaker"]
    utterance_id: str
    speaker: str


class ErrorMessage(OnChannel):
    type: Literal["error"]
    code: str
    message: str
    retry_after: NotRequired[float]  # seconds; with `overloaded` and `quota_exceeded`


class FinalizeDone(OnChannel):
    """Internal, not protocol v1: sent only to a connection that asks for it (the compat
    adapters, which must know which final a `finalize` produced). It follows, in order,
    the final of `utterance_id` (the utterance the finalize closed; None if none was in
    progress), or takes its place when that final was empty."""

    type: Literal["finalize.done"]
    utterance_id: str | None


class Usage(TypedDict):
    """What a connection (or an upload) was billed (v1 extension): the seconds of audio
    it sent that were heard, as Deepgram's closing `Metadata` says them (`duration`)."""

    audio_seconds: float


class SessionEnded(OnChannel):
    type: Literal["session.ended"]
    reason: str
    audio_seconds: float
    utterances: int
    finals: int
    finals_lost: int  # utterances cut whose final was neither logged nor sent
    usage: NotRequired[Usage]  # v1 extension: the audio_seconds billed (always sent)


ServerMessage = (
    SessionStarted
    | SessionLanguage
    | SpeechStarted
    | SpeechStopped
    | TurnEnded
    | TurnResumed
    | TranscriptPartial
    | TranscriptFinal
    | TranscriptSpeaker
    | ErrorMessage
    | SessionEnded
    | FinalizeDone
)


@dataclass(frozen=True, slots=True)
class Final:
    """One final of a meeting's transcript: what `transcript.final` carries but its
    server-side timing. `seq` is per meeting, starts at 1 and has no gaps."""

    seq: int
    utterance_id: str
    participant: str
    text: str
    start: float
    end: float
    language: str
    words: list[Word] = field(default_factory=list)
    speaker: str | None = None  # diarized sources only; re-clustering may change it
    # Unix seconds of its source's time 0; None when unknown (see wire/timeline.py).
    origin: float | None = None

    @classmethod
    def from_message(cls, message: TranscriptFinal) -> Final:
        """A received `transcript.final` (its `timing` is left out)."""
        return cls(
            seq=message["seq"],
            utterance_id=message["utterance_id"],
            participant=message["participant"],
            text=message["text"],
            start=message["start"],
            end=message["end"],
            language=message["language"],
            words=list(message.get("words", [])),
            speaker=message.get("speaker"),
            origin=_origin(message),
        )


def _origin(message: TranscriptFinal) -> float | None:
    wall = message.get("wall_time")
    return None if wall is None else round(wall["start"] - message["start"], 3)
