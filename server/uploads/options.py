"""What an upload asks for (its options), and how a multichannel upload's channels are
named and shown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from server.uploads.decode_worker import Refusal
from store.records import FinalRecord
from wire.errors import ProtocolError
from wire.query import channel_participants
from wire.text_options import PLAIN, TextOptions
from wire.transcript import TranscriptFormat, utterances


@dataclass(frozen=True, slots=True)
class JobOptions:
    language: str | None  # None: detect (multilingual models)
    participant: str
    labelled: bool  # the client named the participant: label TXT/SRT/VTT lines with it
    meeting_id: str | None
    format: TranscriptFormat  # of the result when the POST answers with it (`wait=true`)
    diarize: bool = False  # label each utterance's speaker (a recording of several voices)
    # Unix seconds the recording started at, as the client gave it (`started_at`): the
    # meeting source's origin. None: the upload's start is.
    started_at: float | None = None
    keyterms: tuple[str, ...] = ()  # words to expect (`wire.keyterms`)
    # `multichannel`: a file's channels (at most this many) are transcribed apart, each
    # a participant (`participant`: "ana,bo", or one name they are numbered after); 1: the
    # file is mixed down to mono.
    channels: int = 1
    text: TextOptions = PLAIN  # redaction, numerals, profanity (`wire.text_options`)

    def as_dict(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "language": self.language or "auto",
            "participant": self.participant,
            "meeting_id": self.meeting_id,
            "format": self.format.value,
        }
        if self.diarize:
            options["diarize"] = True
        if self.started_at is not None:
            options["started_at"] = self.started_at
        if self.keyterms:
            options["keyterms"] = list(self.keyterms)
        if self.channels > 1:
            options["multichannel"] = True
        return options | self.text.as_dict()

    def participants(self, channels: int) -> tuple[str, ...]:
        """Each of a decoded file's `channels` channels' participant (one, mixed down).
        Refusal (400) when the names do not fit."""
        if channels == 1:
            return (self.participant,)
        try:
            return channel_participants(self.participant, channels)
        except ProtocolError as exc:
            raise Refusal(400, exc.code.value, exc.message) from None


def channel_utterances(
    finals: Sequence[FinalRecord], participants: Sequence[str]
) -> list[dict[str, Any]]:
    """A file's utterances; of a multichannel file, each with its `channel` and
    `participant`."""
    out = utterances(finals)
    if len(participants) > 1:
        for item, final in zip(out, finals, strict=True):
            item["channel"] = participants.index(final.participant)
            item["participant"] = final.participant
    return out
