"""OpenAI's realtime transcription sessions (`/v1/realtime?intent=transcription`) as a
translation of protocol v1.

Sans-I/O. Both flavours of the protocol are spoken: the GA one (`session.update` with
`session.type = "transcription"` and `audio.input.format`) and the beta one, chosen by
the `OpenAI-Beta: realtime=v1` header or, from a browser (which cannot set headers), the
`openai-beta.realtime-v1` subprotocol (`transcription_session.update` with
`input_audio_format: "pcm16"`). Audio is base64 PCM16 at 24 kHz, resampled by the
pipeline like any other rate. docs/compat.md is the contract.

Mapping:
- `input_audio_buffer.append` → audio; `.commit` → `finalize`, answered once it is done:
  by the item's `committed` and `completed` (their text, or empty when the guard found no
  speech), or, when no speech was in progress, an `error` with code
  `input_audio_buffer_commit_empty`, as OpenAI answers a commit of an empty buffer;
  `.clear` is acknowledged (`input_audio_buffer.cleared`) but audio already sent is
  still transcribed;
- `vad.speech_started`/`_stopped` → `input_audio_buffer.speech_started`/`_stopped`
  (`audio_start_ms`/`audio_end_ms`); items are Parley's utterances, `item_{utterance_id}`
  (a speech start names the utterance it will be);
- `transcript.partial` → `conversation.item.input_audio_transcription.delta` carrying the
  words the partial adds to what was already sent for its item (a partial that rewrites
  sent words adds nothing; the completed event carries the final text); each item keeps
  its own, so utterance N+1's deltas may come before N's final without either repeating;
- `transcript.final` → `input_audio_buffer.committed`, a last `delta`, then
  `conversation.item.input_audio_transcription.completed`;
- `error` → `error` (then the close with Parley's code). Client events a transcription
  session does not take are answered with an `error` event and the session goes on.

Turn detection: `server_vad` (the default) is Parley's silence rule, reported with its own
settings (values sent are not applied). `semantic_vad` is served by the turn model
(session/turn.py) when the server runs one: `eagerness` sets how sure the model must be
that the speaker has finished and how long an unfinished turn may pause (EAGERNESS);
without a turn model the session reports `server_vad`, what it gets. Set before the audio
starts; fixed after.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace
from typing import Any

import orjson
from starlette.responses import Response

from server.compat.bridge import Inbound, Message, audio, control, http_status
from wire.codes import CloseCode, Encoding, ErrorCode
from wire.errors import ProtocolError
from wire.keyterms import prompt_terms
from wire.query import StreamConfig

SAMPLE_RATE = 24_000  # the only PCM rate of OpenAI's realtime audio
CLIENT_ERROR = "invalid_request_error"
# semantic_vad's eagerness → (the turn model's threshold, the longest pause of an unfinished
# turn in seconds); None: the server's. `auto` is `medium`, as OpenAI defines it.
EAGERNESS: dict[str, tuple[float | None, float | None]] = {
    "low": (0.7, 2.0),
    "medium": (None, None),
    "auto": (None, None),
    "high": (0.3, 0.5),
}


@dataclass(frozen=True, slots=True)
class Vad:
    """Parley's own VAD settings, reported as the session's `server_vad` turn detection."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int

    def turn_detection(self) -> dict[str, Any]:
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
        }


@dataclass(frozen=True, slots=True)
class TranscriptionSession:
    """What the client configured (and what of it Parley honours)."""

    model: str
    language: str | None
    prompt: str
    manual_turns: bool  # turn_detection: null (Parley's VAD cuts utterances all the same)
    keyterms: tuple[str, ...] = ()  # the prompt's terms (`wire.keyterms.prompt_terms`)
    eagerness: str | None = None  # semantic_vad, served by the turn model; None: server_vad


def denial(error: ProtocolError) -> Response:
    """A refused handshake, in OpenAI's REST error format."""
    body = {"error": {"message": error.message, "type": _error_type(error), "code": error.code}}
    headers = {} if error.retry_after is None else {"retry-after": str(round(error.retry_after))}
    return Response(orjson.dumps(body), http_status(error), headers, media_type="application/json")


def _member(parent: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """`parent[key]` when it is an object, {} when absent or null, None when it is
    anything else (or `parent` is None)."""
    if parent is None:
        return None
    value = parent.get(key) or {}
    return value if isinstance(value, dict) else None


def _error_type(error: ProtocolError) -> str:
    return "server_error" if error.close_code in (1011, 1012, 1013) else CLIENT_ERROR


class RealtimeCodec:
    """One realtime transcription session's translation, both ways."""

    def __init__(
        self,
        *,
        session_id: str,
        beta: bool,
        vad: Vad,
        default_language: str,
        model: str,
        semantic: bool = False,
    ) -> None:
        self.session_id = session_id
        self.beta = beta
        self.vad = vad
        self.semantic = semantic  # the server runs a turn model: semantic_vad is served
        self.settings = TranscriptionSession(
            model=model, language=default_language, prompt="", manual_turns=False
        )
        self.started = False  # audio has reached the actor: the language is fixed
        self._events = 0
        self._utterances = ""  # the actor's session id: utterance ids are `{it}-{n}`
        self._next_index = 0
        self._item: str | None = None  # the item speech is being heard for
        self._sent: dict[str, str] = {}  # item → what its deltas have said so far
        self._committed: str | None = None

    def stream_config(self, meeting_id: str, participant: str) -> StreamConfig:
        eagerness = self.settings.eagerness
        threshold, hold = EAGERNESS[eagerness] if eagerness else (None, None)
        return StreamConfig(
            meeting_id=meeting_id,
            participant=participant,
            language=self.settings.language or "auto",
            sample_rate=SAMPLE_RATE,
            encoding=Encoding.PCM_S16LE,
            interim_results=True,
            keyterms=self.settings.keyterms,
            turn_model=eagerness is not None,
            turn_threshold=threshold,
            turn_hold=hold,
        )

    def created(self) -> str:
        kind = "transcription_session.created" if self.beta else "session.created"
        return self._event(kind, session=self._session())

    # ------------------------------------------------------------------ client → actor

    def from_client(self, message: Message) -> Inbound:
        text = message.get("text")
        if text is None:
            return Inbound(
                replies=[
                    self._error(
                        "binary frames are not taken: send audio as input_audio_buffer.append"
                    )
                ]
            )
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return Inbound(replies=[self._error("an event must be a JSON object with a type")])
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            self.started = True
            return Inbound([audio(_pcm(event.get("audio")))])
        if kind == "input_audio_buffer.commit":
            self.started = True
            return Inbound([control("finalize")])
        if kind == "input_audio_buffer.clear":
            return Inbound(replies=[self._event("input_audio_buffer.cleared")])
        if kind in ("session.update", "transcription_session.update"):
            before = self.settings.keyterms
            replies = self._update(event.get("session"))
            if not self.started or self.settings.keyterms == before:
                return Inbound(replies=replies)  # before audio: the stream starts with them
            update = {"type": "configure", "keyterms": list(self.settings.keyterms)}
            message = {"type": "websocket.receive", "text": orjson.dumps(update).decode()}
            return Inbound([message], replies)
        return Inbound(
            replies=[
                self._error(
                    f"{kind[:64]!r} is not supported by a transcription session",
                    event.get("event_id"),
                )
            ]
        )

    def _update(self, session: Any) -> list[str]:
        if not isinstance(session, dict):
            return [self._error("session.update needs a session object", param="session")]
        if self.beta or "input_audio_transcription" in session:
            fmt = session.get("input_audio_format", "pcm16")
            transcription = session.get("input_audio_transcription")
            turns = session.get("turn_detection", "unset")
        else:
            audio = _member(session, "audio")
            audio_in = _member(audio, "input")
            audio_format = _member(audio_in, "format")
            for value, path in ((audio, "session.audio"), (audio_in, "session.audio.input"),
                                (audio_format, "session.audio.input.format")):  # fmt: skip
                if value is None:  # a client's JSON of another shape
                    return [self._error(f"{path} must be an object", param=path)]
            assert audio_in is not None and audio_format is not None
            fmt = audio_format.get("type", "audio/pcm")
            rate = audio_format.get("rate", SAMPLE_RATE)
            if rate != SAMPLE_RATE:
                fmt = f"{fmt} at {rate} Hz"
            transcription = audio_in.get("transcription")
            turns = audio_in.get("turn_detection", "unset")
        if fmt not in ("pcm16", "audio/pcm"):
            return [
                self._error(
                    f"input audio format {str(fmt)[:40]!r} is not supported: send PCM16 at 24 kHz",
                    param="session.audio.input.format",
                    code="unsupported_audio_format",
                )
            ]
        settings = self.settings
        if isinstance(transcription, dict):
            language = transcription.get("language") or None
            if language != settings.language and self.started:
                return [
                    self._error(
                        "the language cannot change once audio has started",
                        param="session.audio.input.transcription.language",
                    )
                ]
            settings = replace(
                settings,
                model=str(transcription.get("model") or settings.model),
                language=None if language is None else str(language).split("-")[0].lower(),
                prompt=str(transcription.get("prompt") or ""),
            )
            try:
                settings = replace(settings, keyterms=prompt_terms(settings.prompt))
            except ProtocolError as exc:
                param = "session.audio.input.transcription.prompt"
                return [self._error(exc.message, param=param, code=exc.code.value)]
        if turns != "unset":
            settings = replace(settings, manual_turns=turns is None)
            if isinstance(turns, dict) and not self.started:
                eagerness = turns.get("eagerness") or "auto"
                semantic_vad = turns.get("type") == "semantic_vad"
                if semantic_vad and (not isinstance(eagerness, str) or eagerness not in EAGERNESS):
                    return [
                        self._error(
                            f"eagerness must be one of {', '.join(EAGERNESS)}",
                            param="session.audio.input.turn_detection.eagerness",
                            code="invalid_value",
                        )
                    ]
                semantic = semantic_vad and self.semantic
                settings = replace(settings, eagerness=str(eagerness) if semantic else None)
        self.settings = settings
        kind = "transcription_session.updated" if self.beta else "session.updated"
        return [self._event(kind, session=self._session())]

    # ------------------------------------------------------------------ actor → client

    def from_server(self, message: Message) -> list[str]:
        kind = message["type"]
        if kind == "session.started":
            self._utterances = message["session_id"]
        elif kind == "vad.speech_started":
            named = message.get("utterance_id")
            self._item = f"item_{named}" if named else self._item_id(self._next_index)
            return [
                self._event(
                    "input_audio_buffer.speech_started",
                    item_id=self._item,
                    audio_start_ms=round(message["t"] * 1000),
                )
            ]
        elif kind == "vad.speech_stopped":
            item = self._item or self._item_id(self._next_index)
            return [
                self._event(
                    "input_audio_buffer.speech_stopped",
                    item_id=item,
                    audio_end_ms=round(message["t"] * 1000),
                )
            ]
        elif kind == "transcript.partial":
            return self._delta(message, final=False)
        elif kind == "transcript.final":
            return self._completed(message)
        elif kind == "finalize.done":
            return self._commit_done(message["utterance_id"])
        elif kind == "error":
            kind = "server_error" if message["code"] in _SERVER_SIDE else CLIENT_ERROR
            return [self._error(message["message"], code=message["code"], kind=kind)]
        return []

    def _delta(self, message: Message, *, final: bool) -> list[str]:
        item = f"item_{message['utterance_id']}"
        if _index(message["utterance_id"]) >= self._next_index:
            self._item = item  # a later utterance's partial: speech is heard for it now
        self._next_index = max(self._next_index, _index(message["utterance_id"]))
        text: str = message["text"]
        sent = self._sent.get(item, "")
        if not text.startswith(sent):
            return []  # it rewrote what was sent: the completed event has the truth
        added = text[len(sent) :]
        if not final:  # the last word may still change: hold it back
            added = added[: added.rfind(" ") + 1] if " " in added.strip() else ""
        if not added:
            return []
        self._sent[item] = sent + added
        return [
            self._event(
                "conversation.item.input_audio_transcription.delta",
                item_id=item,
                content_index=0,
                delta=added,
            )
        ]

    def _completed(self, message: Message) -> list[str]:
        item = f"item_{message['utterance_id']}"
        committed = self._event(
            "input_audio_buffer.committed", item_id=item, previous_item_id=self._committed
        )
        self._committed = item
        deltas = self._delta(message, final=True)
        self._sent.pop(item, None)
        self._next_index = max(self._next_index, _index(message["utterance_id"]) + 1)
        if self._item == item:
            self._item = None
        usage = {"type": "duration", "seconds": round(message["end"] - message["start"], 3)}
        completed = self._event(
            "conversation.item.input_audio_transcription.completed",
            item_id=item,
            content_index=0,
            transcript=message["text"],
            usage=usage,
        )
        return [committed, *deltas, completed]

    def _commit_done(self, utterance_id: str | None) -> list[str]:
        """A commit is done: its item was completed with its final; or, when the guard
        found no speech in it, is completed empty now; or nothing was in progress."""
        if utterance_id is None:
            return [
                self._error(
                    "Error committing input audio buffer: no speech in progress to commit",
                    code="input_audio_buffer_commit_empty",
                )
            ]
        if f"item_{utterance_id}" == self._committed:
            return []
        empty = {"utterance_id": utterance_id, "text": "", "start": 0.0, "end": 0.0}
        return self._completed(empty)

    # ------------------------------------------------------------------ helpers

    def _item_id(self, index: int) -> str:
        return f"item_{self._utterances}-{index}"

    def _session(self) -> dict[str, Any]:
        s = self.settings
        transcription = {"model": s.model, "language": s.language, "prompt": s.prompt}
        turns = None if s.manual_turns else self.vad.turn_detection()
        if turns is not None and s.eagerness is not None:
            turns = {"type": "semantic_vad", "eagerness": s.eagerness}
        if self.beta:
            return {
                "id": self.session_id,
                "object": "realtime.transcription_session",
                "input_audio_format": "pcm16",
                "input_audio_transcription": transcription,
                "turn_detection": turns,
                "input_audio_noise_reduction": None,
                "include": [],
            }
        return {
            "type": "transcription",
            "id": self.session_id,
            "object": "realtime.transcription_session",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": SAMPLE_RATE},
                    "transcription": transcription,
                    "turn_detection": turns,
                    "noise_reduction": None,
                }
            },
            "include": [],
        }

    def _event(self, kind: str, **fields: Any) -> str:
        self._events += 1
        return orjson.dumps({"type": kind, "event_id": f"event_{self._events}", **fields}).decode()

    def _error(
        self,
        message: str,
        event_id: Any = None,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
    ) -> str:
        error = {
            "type": kind or CLIENT_ERROR,
            "code": code,
            "message": message,
            "param": param,
            "event_id": event_id if isinstance(event_id, str) else None,
        }
        return self._event("error", error=error)

    def farewell(self, error: ProtocolError) -> str:
        return self._error(error.message, code=error.code.value, kind=_error_type(error))


_SERVER_SIDE = {ErrorCode.INTERNAL.value, ErrorCode.OVERLOADED.value, ErrorCode.SHUTTING_DOWN.value}


def _index(utterance_id: str) -> int:
    return int(utterance_id.rsplit("-", 1)[1])


def _pcm(data: Any) -> bytes:
    """The audio of an append: base64, strictly (anything else is invalid audio, 1007)."""
    try:
        if not isinstance(data, str):
            raise ValueError("no audio")
        return base64.b64decode(data, validate=True)
    except (ValueError, binascii.Error):
        raise ProtocolError(
            ErrorCode.INVALID_AUDIO,
            CloseCode.INVALID_PAYLOAD,
            "input_audio_buffer.append needs audio: base64 PCM16 at 24 kHz",
        ) from None
