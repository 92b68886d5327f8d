"""One meeting timeline: wall times, meeting order, and every rendering in that order."""

from __future__ import annotations

from dataclasses import replace

import orjson

from wire import build
from wire.messages import Final, TranscriptFinal
from wire.timeline import in_meeting_order, meeting_origin, on_meeting_timeline, wall_time
from wire.transcript import TranscriptFormat, render

ANA = 1_764_637_800.25  # ana's stream started first ...
BO = ANA + 2.5  # ... bo's 2.5 s later

# Logged (seq) in the order they were ready: bo's short phrase before ana's long one.
FINALS = [
    Final(1, "b-0", "bo", "Short.", 0.5, 1.5, "en", origin=BO),  # meeting time 3.0-4.0
    Final(2, "a-0", "ana", "A long opening.", 0.2, 6.0, "en", origin=ANA),  # 0.2-6.0
    Final(3, "a-1", "ana", "Then this.", 7.0, 8.0, "en", origin=ANA),  # 7.0-8.0
    Final(4, "b-1", "bo", "Right.", 4.0, 4.8, "en", origin=BO),  # 6.5-7.3
]


def test_wall_time_and_order() -> None:
    """`origin + start` places each final; the order is by it, `seq` kept as logged."""
    assert wall_time(FINALS[0]) == {"start": round(BO + 0.5, 3), "end": round(BO + 1.5, 3)}
    assert meeting_origin(FINALS) == ANA
    assert [f.seq for f in in_meeting_order(FINALS)] == [2, 1, 4, 3]
    legacy = [Final(1, "x-0", "x", "t", 5.0, 6.0, "en"), Final(2, "y-0", "y", "u", 1.0, 2.0, "en")]
    assert in_meeting_order(legacy) == legacy  # no origin known: the order as given
    assert wall_time(legacy[0]) is None


def test_final_message_carries_wall_time_and_parses_back() -> None:
    message = build.transcript_final(FINALS[1])
    assert message["wall_time"] == {"start": round(ANA + 0.2, 3), "end": round(ANA + 6.0, 3)}
    received: TranscriptFinal = orjson.loads(build.encode(message))
    assert Final.from_message(received) == FINALS[1]
    assert "wall_time" not in build.transcript_final(Final(1, "x-0", "x", "t", 0.0, 1.0, "en"))
    started = build.session_started(
        session_id="a", meeting_id="m", participant="ana", config={}, resume_token="t",
        resume_from=0.0, resumed=False, last_seq=0, origin=ANA,
    )  # fmt: skip
    assert list(started)[-1] == "origin" and started["origin"] == ANA


def test_every_format_in_meeting_time() -> None:
    """JSON, TXT, SRT and VTT list the finals in meeting time, with times from the
    meeting's origin (the earliest source's start)."""
    body = orjson.loads(render("m", FINALS, TranscriptFormat.JSON))
    assert body["origin"] == ANA
    assert [f["seq"] for f in body["finals"]] == [2, 1, 4, 3]
    assert render("m", FINALS, TranscriptFormat.TXT) == (
        "[00:00:00.200] ana: A long opening.\n"
        "[00:00:03.000] bo: Short.\n"
        "[00:00:06.500] bo: Right.\n"
        "[00:00:07.000] ana: Then this.\n"
    )
    srt = render("m", FINALS, TranscriptFormat.SRT).split("\n\n")
    assert srt[1] == "2\n00:00:03,000 --> 00:00:04,000\nbo: Short."
    vtt = render("m", FINALS, TranscriptFormat.VTT)
    assert "00:00:06.500 --> 00:00:07.300\n<v bo>Right.\n" in vtt
    assert vtt.index("A long opening.") < vtt.index("Short.") < vtt.index("Then this.")


def test_renderings_move_times_and_words_to_the_meeting_timeline() -> None:
    """A later source's start, end and word times move by its origin's lead; the
    earliest source's finals are left as they are."""
    worded = replace(FINALS[0], words=[{"word": " Short.", "start": 0.5, "end": 1.4}])
    moved = on_meeting_timeline([worded, FINALS[1]])
    assert (moved[0].start, moved[0].end) == (3.0, 4.0)
    assert moved[0].words == [{"word": " Short.", "start": 3.0, "end": 3.9}]
    assert moved[1] is FINALS[1]
    assert worded.start == 0.5  # the finals given are not changed


def test_finals_starting_in_the_same_ms_keep_their_seq_order() -> None:
    """Origins whose difference carries float error (1764637000.11 - 1764637000.1 is
    0.00999999… in binary) still order two finals that start in the same ms by `seq`, as
    their `wall_time` (to the ms) says they tie."""
    ana, bo = 1_764_637_000.1, 1_764_637_000.11
    first = Final(1, "a-0", "ana", "Ask not.", 0.01, 1.0, "en", origin=ana)
    second = Final(2, "b-0", "bo", "Hello.", 0.0, 1.0, "en", origin=bo)
    first_wall, second_wall = wall_time(first), wall_time(second)
    assert first_wall is not None and second_wall is not None
    assert first_wall["start"] == second_wall["start"]  # the same ms on the wire
    assert (bo - ana) + second.start < first.start  # but the second first in floats
    for finals in ([first, second], [second, first]):
        assert [f.seq for f in in_meeting_order(finals)] == [1, 2]
