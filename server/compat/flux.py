"""Deepgram Flux (`/v2/listen`, conversational speech recognition) as a translation of
protocol v1 with turn events.

Sans-I/O, like server/compat/deepgram.py. A Flux client hears about turns, not
utterances: `Connected`, then for each turn `TurnInfo` messages whose `event` follows
Flux's state machine (docs/compat.md; Deepgram's "Understanding the Flux State Machine"):

    Initial --StartOfTurn--> TurnOngoing --EagerEndOfTurn--> AwaitingEnd
    AwaitingEnd --TurnResumed--> TurnOngoing;  AwaitingEnd --EndOfTurn--> Initial

with `Update`s while the turn goes on. The turns are Parley's (`turn_events`): the turn
model ends them where the server runs one (`trigger` "model"), the silence rule where it
does not or when the model judged a turn unfinished until the hold ran out ("timeout"),
and a client's `ForceEndTurn` (a `finalize`) ends one at once ("manual"). Mapping:

- `vad.speech_started` with no turn open → `StartOfTurn`;
- `transcript.partial` → `Update`: the turn's finals so far, then the partial;
- `turn.ended` eager → `EagerEndOfTurn` (its transcript as far as it is known; never
  empty: without text none is sent); `turn.resumed` → `TurnResumed`;
- `turn.ended` → the turn closes when its utterance's `transcript.final` comes:
  `EndOfTurn` with every final of the turn; an eager transcript that the final changed is
  withdrawn first (`TurnResumed`, then `EagerEndOfTurn` with the final text), so an
  `EndOfTurn`'s transcript always matches the `EagerEndOfTurn` right before it;
- a final that ends no turn (a long turn's cut) is kept for the turn's `EndOfTurn`;
- `error` → `Error`. `Configure` is answered `ConfigureFailure` (the thresholds are set
  once, from the query string); `CloseStream` → `stop`.

`eot_threshold`, `eager_eot_threshold` and `eot_timeout_ms` are the turn model's
threshold, eager threshold and longest pause of an unfinished turn. Every message carries
the stream's `request_id` and a `sequence_id` counting every message sent.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from server.compat.bridge import Inbound, Message, audio, control
from server.compat.deepgram import bad
from wire.codes import DEFAULT_SAMPLE_RATE, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, Encoding
from wire.errors import ProtocolError
from wire.keyterms import parse_keyterms
from wire.query import StreamConfig, validate_id

EOT_THRESHOLD = (0.5, 0.9)  # Flux's bounds
EAGER_EOT_THRESHOLD = (0.3, 0.9)
EOT_TIMEOUT_MS = (500, 10_000)


class TurnState(enum.Enum):
    INITIAL = "initial"
    ONGOING = "ongoing"
    AWAITING_END = "awaiting_end"  # after an EagerEndOfTurn


@dataclass(frozen=True, slots=True)
class FluxOptions:
    """The query parameters Parley honours, validated."""

    meeting_id: str
    participant: str | None
    sample_rate: int
    eot_threshold: float | None  # None: the server's turn threshold
    eager_eot_threshold: float | None  # None: no EagerEndOfTurn
    eot_timeout_ms: int | None  # None: the server's hold
    model: str
    keyterms: tuple[str, ...] = ()

    def stream_config(self, language: str) -> StreamConfig:
        return StreamConfig(
            meeting_id=self.meeting_id,
            participant=self.participant or "speaker",
            language=language,
            sample_rate=self.sample_rate,
            encoding=Encoding.PCM_S16LE,
            interim_results=True,
            keyterms=self.keyterms,
            turn_events=True,
            turn_eager=self.eager_eot_threshold or 0.0,
            turn_threshold=self.eot_threshold,
            turn_hold=None if self.eot_timeout_ms is None else self.eot_timeout_ms / 1000,
        )


def _number(query: Mapping[str, str], name: str, bounds: tuple[float, float]) -> float | None:
    raw = query.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise bad(f"{name} must be a number, not {raw[:32]!r}") from None
    if not bounds[0] <= value <= bounds[1]:
        raise bad(f"{name} must lie in [{bounds[0]:g}, {bounds[1]:g}]")
    return value


def parse_options(
    query: Mapping[str, str], *, meeting_id: str, keyterms: Sequence[str] = ()
) -> FluxOptions:
    """Validate the query string; ProtocolError (bad_config, HTTP 400) on a bad value.
    `model` is required, as Flux requires it; other parameters are accepted and ignored."""
    model = query.get("model")
    if not model:
        raise bad("model is required: model=flux-general-en")
    encoding = query.get("encoding", "linear16")
    if encoding != "linear16":
        raise bad(f"encoding {encoding[:32]!r} is not supported: send raw linear16 PCM")
    raw_rate = query.get("sample_rate", str(DEFAULT_SAMPLE_RATE))
    if not raw_rate.isdigit() or not MIN_SAMPLE_RATE <= int(raw_rate) <= MAX_SAMPLE_RATE:
        raise bad(f"sample_rate must lie in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    eot = _number(query, "eot_threshold", EOT_THRESHOLD)
    eager = _number(query, "eager_eot_threshold", EAGER_EOT_THRESHOLD)
    if eager is not None and eager > (eot if eot is not None else EOT_THRESHOLD[1]):
        raise bad("eager_eot_threshold must not exceed eot_threshold")
    timeout = _number(query, "eot_timeout_ms", EOT_TIMEOUT_MS)
    participant = query.get("participant")
    return FluxOptions(
        meeting_id=validate_id("meeting_id", meeting_id),
        participant=None if participant is None else validate_id("participant", participant),
        sample_rate=int(raw_rate),
        eot_threshold=eot,
        eager_eot_threshold=eager,
        eot_timeout_ms=None if timeout is None else round(timeout),
        model=model,
        keyterms=parse_keyterms(keyterms),
    )


class FluxCodec:
    """One `/v2/listen` stream's translation, both ways."""

    def __init__(self, options: FluxOptions, *, request_id: str, server_threshold: float) -> None:
        """`server_threshold`: the server's `TURN_THRESHOLD`, which the stream's turns end
        by when the query sets no `eot_threshold`."""
        self.options = options
        self.request_id = request_id
        self.threshold = options.eot_threshold or server_threshold
        self.state = TurnState.INITIAL
        self.turn_index = 0
        self._sequence = 0
        self._start = 0.0  # the open turn's first speech, stream seconds
        self._finals: list[Message] = []  # the open turn's finals so far
        self._partial = ""  # the open turn's latest partial text
        self._eager = ""  # the transcript of the last EagerEndOfTurn sent
        self._ending: tuple[str, float | None] | None = None  # (utterance, probability)
        self._force = False  # a ForceEndTurn is being answered

    # ------------------------------------------------------------------ client → actor

    def from_client(self, message: Message) -> Inbound:
        data = message.get("bytes")
        if data is not None:
            return Inbound([audio(data)])
        try:
            event = orjson.loads(message.get("text") or "")
        except orjson.JSONDecodeError:
            event = None
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "CloseStream":
            return Inbound([control("stop")])
        if kind == "ForceEndTurn":
            self._force = True
            return Inbound([control("finalize")])
        if kind == "Configure":
            reply = self._message(
                "ConfigureFailure",
                code="UNSUPPORTED",
                description="thresholds are set once, from the query string",
            )
            return Inbound(replies=[reply])
        return Inbound(
            replies=[
                self._message(
                    "Warning",
                    code="UNKNOWN_MESSAGE",
                    description="expected binary audio, CloseStream, ForceEndTurn or Configure",
                )
            ]
        )

    # ------------------------------------------------------------------ actor → client

    def from_server(self, message: Message) -> list[str]:
        kind = message["type"]
        if kind == "session.started":
            return [self._message("Connected")]
        if kind == "vad.speech_started":
            return self._started(message["t"])
        if kind == "transcript.partial":
            if self.state is TurnState.INITIAL:
                return []
            self._partial = message["text"]
            return [self._turn_info("Update", end=message["end"])]
        if kind == "turn.ended":
            return self._turn_ended(message)
        if kind == "turn.resumed":
            if self.state is not TurnState.AWAITING_END:
                return []
            self.state = TurnState.ONGOING
            return [self._turn_info("TurnResumed", end=message["t"])]
        if kind == "transcript.final":
            return self._final(message)
        if kind == "finalize.done":
            self._force = False
            return self._end(1.0, "manual") if self.state is not TurnState.INITIAL else []
        if kind == "error":
            return [self._message("Error", code=message["code"], description=message["message"])]
        return []

    def _started(self, t: float) -> list[str]:
        out: list[str] = []
        if self._ending is not None:  # the last turn's final was empty: close it as it is
            out += self._end(self._ending[1] or 1.0, self._trigger(self._ending[1]))
        if self.state is not TurnState.INITIAL:
            return out
        self.state = TurnState.ONGOING
        self._start, self._finals, self._partial, self._eager = t, [], "", ""
        return [*out, self._turn_info("StartOfTurn", end=t)]

    def _turn_ended(self, message: Message) -> list[str]:
        if self.state is TurnState.INITIAL:
            return []
        probability = message["probability"]
        if message["eager"]:
            text = self._transcript()
            if self.state is not TurnState.ONGOING or not text:
                return []
            self.state, self._eager = TurnState.AWAITING_END, text
            return [self._turn_info("EagerEndOfTurn", end=message["t"], confidence=probability)]
        self._ending = (message["utterance_id"], probability)
        return []

    def _final(self, message: Message) -> list[str]:
        if self.state is TurnState.INITIAL:
            return []
        self._finals.append(message)
        self._partial = ""
        if self._ending is None or self._ending[0] != message["utterance_id"]:
            if self._force:  # a ForceEndTurn's final: finalize.done ends the turn
                return []
            return [self._turn_info("Update", end=message["end"])]
        probability = self._ending[1]
        return self._end(
            probability if probability is not None else 1.0, self._trigger(probability)
        )

    def _end(self, confidence: float, trigger: str) -> list[str]:
        """EndOfTurn with the turn's finals; an eager transcript they changed is withdrawn
        and said again first, as Flux's state machine requires."""
        out: list[str] = []
        text = self._transcript()
        if self.state is TurnState.AWAITING_END and text != self._eager:
            out.append(self._turn_info("TurnResumed"))
            self.state = TurnState.ONGOING
        if self.state is TurnState.ONGOING and self.options.eager_eot_threshold and text:
            out.append(self._turn_info("EagerEndOfTurn", confidence=confidence))
        out.append(self._turn_info("EndOfTurn", confidence=confidence, trigger=trigger))
        self.state, self._ending = TurnState.INITIAL, None
        self.turn_index += 1
        return out

    def _trigger(self, probability: float | None) -> str:
        """What ended a turn: the turn model's judgement (a probability at the stream's
        threshold or above), or a silence past its bound (a lower one: the hold ran out)."""
        return "model" if probability is not None and probability >= self.threshold else "timeout"

    # ------------------------------------------------------------------ messages

    def _transcript(self) -> str:
        parts = [f["text"] for f in self._finals if f["text"]]
        if self._partial:
            parts.append(self._partial)
        return " ".join(parts)

    def _turn_info(
        self,
        event: str,
        *,
        end: float | None = None,
        confidence: float | None = None,
        trigger: str | None = None,
    ) -> str:
        words = [
            {
                "word": w["word"].strip(),
                "confidence": w.get("probability", 1.0),
                "start": w["start"],
                "end": w["end"],
            }
            for f in self._finals
            for w in f.get("words", [])
        ]
        if end is None:
            end = self._finals[-1]["end"] if self._finals else self._start
        fields: dict[str, Any] = {
            "event": event,
            "turn_index": self.turn_index,
            "audio_window_start": self._start,
            "audio_window_end": max(end, self._start),
            "transcript": self._transcript(),
            "words": words,
            "end_of_turn_confidence": 0.0 if confidence is None else round(confidence, 3),
        }
        if trigger is not None:
            fields["trigger"] = trigger
        return self._message("TurnInfo", **fields)

    def _message(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "request_id": self.request_id, "sequence_id": self._sequence}
        self._sequence += 1
        return orjson.dumps({**body, **fields}).decode()


def farewell(request_id: str, error: ProtocolError) -> str:
    """A refusal after the upgrade, before any other message (its `sequence_id` is 0)."""
    body = {"type": "Error", "request_id": request_id, "sequence_id": 0}
    return orjson.dumps({**body, "code": error.code.value, "description": error.message}).decode()
