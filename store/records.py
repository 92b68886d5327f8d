"""What the store keeps: finals (before and after they get their `seq`), the state of an
audio source, the store's health; and the checks every implementation shares."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from store.errors import UnknownResumeToken
from wire.messages import Final, Word
from wire.query import validate_id

_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")  # fullmatch: "$" takes a "\n"


@dataclass(frozen=True, slots=True)
class NewFinal:
    """A final transcript before the store has given it its `seq`."""

    utterance_id: str
    session_id: str
    participant: str
    text: str
    start: float
    end: float
    language: str
    words: list[Word] = field(default_factory=list)
    speaker: str | None = None  # diarized sources only
    origin: float | None = None  # its source's `SourceState.origin`; None: a lone file


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalRecord(Final):
    """A final as logged: the protocol's final and the session that spoke it."""

    session_id: str

    @classmethod
    def from_new(cls, seq: int, final: NewFinal) -> FinalRecord:
        # field by field, not asdict(): no deep copy of the words on every final
        return cls(seq=seq, **{f.name: getattr(final, f.name) for f in fields(NewFinal)})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinalRecord:
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SourceState:
    """What a resumed source needs, as of its last logged final.

    The session actor keeps the current state and passes the *next* one with every final
    (`replace(state, acked_until=final.end, next_utterance=..., context=...)`); the store
    writes it in the same atomic step as the final, so it always agrees with the log.
    """

    meeting_id: str
    session_id: str
    participant: str
    generation: int = 1  # raised by every resume; appends carrying an older one are refused
    acked_until: float = 0.0  # end (s, this source's audio) of its last logged final
    next_utterance: int = 0  # index of this source's next utterance
    context: str = ""  # rolling text context: the model's prompt
    language: str | None = None  # the stream's language once pinned (given or detected)
    # Unix seconds (to the ms) of this source's time 0: when its stream or upload started.
    # Set once by create_source, kept by every resume. None only in state written before
    # origins were kept (see `with_origin`).
    origin: float | None = None
    # The VAD's state just after `acked_until` (session.vad.pack_state: base64 of its
    # recurrent state and context tail, ~1.7 KB), so a resumed stream's VAD goes on as the
    # unbroken one would have; None: not known (a new source, an older server's state).
    vad_state: str | None = None

    def stored(self) -> dict[str, Any]:
        """The fields persisted as the source's state (generation is kept apart)."""
        return {
            "participant": self.participant,
            "acked_until": self.acked_until,
            "next_utterance": self.next_utterance,
            "context": self.context,
            "language": self.language,
            "origin": self.origin,
            "vad_state": self.vad_state,
        }

    @classmethod
    def from_stored(
        cls, meeting_id: str, session_id: str, generation: int, data: dict[str, Any]
    ) -> SourceState:
        return cls(
            meeting_id=meeting_id,
            session_id=session_id,
            participant=data["participant"],
            generation=generation,
            acked_until=float(data["acked_until"]),
            next_utterance=int(data["next_utterance"]),
            context=data["context"],
            language=data.get("language"),  # absent in state written before it was kept
            origin=data.get("origin"),  # likewise
            vad_state=data.get("vad_state"),  # likewise
        )

    def with_origin(self, now: float) -> SourceState:
        """This state with an origin: its own, or for state written before origins were
        kept, the best guess `now - acked_until` (the stream resumes from `acked_until`
        now). The guess is stored with the source's next final."""
        if self.origin is not None:
            return self
        return replace(self, origin=wall_origin(now - self.acked_until))


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """For /readyz: `ok` False means degraded; `reason` says why in words."""

    backend: str
    ok: bool
    reason: str = ""
    buffered: int = 0  # writes waiting in memory for the store

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- shared checks


def hash_token(token: str) -> str:
    """The stored form of a resume token. A malformed token is simply unknown."""
    if not _TOKEN_PATTERN.fullmatch(token):
        raise UnknownResumeToken("malformed resume token")
    return hashlib.sha256(token.encode()).hexdigest()


def wall_origin(unix_s: float) -> float:
    """A source's origin as stored and sent: Unix seconds to the ms."""
    return round(unix_s, 3)


def new_source(meeting_id: str, participant: str, origin_unix_s: float) -> tuple[SourceState, str]:
    """A new source's initial state, under a fresh session id, and its resume token (256
    random bits). Validates the participant; the caller validates the meeting id."""
    validate_id("participant", participant)
    state = SourceState(
        meeting_id=meeting_id,
        session_id=secrets.token_hex(8),
        participant=participant,
        origin=wall_origin(origin_unix_s),
    )
    return state, secrets.token_urlsafe(32)


def check_append(meeting_id: str, final: NewFinal, source: SourceState) -> None:
    """The final and the source state must describe the same source of this meeting."""
    validate_id("meeting_id", meeting_id)
    validate_id("session_id", source.session_id)
    if source.meeting_id != meeting_id:
        raise ValueError(f"source of meeting {source.meeting_id!r} used in {meeting_id!r}")
    if final.session_id != source.session_id or final.participant != source.participant:
        raise ValueError("final and source state belong to different sources")
