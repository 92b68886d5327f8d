"""One meeting timeline across its sources.

Each source's `start`/`end` are seconds on its own timeline, from 0 when its stream (or
upload) started. Its `origin` says when that 0 was on the wall clock (Unix seconds), so
`origin + start` places any final on the meeting's one timeline: the `wall_time` a
`transcript.final` carries. A meeting's transcript and a listener's replay come in that
order (ties by `seq`); `seq` stays the order the finals were logged in.

The meeting's own 0 (`meeting_origin`) is the earliest origin among its finals: TXT,
SRT and VTT show times from there, so a one-source meeting shows its `start`s unchanged.
A final with no known origin (a file that stands alone, a final logged before origins
were kept) is taken to start with the meeting; when no final knows its origin, the
finals keep the order they were given in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

from wire.messages import Final, WallTime, Word

WALL_DIGITS = 3  # Unix seconds to the ms, like every other time in the protocol

F = TypeVar("F", bound=Final)


def wall_time(final: Final) -> WallTime | None:
    """The final's span in Unix seconds, None if its source's origin is unknown."""
    if final.origin is None:
        return None
    return {
        "start": round(final.origin + final.start, WALL_DIGITS),
        "end": round(final.origin + final.end, WALL_DIGITS),
    }


def meeting_origin(finals: Sequence[Final]) -> float | None:
    """The meeting's 0 in Unix seconds: its earliest source origin; None if none is known."""
    return min((f.origin for f in finals if f.origin is not None), default=None)


def shift(final: Final, origin: float | None) -> float:
    """Seconds to add to the final's own times to put them on the meeting's timeline."""
    if origin is None or final.origin is None:
        return 0.0
    return final.origin - origin


def in_meeting_order(finals: Sequence[F]) -> list[F]:
    """The finals by when they were spoken (meeting time to the ms, as `wall_time` says it,
    then `seq`: two finals of different sources that start in the same ms keep their `seq`
    order whatever the float error of their origins' difference)."""
    origin = meeting_origin(finals)
    if origin is None:
        return list(finals)
    return sorted(finals, key=lambda f: (round(shift(f, origin) + f.start, WALL_DIGITS), f.seq))


def on_meeting_timeline(finals: Sequence[F]) -> list[F]:
    """The finals with `start`, `end` and their words' times moved from their source's
    timeline to the meeting's (seconds from `meeting_origin`): what TXT, SRT and VTT show.
    A final that needs no move is returned as it is."""
    origin = meeting_origin(finals)
    return [_shifted(f, shift(f, origin)) for f in finals]


def _shifted(final: F, by: float) -> F:
    if by == 0.0:
        return final
    words: list[Word] = [
        {
            **w,
            "start": round(w["start"] + by, WALL_DIGITS),
            "end": round(w["end"] + by, WALL_DIGITS),
        }
        for w in final.words
    ]
    return dataclasses.replace(
        final,
        start=round(final.start + by, WALL_DIGITS),
        end=round(final.end + by, WALL_DIGITS),
        words=words,
    )
