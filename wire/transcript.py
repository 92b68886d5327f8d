"""Render a meeting's finals as JSON, plain text, SRT or WebVTT. Pure functions.

The JSON form is the finals as `transcript.final` messages (without live timings), so a
client that recorded a meeting's finals renders what `GET …/transcript` answers. Every
form lists the finals in meeting-time order (wire/timeline.py); TXT, SRT and VTT show
times on the meeting's timeline, from its `origin` (the earliest source's start).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import orjson

from wire.build import transcript_final
from wire.messages import Final
from wire.timeline import in_meeting_order, meeting_origin, on_meeting_timeline


class TranscriptFormat(enum.StrEnum):
    JSON = "json"
    TXT = "txt"
    SRT = "srt"
    VTT = "vtt"

    @property
    def media_type(self) -> str:
        return {
            TranscriptFormat.JSON: "application/json",
            TranscriptFormat.TXT: "text/plain; charset=utf-8",
            TranscriptFormat.SRT: "application/x-subrip; charset=utf-8",
            TranscriptFormat.VTT: "text/vtt; charset=utf-8",
        }[self]


def render(
    meeting_id: str, finals: Sequence[Final], fmt: TranscriptFormat, *, labels: bool = True
) -> str:
    """`labels=False` leaves the participant out of TXT, SRT and VTT (a single-speaker file);
    a diarized final's speaker label is always shown. The finals come in meeting-time
    order whatever order they are given in."""
    finals = in_meeting_order(finals)
    if fmt is TranscriptFormat.JSON:
        return render_json(meeting_id, finals)
    finals = on_meeting_timeline(finals)  # times from the meeting's origin from here on
    if fmt is TranscriptFormat.TXT:
        return render_txt(finals, labels=labels)
    if fmt is TranscriptFormat.SRT:
        return render_srt(finals, labels=labels)
    return render_vtt(finals, labels=labels)


def render_json(meeting_id: str, finals: Sequence[Final]) -> str:
    body: dict[str, Any] = {
        "meeting_id": meeting_id,
        "origin": meeting_origin(finals),
        "finals": [transcript_final(f) for f in finals],
    }
    return orjson.dumps(body).decode()


def utterances(finals: Sequence[Final]) -> list[dict[str, Any]]:
    """The finals as plain utterances (`start`, `end`, `text`, `words` when known): the
    transcript of one uploaded file, without the meeting's bookkeeping."""
    out: list[dict[str, Any]] = []
    for f in finals:
        item: dict[str, Any] = {"start": f.start, "end": f.end, "text": f.text}
        if f.words:
            item["words"] = f.words
        if f.speaker is not None:
            item["speaker"] = f.speaker
        out.append(item)
    return out


def render_txt(finals: Sequence[Final], *, labels: bool = True) -> str:
    return "".join(
        f"[{_clock(f.start, '.')}] {_label(f, labels)}{_one_line(f.text)}\n" for f in finals
    )


def render_srt(finals: Sequence[Final], *, labels: bool = True) -> str:
    cues = [
        f"{i}\n{_clock(f.start, ',')} --> {_clock(_cue_end(f), ',')}\n"
        f"{_label(f, labels)}{_one_line(f.text)}\n"
        for i, f in enumerate(finals, start=1)
    ]
    return "\n".join(cues)


def render_vtt(finals: Sequence[Final], *, labels: bool = True) -> str:
    cues = [
        f"{_clock(f.start, '.')} --> {_clock(_cue_end(f), '.')}\n"
        + (f"<v {_escape(_who(f, labels))}>" if labels or f.speaker else "")
        + f"{_escape(f.text)}\n"
        for f in finals
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


def _label(final: Final, labels: bool) -> str:
    return f"{_who(final, labels)}: " if labels or final.speaker else ""


def _who(final: Final, labels: bool) -> str:
    """ "ana", "ana (S2)" for a diarized source, or "S2" when the participant is not shown."""
    if final.speaker is None:
        return final.participant
    return f"{final.participant} ({final.speaker})" if labels else final.speaker


def _cue_end(final: Final) -> float:
    return max(final.end, final.start + 0.001)


def _clock(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _escape(text: str) -> str:
    return _one_line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _one_line(text: str) -> str:
    """A blank line ends an SRT/VTT cue: keep every cue's text on one line."""
    return " ".join(text.split())
