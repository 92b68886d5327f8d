"""The Flux codec, sans-I/O: protocol v1 messages with turn events in, Flux's TurnInfo
sequence out (its state machine), and the query string's bounds."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from server.compat.flux import FluxCodec, TurnState, parse_options
from wire import build
from wire.errors import ProtocolError

UID = "s1-0"


def codec(**query: str) -> FluxCodec:
    options = parse_options({"model": "flux-general-en", **query}, meeting_id="m1")
    return FluxCodec(options, request_id="r1", server_threshold=0.5)


def feed(flux: FluxCodec, *messages: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        out += [
            orjson.loads(text) for text in flux.from_server(orjson.loads(build.encode(message)))
        ]
    return out


def final(text: str, end: float = 2.0, uid: str = UID) -> dict[str, Any]:
    return {
        "type": "transcript.final",
        "utterance_id": uid,
        "seq": 1,
        "participant": "p",
        "text": text,
        "start": 0.5,
        "end": end,
        "language": "en",
        "words": [
            {"word": " " + w, "start": 0.5, "end": 1.0, "probability": 0.9} for w in text.split()
        ],
    }


def events(out: list[dict[str, Any]]) -> list[str]:
    return [m.get("event", m["type"]) for m in out]


def test_a_turn_from_start_to_end() -> None:
    """StartOfTurn at speech, Update per partial, EndOfTurn (trigger model, the final's
    words, the model's confidence) when the turn's final comes; the next turn is 1."""
    flux = codec()
    out = feed(
        flux,
        build.speech_started(0.5, UID),
        build.transcript_partial(
            utterance_id=UID, participant="p", text="Hello", start=0.5, end=1.0
        ),
        build.turn_ended(UID, 1.8, 0.91),
        final("Hello there."),
    )
    assert events(out) == ["StartOfTurn", "Update", "EndOfTurn"]
    end = out[-1]
    assert end["transcript"] == "Hello there." and end["trigger"] == "model"
    assert end["end_of_turn_confidence"] == 0.91 and [w["word"] for w in end["words"]] == [
        "Hello",
        "there.",
    ]
    assert (end["turn_index"], flux.turn_index, flux.state) == (0, 1, TurnState.INITIAL)
    assert "trigger" not in out[0] and out[0]["transcript"] == ""


def test_eager_end_resumed_then_changed_final() -> None:
    """EagerEndOfTurn with the partial's text; TurnResumed when speech comes back; at the
    end a final whose text differs from the eager one is withdrawn and said again, so
    EndOfTurn's transcript matches the EagerEndOfTurn right before it."""
    flux = codec(eager_eot_threshold="0.4")
    partial = build.transcript_partial(
        utterance_id=UID, participant="p", text="I was", start=0.5, end=1.0
    )
    out = feed(
        flux,
        build.speech_started(0.5, UID),
        partial,
        build.turn_ended(UID, 1.2, 0.45, eager=True),
        build.turn_resumed(UID, 1.5),
        build.turn_ended(UID, 2.4, 0.42, eager=True),
        build.turn_ended(UID, 2.4, 0.42),
        final("I was thinking."),
    )
    assert events(out) == [
        "StartOfTurn",
        "Update",
        "EagerEndOfTurn",
        "TurnResumed",
        "EagerEndOfTurn",
        "TurnResumed",
        "EagerEndOfTurn",
        "EndOfTurn",
    ]
    assert out[-2]["transcript"] == out[-1]["transcript"] == "I was thinking."
    assert out[-1]["trigger"] == "timeout"  # the model judged it unfinished; the hold ran out
    assert [m["sequence_id"] for m in out] == list(range(len(out)))


def test_force_end_turn_and_close_stream() -> None:
    """ForceEndTurn is a finalize whose answer ends the turn (trigger manual); CloseStream
    is stop; Configure is refused (thresholds come from the query string)."""
    flux = codec()
    inbound = flux.from_client({"type": "websocket.receive", "text": '{"type": "ForceEndTurn"}'})
    assert orjson.loads(inbound.to_actor[0]["text"]) == {"type": "finalize"}
    out = feed(flux, build.speech_started(0.5, UID), final("Stop."), build.finalize_done(UID))
    assert events(out) == ["StartOfTurn", "EndOfTurn"] and out[-1]["trigger"] == "manual"
    close = flux.from_client({"type": "websocket.receive", "text": '{"type": "CloseStream"}'})
    assert orjson.loads(close.to_actor[0]["text"]) == {"type": "stop"}
    configure = flux.from_client({"type": "websocket.receive", "text": '{"type": "Configure"}'})
    assert orjson.loads(configure.replies[0])["type"] == "ConfigureFailure"


@pytest.mark.parametrize(
    "query",
    [
        {"model": "flux-general-en", "eot_threshold": "0.95"},
        {"model": "flux-general-en", "eager_eot_threshold": "0.2"},
        {"model": "flux-general-en", "eot_threshold": "0.6", "eager_eot_threshold": "0.8"},
        {"model": "flux-general-en", "eot_timeout_ms": "100"},
        {"model": "flux-general-en", "encoding": "opus"},
        {},
    ],
)
def test_bad_options_are_refused(query: dict[str, str]) -> None:
    """Values outside Flux's documented bounds, or no model, are refused (HTTP 400)."""
    with pytest.raises(ProtocolError):
        parse_options(query, meeting_id="m1")


def test_options_map_onto_the_turn_model() -> None:
    """eot_threshold, eager_eot_threshold and eot_timeout_ms become the stream's turn
    threshold, eager threshold and hold; the stream always gets turn events."""
    options = parse_options(
        {
            "model": "flux-general-en",
            "eot_threshold": "0.8",
            "eager_eot_threshold": "0.5",
            "eot_timeout_ms": "3000",
        },
        meeting_id="m1",
    )
    config = options.stream_config("en")
    assert (config.turn_threshold, config.turn_eager, config.turn_hold) == (0.8, 0.5, 3.0)
    assert config.turn_events and config.turn_model


@pytest.mark.parametrize(
    ("query", "server_threshold", "probability", "trigger"),
    [
        ({"eot_threshold": "0.8"}, 0.5, 0.6, "timeout"),  # under the stream's threshold
        ({"eot_threshold": "0.8"}, 0.5, 0.85, "model"),
        ({}, 0.7, 0.6, "timeout"),  # no eot_threshold: the server's
        ({}, 0.7, 0.75, "model"),
    ],
)
def test_the_trigger_is_judged_by_the_threshold_the_turn_ended_by(
    query: dict[str, str], server_threshold: float, probability: float, trigger: str
) -> None:
    """A turn the model judged under the threshold ended when the hold ran out: "timeout",
    even where the probability is over one half."""
    options = parse_options({"model": "flux-general-en", **query}, meeting_id="m1")
    flux = FluxCodec(options, request_id="r1", server_threshold=server_threshold)
    out = feed(
        flux,
        build.speech_started(0.5, UID),
        build.turn_ended(UID, 2.4, probability),
        final("We should move the meeting."),
    )
    assert out[-1]["event"] == "EndOfTurn" and out[-1]["trigger"] == trigger
