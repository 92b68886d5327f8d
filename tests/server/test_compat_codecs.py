"""The compat codecs without sockets: protocol v1 messages in, vendor messages out."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest
from starlette.websockets import WebSocket, WebSocketDisconnect

from server.compat.bridge import TranslatingConnection
from server.compat.deepgram import DeepgramCodec, parse_options
from server.compat.deepgram_text import plain
from server.compat.openai_realtime import RealtimeCodec, Vad
from wire.errors import ProtocolError


def deepgram(**query: str) -> DeepgramCodec:
    options = parse_options(query, meeting_id="m", default_language="en")
    return DeepgramCodec(options, request_id="r", model_name="tiny.en")


def out(texts: list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(t) for t in texts]


def final(index: int, text: str, start: float, end: float, **extra: Any) -> dict[str, Any]:
    return {
        "type": "transcript.final",
        "utterance_id": f"s-{index}",
        "seq": index + 1,
        "participant": "p",
        "text": text,
        "start": start,
        "end": end,
        "language": "en",
        **extra,
    }


def test_deepgram_words_carry_timings_confidence_and_speakers() -> None:
    """Word timings and probabilities of a final become Deepgram words; speakers become
    0, 1, ... in order of appearance; without punctuate the text is plain."""
    words = [
        {"word": " Hello,", "start": 0.1, "end": 0.4, "probability": 0.9, "speaker": "S2"},
        {"word": " world.", "start": 0.5, "end": 0.9, "probability": 0.7, "speaker": "S1"},
    ]
    codec = deepgram(punctuate="true", diarize="true")
    [results] = out(codec.from_server(final(0, "Hello, world.", 0.0, 1.0, words=words)))
    alternative = results["channel"]["alternatives"][0]
    assert alternative["transcript"] == "Hello, world."
    assert alternative["confidence"] == pytest.approx(0.8)
    assert [(w["word"], w["punctuated_word"], w["speaker"]) for w in alternative["words"]] == [
        ("hello", "Hello,", 0),
        ("world", "world.", 1),
    ]
    [later] = out(codec.from_server(final(1, "Again.", 1.0, 2.0, speaker="S1")))
    assert later["channel"]["alternatives"][0]["speaker"] == 1  # no words: on the alternative
    assert results["is_final"] and results["duration"] == 1.0
    [bare] = out(deepgram().from_server(final(0, "Hello, world.", 0.0, 1.0, words=words)))
    assert bare["channel"]["alternatives"][0]["transcript"] == "hello world"
    assert "speaker" not in bare["channel"]["alternatives"][0]["words"][0]
    assert plain("Don't stop — 'now'!") == "don't stop now"


def test_deepgram_text_options_map_and_their_marks_survive_plain_text() -> None:
    """redact (repeated), numerals, smart_format and profanity_filter become the stream's
    text options; without punctuate, [PCI] and a mask stay as they are in the transcript
    and the words."""
    options = parse_options(
        {"smart_format": "true", "profanity_filter": "true"},
        meeting_id="m",
        default_language="en",
        redact=["pci", "ssn"],
    )
    config = options.stream_config()
    assert config.text.numerals and config.text.profanity_filter
    assert config.as_dict()["redact"] == ["pci", "ssn"]
    words = [
        {"word": " card", "start": 0.1, "end": 0.4, "probability": 0.9},
        {"word": " [PCI],", "start": 0.5, "end": 2.9, "probability": 0.7},
        {"word": " ****!", "start": 3.0, "end": 3.2, "probability": 0.8},
    ]
    [results] = out(deepgram().from_server(final(0, "Card [PCI], ****!", 0.0, 4.0, words=words)))
    alternative = results["channel"]["alternatives"][0]
    assert alternative["transcript"] == "card [PCI] ****"
    assert [w["word"] for w in alternative["words"]] == ["card", "[PCI]", "****"]
    with pytest.raises(ProtocolError, match="redact"):
        parse_options({}, meeting_id="m", default_language="en", redact=["pii"])


def test_deepgram_speech_final_and_utterance_end() -> None:
    """A final is speech-final when speech stopped inside it (and endpointing is on);
    UtteranceEnd follows it; a cut without a stop is not speech-final."""
    codec = deepgram(utterance_end_ms="1000")
    assert codec.from_server({"type": "vad.speech_stopped", "t": 1.8}) == []
    first = out(codec.from_server(final(0, "one", 0.2, 1.9)))
    assert [m["type"] for m in first] == ["Results", "UtteranceEnd"]
    assert first[0]["speech_final"] and first[1]["last_word_end"] == 1.9
    [cut] = out(codec.from_server(final(1, "two", 2.0, 17.0)))
    assert not cut["speech_final"]
    off = deepgram(endpointing="false")
    off.from_server({"type": "vad.speech_stopped", "t": 1.8})
    assert not out(off.from_server(final(0, "one", 0.2, 1.9)))[0]["speech_final"]


def test_deepgram_finalize_marks_its_final_and_keeps_order() -> None:
    """While a Finalize is under way messages wait; its acknowledgement releases them in
    order with from_finalize on the final it closed (an empty final when there was none)."""
    codec = deepgram(interim_results="true")
    assert [m["text"] for m in codec.from_client({"text": '{"type": "Finalize"}'}).to_actor] == [
        '{"type":"finalize"}'
    ]
    partial = {"type": "transcript.partial", "utterance_id": "s-0", "text": "a", "start": 0.0}
    assert codec.from_server({**partial, "end": 0.5}) == []
    assert codec.from_server(final(0, "a b", 0.0, 1.0)) == []
    released = out(codec.from_server({"type": "finalize.done", "utterance_id": "s-0"}))
    assert [(m["is_final"], m["from_finalize"]) for m in released] == [
        (False, False),
        (True, True),
    ]
    codec.from_client({"text": '{"type": "Finalize"}'})
    [empty] = out(codec.from_server({"type": "finalize.done", "utterance_id": None}))
    assert empty["from_finalize"] and empty["is_final"]
    assert empty["channel"]["alternatives"][0]["transcript"] == ""
    assert empty["start"] == 1.0 and empty["duration"] == 0.0


def test_deepgram_two_finalize_in_flight_get_one_answer_each() -> None:
    """Two Finalize in flight, the first closing an utterance and the second nothing: the
    first's final is marked, and the second gets its own empty from_finalize Results
    (before, the first's final answered both)."""
    codec = deepgram()
    codec.from_client({"text": '{"type": "Finalize"}'})
    codec.from_client({"text": '{"type": "Finalize"}'})
    assert codec.from_server(final(0, "a b", 0.0, 1.0)) == []
    assert codec.from_server({"type": "finalize.done", "utterance_id": "s-0"}) == []
    released = out(codec.from_server({"type": "finalize.done", "utterance_id": None}))
    assert [(m["is_final"], m["from_finalize"]) for m in released] == [(True, True), (True, True)]
    assert [m["channel"]["alternatives"][0]["transcript"] for m in released] == ["a b", ""]


def test_deepgram_stops_wait_for_their_finals() -> None:
    """The next utterance's stop may come before this one's final: each final is
    speech-final (and followed by UtteranceEnd) by the stop that falls in it."""
    codec = deepgram(utterance_end_ms="1000")
    codec.from_server({"type": "vad.speech_stopped", "t": 1.8})
    codec.from_server({"type": "vad.speech_stopped", "t": 3.5})
    first = out(codec.from_server(final(0, "one", 0.2, 1.9)))
    second = out(codec.from_server(final(1, "two", 2.5, 3.6)))
    assert [m["type"] for m in first] == [m["type"] for m in second] == ["Results", "UtteranceEnd"]
    assert first[0]["speech_final"] and second[0]["speech_final"]
    assert second[1]["last_word_end"] == 3.6


def test_deepgram_utterance_end_without_endpointing() -> None:
    """endpointing=false with utterance_end_ms (Deepgram's advice for noisy audio): no
    Results is speech-final, but UtteranceEnd still follows a final the speech stopped in."""
    codec = deepgram(endpointing="false", utterance_end_ms="1000")
    codec.from_server({"type": "vad.speech_stopped", "t": 1.8})
    results, end = out(codec.from_server(final(0, "one", 0.2, 1.9)))
    assert not results["speech_final"] and end["type"] == "UtteranceEnd"


def test_deepgram_punctuate_gives_sentences() -> None:
    """punctuate=true: a final Whisper wrote on in lower case starts with a capital, and a
    speech-final one left bare ends with a full stop (its words too); an interim and a
    final cut mid-speech keep their end as it is."""
    codec = deepgram(punctuate="true")
    words = [
        {"word": " ask", "start": 0.1, "end": 0.4, "probability": 0.9},
        {"word": " country", "start": 0.5, "end": 0.9, "probability": 0.9},
    ]
    [cut] = out(codec.from_server(final(0, "ask country", 0.0, 1.0, words=words)))
    assert cut["channel"]["alternatives"][0]["transcript"] == "Ask country"
    codec.from_server({"type": "vad.speech_stopped", "t": 1.9})
    [ended] = out(codec.from_server(final(1, "ask country", 1.0, 2.0, words=words)))
    alternative = ended["channel"]["alternatives"][0]
    assert alternative["transcript"] == "Ask country."
    assert [w["punctuated_word"] for w in alternative["words"]] == ["Ask", "country."]
    [asked] = out(codec.from_server(final(2, "Why?", 2.0, 3.0)))
    assert asked["channel"]["alternatives"][0]["transcript"] == "Why?"


def test_deepgram_client_frames() -> None:
    """KeepAlive, CloseStream and an empty binary frame map to v1 controls; anything else
    (but Configure, tests/server/test_keyterms.py) is an invalid message."""
    codec = deepgram()
    frames: list[tuple[dict[str, Any], str]] = [
        ({"text": '{"type": "KeepAlive"}'}, "keepalive"),
        ({"text": '{"type": "CloseStream"}'}, "stop"),
        ({"bytes": b""}, "stop"),
    ]
    for frame, kind in frames:
        [message] = codec.from_client(frame).to_actor
        assert orjson.loads(message["text"]) == {"type": kind}
    assert codec.from_client({"bytes": b"\x01\x00"}).to_actor[0]["bytes"] == b"\x01\x00"
    with pytest.raises(ProtocolError) as raised:
        codec.from_client({"text": '{"type": "Reconfigure"}'})
    assert raised.value.close_code == 1007


def realtime() -> RealtimeCodec:
    codec = RealtimeCodec(
        session_id="sess_1",
        beta=False,
        vad=Vad(threshold=0.5, prefix_padding_ms=200, silence_duration_ms=500),
        default_language="en",
        model="whisper-1",
    )
    codec.from_server({"type": "session.started", "session_id": "s"})
    return codec


def test_openai_deltas_add_stable_words_then_complete() -> None:
    """Deltas carry the words a partial adds (its last word held back); a rewrite adds
    nothing; the final commits the item, sends the remainder, then the transcript."""
    codec = realtime()
    [started] = out(codec.from_server({"type": "vad.speech_started", "t": 0.35}))
    assert started["item_id"] == "item_s-0" and started["audio_start_ms"] == 350

    def partial(text: str) -> list[dict[str, Any]]:
        message = {"type": "transcript.partial", "utterance_id": "s-0", "text": text}
        return out(codec.from_server({**message, "start": 0.1, "end": 1.0}))

    assert [m["delta"] for m in partial("And so my")] == ["And so "]
    assert [m["delta"] for m in partial("And so my fellow Americans")] == ["my fellow "]
    assert partial("And sew my fellow") == []  # rewrote sent words: nothing to add
    events = out(codec.from_server(final(0, "And so my fellow Americans, ask", 0.1, 2.3)))
    assert [e["type"] for e in events] == [
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
    ]
    assert events[1]["delta"] == "Americans, ask"
    assert events[2]["transcript"] == "And so my fellow Americans, ask"
    assert events[2]["usage"] == {"type": "duration", "seconds": 2.2}
    [started] = out(codec.from_server({"type": "vad.speech_started", "t": 3.0}))
    assert started["item_id"] == "item_s-1"
    committed = out(codec.from_server(final(1, "next", 3.0, 4.0)))[0]
    assert committed["previous_item_id"] == "item_s-0"


def test_openai_overlapping_utterances_do_not_repeat_deltas() -> None:
    """Utterance 1's partial arrives before utterance 0's final: a client that concatenates
    each item's deltas (as OpenAI documents) gets exactly each completed transcript."""
    codec = realtime()
    events = codec.from_server({"type": "vad.speech_started", "t": 0.1, "utterance_id": "s-0"})

    def partial(index: int, text: str) -> list[str]:
        message = {"type": "transcript.partial", "utterance_id": f"s-{index}", "text": text}
        return codec.from_server({**message, "start": 0.0, "end": 1.0})

    events += partial(0, "one two three")
    events += codec.from_server({"type": "vad.speech_started", "t": 2.0, "utterance_id": "s-1"})
    events += partial(1, "four five six")
    events += codec.from_server(final(0, "one two three", 0.1, 1.9))
    events += partial(1, "four five six seven")
    events += codec.from_server(final(1, "four five six seven", 2.0, 3.0))
    said: dict[str, str] = {}
    completed: dict[str, str] = {}
    for event in out(events):
        if event["type"] == "conversation.item.input_audio_transcription.delta":
            said[event["item_id"]] = said.get(event["item_id"], "") + event["delta"]
        if event["type"] == "conversation.item.input_audio_transcription.completed":
            completed[event["item_id"]] = event["transcript"]
    assert said == completed == {"item_s-0": "one two three", "item_s-1": "four five six seven"}


def test_openai_speech_started_names_its_item_after_an_emptied_utterance() -> None:
    """Utterance 0 was judged not speech (no final): the next speech start names item 1,
    the item its transcript then completes, not item 0 again."""
    codec = realtime()
    codec.from_server({"type": "vad.speech_started", "t": 0.1, "utterance_id": "s-0"})
    [started] = out(
        codec.from_server({"type": "vad.speech_started", "t": 2.0, "utterance_id": "s-1"})
    )
    events = out(codec.from_server(final(1, "hello", 2.0, 3.0)))
    assert started["item_id"] == events[-1]["item_id"] == "item_s-1"


def test_openai_commit_is_answered() -> None:
    """A commit with no speech in progress is answered with OpenAI's
    input_audio_buffer_commit_empty error; one whose utterance the guard emptied completes
    that item empty; one whose final was sent needs nothing more."""
    codec = realtime()
    [empty] = out(codec.from_server({"type": "finalize.done", "utterance_id": None}))
    assert empty["type"] == "error"
    assert empty["error"]["code"] == "input_audio_buffer_commit_empty"
    committed, completed = out(codec.from_server({"type": "finalize.done", "utterance_id": "s-0"}))
    assert (
        committed["type"] == "input_audio_buffer.committed" and committed["item_id"] == "item_s-0"
    )
    assert completed["transcript"] == ""
    codec.from_server(final(1, "hello", 2.0, 3.0))
    assert codec.from_server({"type": "finalize.done", "utterance_id": "s-1"}) == []


async def test_a_reply_to_a_client_that_left_is_its_disconnect() -> None:
    """A client frame that owes a reply (`input_audio_buffer.clear`), from a client that
    dropped the connection before the reply went out: `receive` says the client left,
    as its next read would have, instead of raising out of the session's reader (the
    session ended as an internal error, with a traceback: bench/fuzz_sessions.py)."""

    class Gone:
        """The socket as starlette has it once the peer is gone: reads the last frame,
        then every send raises WebSocketDisconnect."""

        async def receive(self) -> dict[str, Any]:
            return {"type": "websocket.receive", "text": '{"type": "input_audio_buffer.clear"}'}

        async def send_text(self, data: str) -> None:
            raise WebSocketDisconnect(1006)

    connection = TranslatingConnection(cast(WebSocket, Gone()), realtime(), max_frame_bytes=1024)
    message = await connection.receive()
    assert message["type"] == "websocket.disconnect"
