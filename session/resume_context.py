"""What a resumed source's next final is decoded behind: its left context, re-heard.

The unbroken stream decodes each final behind the audio and text of the utterances just
before it (`session.said_before`). A resumed connection has neither in memory (it may run
on another node), so the server names `send_from` in `session.started`: the start of the
logged finals that context is made of, and a client that says so (`resend`) re-sends its
audio from there. The finals' text, words and spans come from the meeting's log; their
audio from that lead, which is heard for the context only (never scored by the VAD,
segmented or transcribed again: it was). A client that re-sends from `resume_from` (the
protocol before `send_from`) gets what it got before: a next final without context.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.api import SAMPLE_RATE, WordTiming
from session.pipeline import AudioPipeline, FloatArray
from session.said_before import LEFT_UTTERANCES, MAX_GAP, SaidBefore
from session.vad import VadState, unpack_state
from store.records import FinalRecord, SourceState
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

logger = logging.getLogger(__name__)

OnResend = Callable[[float], None]  # told the seconds of a `resend`'s lead


@dataclass(frozen=True, slots=True)
class _Heard:
    index: int
    start: int  # samples on the source's timeline
    end: int
    text: str
    words: tuple[WordTiming, ...]  # times from `start`


@dataclass(frozen=True, slots=True)
class ResumeContext:
    """The logged utterances the resumed source's next final is decoded behind (oldest
    first), and `send_from`: where the client's re-sent audio must start to hold them."""

    heard: tuple[_Heard, ...]
    resume_from: float

    @property
    def send_from(self) -> float:
        """Seconds of the source's audio (≤ `resume_from`) the client re-sends from."""
        return self.heard[0].start / SAMPLE_RATE if self.heard else self.resume_from

    def lead_samples(self, start: float) -> int:
        """Samples the client re-sends before `resume_from` when it re-sends from second
        `start` (a `resend`); ProtocolError unless `send_from` ≤ `start` ≤ `resume_from`
        (compared in seconds first: a number no sample count can hold is refused too)."""
        resume = round(self.resume_from * SAMPLE_RATE)
        slack = 1 / SAMPLE_RATE  # the sample counts below decide within one sample
        low, high = self.send_from - slack, self.resume_from + slack
        within = math.isfinite(start) and low <= start <= high
        lead = resume - round(start * SAMPLE_RATE) if within else -1
        if not 0 <= lead <= resume - round(self.send_from * SAMPLE_RATE):
            raise resend_refused(
                f"resend from {start:g} s: it must lie between send_from {self.send_from:g} "
                f"and resume_from {self.resume_from:g}"
            )
        return lead

    def said_before(self, lead: FloatArray) -> SaidBefore:
        """The left context made of the `lead` the client re-sent (its audio up to
        `resume_from`): each utterance whose audio the lead holds whole."""
        said = SaidBefore()
        first = round(self.resume_from * SAMPLE_RATE) - len(lead)
        for h in self.heard:
            if h.start >= first:
                audio = lead[h.start - first : h.end - first].copy()  # not the whole lead
                said.add(h.index, h.start, h.end, audio, h.text, h.words)
        return said


@dataclass
class ResendLead:
    """A resumed connection's `resend`: accepted once, first (before any audio), on a
    resumed stream; once the pipeline holds the whole re-sent lead, its left context is
    handed on once (`heard`)."""

    context: ResumeContext | None
    # Told the seconds a `resend` announces besides the live stream's audio (the
    # connection's real-time budget lets that much more come at once).
    on_resend: OnResend | None = None
    _open: bool = field(init=False)
    _heard: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._open = self.context is not None

    def resend(self, start: float, pipeline: AudioPipeline) -> None:
        """The client re-sends from second `start`: the pipeline keeps that lead aside."""
        if self.context is None or not self._open:
            raise resend_refused("resend comes once, first, on a resumed stream")
        self._open = False
        if lead := self.context.lead_samples(start):
            pipeline.expect_lead(lead)
            if self.on_resend is not None:
                self.on_resend(lead / SAMPLE_RATE)

    def heard(self, pipeline: AudioPipeline) -> SaidBefore | None:
        """After audio came: the lead's left context, the first time it is whole."""
        self._open = False
        if self.context is None or self._heard or not pipeline.lead_complete:
            return None
        self._heard = True
        return self.context.said_before(pipeline.take_lead())


def resend_refused(reason: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_MESSAGE, CloseCode.INVALID_PAYLOAD, reason)


def stored_vad_state(source: SourceState) -> VadState | None:
    """The VAD state a resumed stream goes on from: the one stored with its last final
    (None: state an older server stored, or one that is not a packed state (not text,
    not finite): the VAD then starts from zero, as it used to)."""
    if source.vad_state is None:
        return None
    try:
        return unpack_state(source.vad_state)
    except ValueError:
        logger.warning("source %s: stored VAD state unreadable", source.session_id)
        return None


def resume_context(finals: list[FinalRecord], source: SourceState, limit: float) -> ResumeContext:
    """The context of `source`'s next utterance (`source.next_utterance`) from the
    meeting's recent `finals`: its last logged utterances, consecutive up to it, as many as
    the unbroken stream kept (LEFT_UTTERANCES) and fit `limit` seconds (0: none), their
    gaps counted at most MAX_GAP each as the context holds them; and the lead the client
    re-sends for them, gaps whole, fits `limit` too: a pause longer than the context can
    hold leaves out the utterance before it (the unbroken stream would have kept it with
    the pause cut short; a resumed one would have to be sent the whole pause)."""
    resume_from = source.acked_until
    if limit <= 0:
        return ResumeContext((), resume_from)
    by_index: dict[int, list[FinalRecord]] = {}
    for record in finals:
        index = _index(record, source.session_id)
        if index is not None:
            by_index.setdefault(index, []).append(record)
    heard: list[_Heard] = []
    seconds = 0.0
    max_lead = round(limit * SAMPLE_RATE)  # samples re-sent before resume_from, at most
    resume = round(resume_from * SAMPLE_RATE)
    index = source.next_utterance - 1
    while index in by_index and len(heard) < LEFT_UTTERANCES:
        utterance = _heard(index, by_index[index])
        gap = (heard[0].start - utterance.end) if heard else 0
        seconds += (utterance.end - utterance.start + min(gap, MAX_GAP * SAMPLE_RATE)) / SAMPLE_RATE
        if seconds > limit or gap < 0 or resume - utterance.start > max_lead:
            break
        heard.insert(0, utterance)
        index -= 1
    return ResumeContext(tuple(heard), resume_from)


def _index(record: FinalRecord, session_id: str) -> int | None:
    """The utterance index of one of the source's finals (a diarized part: `id-5.1`)."""
    if record.session_id != session_id:
        return None
    head, _, tail = record.utterance_id.rpartition("-")
    number = tail.split(".")[0]
    return int(number) if head == session_id and number.isdigit() else None


def _heard(index: int, parts: list[FinalRecord]) -> _Heard:
    start = round(min(p.start for p in parts) * SAMPLE_RATE)
    end = round(max(p.end for p in parts) * SAMPLE_RATE)
    offset = start / SAMPLE_RATE
    words = tuple(
        WordTiming(
            w["word"],
            round(w["start"] - offset, 3),
            round(w["end"] - offset, 3),
            w.get("probability", 0.0),
        )
        for p in parts
        for w in p.words
    )
    text = " ".join(p.text for p in parts if p.text)
    return _Heard(index, start, end, text, words)
