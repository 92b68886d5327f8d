"""Protocol v1 as code: the builder's messages, control and query parsing, rendering."""

from __future__ import annotations

import itertools

import orjson
import pytest

from wire import build
from wire.codes import CloseCode, Encoding, ErrorCode
from wire.control import ControlType, control_message, parse_auth, parse_control
from wire.errors import ProtocolError
from wire.messages import Final, TranscriptFinal, Word
from wire.query import parse_flag, parse_stream_config, validate_id
from wire.transcript import CUE_CHARS, CUE_SECONDS, Cue, TranscriptFormat, cues, render, utterances

FINALS = [
    Final(1, "s1-0", "ana", "Hello  there.", 0.16, 2.336, "en"),
    Final(2, "s2-0", "bo", "a <b> & c", 3.0, 3.0, "en", [{"word": "a", "start": 3, "end": 3}]),
]


def test_builder_writes_the_documented_fields_in_order() -> None:
    """Every server message encodes with the fields docs/protocol.md shows, in order."""
    started = build.session_started(
        session_id="s1",
        meeting_id="m",
        participant="ana",
        config={"language": "en"},
        resume_token="t",
        resume_from=0.0,
        resumed=False,
        last_seq=0,
    )
    assert list(started) == [
        "type", "protocol", "session_id", "meeting_id", "participant", "config",
        "resume_token", "resume_from", "resumed", "last_seq",
    ]  # fmt: skip
    assert started["protocol"] == 1
    speech = build.encode(build.speech_started(0.352, "s-0"))
    assert speech == '{"type":"vad.speech_started","t":0.352,"utterance_id":"s-0"}'
    assert build.speech_stopped(2.24) == {"type": "vad.speech_stopped", "t": 2.24}
    assert build.session_language("es", None, 0)["probability"] is None
    partial = build.transcript_partial(
        utterance_id="s1-0", participant="ana", text="And so", start=0.16, end=1.184
    )
    assert list(partial) == ["type", "utterance_id", "participant", "text", "start", "end"]
    ended = build.session_ended(reason="stop", audio_seconds=11.0, utterances=4, finals=4)
    assert list(ended) == [
        "type", "reason", "audio_seconds", "utterances", "finals", "finals_lost", "usage",
    ]  # fmt: skip
    assert ended["finals_lost"] == 0  # additive: a v1 client that ignores it is unaffected
    assert ended["usage"] == {"audio_seconds": 11.0}
    assert build.error(ErrorCode.OVERLOADED, "full", retry_after=2.0) == {
        "type": "error", "code": "overloaded", "message": "full", "retry_after": 2.0,
    }  # fmt: skip
    assert "retry_after" not in build.error(ErrorCode.INTERNAL, "bug")


def test_final_with_timing_and_back() -> None:
    """A live final carries rounded timings; a client parses it back into the same Final."""
    timing = build.timing(queue=0.021049, inference=0.31, total=0.33312)
    message = build.transcript_final(FINALS[1], timing)
    assert message["timing"] == {"queue": 0.021, "inference": 0.31, "total": 0.3331}
    assert list(message)[-2:] == ["words", "timing"]
    received: TranscriptFinal = orjson.loads(build.encode(message))
    assert Final.from_message(received) == FINALS[1]
    assert "words" not in build.transcript_final(FINALS[0])


def test_control_and_auth_frames() -> None:
    """Control frames parse to their type; anything else is a ProtocolError with 1007."""
    assert parse_control(control_message(ControlType.STOP)) is ControlType.STOP
    for bad in ("not json", "[1]", '{"type": "dance"}'):
        with pytest.raises(ProtocolError) as caught:
            parse_control(bad)
        assert caught.value.close_code is CloseCode.INVALID_PAYLOAD
    assert parse_auth('{"type": "auth", "token": "pmt_x"}') == "pmt_x"
    assert parse_auth('{"type": "auth", "token": 1}') is None
    assert parse_auth("{") is None and parse_auth(None) is None


def test_stream_query() -> None:
    """Defaults, and a named 4400 for each bad parameter."""
    config = parse_stream_config("m", {}, "en")
    assert (config.participant, config.sample_rate, config.encoding) == (
        "speaker", 16_000, Encoding.PCM_S16LE,
    )  # fmt: skip
    assert config.interim_results and parse_flag("Off") is False and parse_flag("maybe") is None
    for query in ({"sample_rate": "4000"}, {"encoding": "mp3"}, {"language": "English"}):
        with pytest.raises(ProtocolError) as caught:
            parse_stream_config("m", query, "en")
        assert caught.value.close_code is CloseCode.BAD_REQUEST
    with pytest.raises(ProtocolError):
        validate_id("meeting_id", "../etc")


def test_render_formats() -> None:
    """TXT, SRT and VTT keep each cue on one line and escape VTT markup; JSON is the finals."""
    assert render("m", FINALS, TranscriptFormat.TXT) == (
        "[00:00:00.160] ana: Hello there.\n[00:00:03.000] bo: a <b> & c\n"
    )
    srt = render("m", FINALS, TranscriptFormat.SRT, labels=False)
    assert srt.splitlines()[:3] == ["1", "00:00:00,160 --> 00:00:02,336", "Hello there."]
    vtt = render("m", FINALS, TranscriptFormat.VTT)
    assert "00:00:03.000 --> 00:00:03.001\n<v bo>a &lt;b&gt; &amp; c\n" in vtt
    body = orjson.loads(render("m", FINALS, TranscriptFormat.JSON))
    assert body["finals"][0] == build.transcript_final(FINALS[0])
    assert utterances(FINALS)[1]["words"] == FINALS[1].words


def _timed(text: str, start: float, step: float) -> list[Word]:
    """`text`'s words as the model writes them (leading spaces), `step` seconds each."""
    return [
        {
            "word": " " + w,
            "start": round(start + i * step, 3),
            "end": round(start + (i + 1) * step, 3),
        }
        for i, w in enumerate(text.split())
    ]


def test_long_finals_are_cut_into_cues_between_words() -> None:
    """A final over 42 characters or 7 s becomes cues of whole words within both limits,
    back to back over its span; short, wordless or inconsistent finals stay one cue."""
    text = "And so my fellow Americans, ask not what your country can do for you, ask what."
    words = _timed(text, 10.0, 0.3)  # 16 words, 4.8 s: only the characters force cuts
    long = Final(1, "s-0", "ana", text, 9.9, 15.0, "en", words)
    split = cues(long)
    assert len(split) == 2 and " ".join(c.text for c in split) == text
    assert all(len(c.text) <= CUE_CHARS for c in split)
    assert split[0].start == 9.9 and split[-1].end == 15.0
    assert all(a.end == b.start for a, b in itertools.pairwise(split))
    assert split[1].start == words[len(split[0].text.split())]["start"]
    slow = Final(
        2,
        "s-1",
        "ana",
        "one two three four",
        0.0,
        20.0,
        "en",
        _timed("one two three four", 0.0, 5.0),
    )
    assert [c.text for c in cues(slow)] == ["one", "two", "three", "four"]
    assert all(c.end - c.start <= CUE_SECONDS for c in cues(slow))
    assert cues(Final(3, "s-2", "ana", text, 0.0, 5.0, "en")) == [Cue(0.0, 5.0, text)]
    stale = Final(4, "s-3", "ana", text, 0.0, 5.0, "en", _timed("other words", 0.0, 1.0))
    assert cues(stale) == [Cue(0.0, 5.0, text)]
    srt = render("m", [long], TranscriptFormat.SRT, labels=False).splitlines()
    assert srt[:3] == ["1", "00:00:09,900 --> 00:00:12,400", split[0].text]
    assert srt[4:7] == ["2", "00:00:12,400 --> 00:00:15,000", split[1].text]
    vtt = render("m", [long], TranscriptFormat.VTT)
    assert f"00:00:12.400 --> 00:00:15.000\n<v ana>{split[1].text}\n" in vtt
