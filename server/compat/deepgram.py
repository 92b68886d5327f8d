"""Deepgram's live streaming protocol (`/v1/listen`) as a translation of protocol v1.

Sans-I/O: `parse_options` reads the query string, `DeepgramCodec` turns Deepgram client
frames into protocol v1 frames and protocol v1 server messages into Deepgram's
(`Results`, `SpeechStarted`, `UtteranceEnd`, `Metadata`, `Error`). docs/compat.md is the
contract: what is honoured, what is accepted and ignored, what is refused (HTTP 400).

Mapping:
- audio: binary frames pass through (linear16 at `sample_rate`); an empty binary frame is
  Deepgram's old way to close the stream and means `CloseStream`;
- `KeepAlive` → `keepalive`, `Finalize` → `finalize`, `CloseStream` → `stop`;
- `keyterm` and `keywords` (boosts dropped) → the stream's keyterms; `Configure` with
  `keyterms` → `configure` (answered `ConfigureSuccess`, or `ConfigureFailure` when the
  list is refused: the stream goes on with the keyterms it had);
- `transcript.partial` → `Results` with `is_final: false`; `transcript.final` → `Results`
  with `is_final: true`, `speech_final: true` when the VAD heard the speech stop inside
  the utterance (a long utterance cut while speech goes on is not speech-final, nor one a
  `Finalize` cut in mid-speech), and `from_finalize: true` on the final a `Finalize`
  closed (or on an empty `Results` when there was nothing to close): the actor
  acknowledges each finalize in order, and the messages that come meanwhile wait for
  that acknowledgement, so each `Finalize` gets its own answer;
- the VAD's stops wait in order for the final they fall in (the next utterance's stop may
  come before this one's final);
- `vad.speech_started` → `SpeechStarted` (`vad_events=true`); a final in which the speech
  stopped is followed by `UtteranceEnd` (`utterance_end_ms` set, whatever `endpointing`
  says: Deepgram's advice for noisy audio is `endpointing=false` with it);
  `session.ended` → `Metadata`;
- `channels=N` interleaved linear16: mixed down to mono, or with `multichannel=true` one
  stream and one codec per channel (`channel=c`, server/compat/deepgram_channels.py);
- `redact`, `numerals` (`smart_format`), `profanity_filter`: the stream's text options
  (session/text_filter.py), applied before the text reaches this codec;
- `punctuate=true`: Whisper's text, each final starting with a capital letter and a
  speech-final one ending with a full stop where Whisper left it bare (tiny.en sometimes
  writes a sentence on in lower case after the one before it).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from server.compat.bridge import Inbound, Message, audio, control
from server.compat.deepgram_errors import error_message
from server.compat.deepgram_text import capitalized, ended, plain, sentence
from session.channels import mix_down
from wire.codes import (
    DEFAULT_SAMPLE_RATE,
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    CloseCode,
    Encoding,
    ErrorCode,
)
from wire.errors import ProtocolError
from wire.keyterms import keyterms_field, parse_keyterms
from wire.query import StreamConfig, channel_participants, parse_channels, validate_id
from wire.text_options import PLAIN, TEXT_FLAGS, TextOptions, parse_text_options

MAX_UTTERANCE_END_MS = 60_000
_LANGUAGE = re.compile(r"^([a-z]{2,3})(-[A-Za-z0-9]{1,8})*$")
_TRUE, _FALSE = "true", "false"
# Refused: honouring them is impossible here (ignoring them: results lost elsewhere).
_REFUSED = {
    "callback": "callbacks are not supported: results come on this socket",
    "callback_method": "callbacks are not supported: results come on this socket",
}


def bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, message)


@dataclass(frozen=True, slots=True)
class DeepgramOptions:
    """The query parameters Parley honours, validated."""

    meeting_id: str
    participant: str | None  # None: "speaker" or a meeting token's; multichannel: "ana,bo"
    language: str  # a code the model takes, or "auto" (Deepgram's `multi`)
    sample_rate: int
    interim_results: bool
    punctuate: bool  # `punctuate` or `smart_format`: Whisper's text as it is
    diarize: bool
    vad_events: bool
    endpointing: bool  # false: no result is speech-final
    utterance_end_ms: int | None
    model: str | None  # reported back, not chosen: the server runs one model
    keyterms: tuple[str, ...] = ()  # `keyterm`s and `keywords` (their boosts dropped)
    channels: int = 1  # interleaved in the audio: one source each, or mixed down to mono
    multichannel: bool = False

    def channel_names(self) -> tuple[str, ...]:
        """Each channel's participant, with `multichannel` and more than one channel."""
        if not self.multichannel or self.channels == 1:
            return ()
        return channel_participants(self.participant or "speaker", self.channels)

    text: TextOptions = PLAIN  # `redact`, `numerals`/`smart_format`, `profanity_filter`

    def stream_config(self) -> StreamConfig:
        return StreamConfig(
            meeting_id=self.meeting_id,
            participant=self.participant or "speaker",
            language=self.language,
            sample_rate=self.sample_rate,
            encoding=Encoding.PCM_S16LE,
            interim_results=self.interim_results,
            diarize=self.diarize,
            keyterms=self.keyterms,
            text=self.text,
        )


def _flag(query: Mapping[str, str], name: str, default: bool) -> bool:
    raw = query.get(name)
    if raw is None:
        return default
    if raw.lower() not in (_TRUE, _FALSE):
        raise bad(f"{name} must be true or false, not {raw[:32]!r}")
    return raw.lower() == _TRUE


def _integer(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 9:
        raise bad(f"{name} must be a non-negative integer, not {raw[:32]!r}")
    return int(raw)


def parse_options(
    query: Mapping[str, str],
    *,
    meeting_id: str,
    default_language: str,
    keyterms: Sequence[str] = (),
    keywords: Sequence[str] = (),
    max_channels: int = 1,
    redact: Sequence[str] = (),
) -> DeepgramOptions:
    """Validate the query string (`keyterms`, `keywords`, `redact`: the parameters that
    repeat); ProtocolError (bad_config: HTTP 400) on a malformed value or a feature Parley
    cannot honour (`redact=pii`), too_many_keyterms past the keyterms' bounds; the rest
    (filler_words, tag, ...) is accepted and ignored, as are unknown ones (docs/compat.md)."""
    for name, why in _REFUSED.items():
        if name in query:
            raise bad(f"{name}: {why}")
    encoding = query.get("encoding", "linear16")
    if encoding != "linear16":
        raise bad(f"encoding {encoding[:32]!r} is not supported: send raw linear16 PCM")
    channels = parse_channels(query.get("channels"), max_channels)
    sample_rate = _integer(query, "sample_rate") or DEFAULT_SAMPLE_RATE
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise bad(f"sample_rate must lie in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    endpointing = query.get("endpointing")
    if endpointing is not None and endpointing.lower() not in (_TRUE, _FALSE):
        _integer(query, "endpointing")  # a number of milliseconds: Parley's VAD decides
    utterance_end_ms = _integer(query, "utterance_end_ms")
    if utterance_end_ms is not None and not 0 < utterance_end_ms <= MAX_UTTERANCE_END_MS:
        raise bad(f"utterance_end_ms must lie in 1..{MAX_UTTERANCE_END_MS}")
    participant = query.get("participant")
    multichannel = _flag(query, "multichannel", False)
    if participant is not None:  # one name, or (multichannel) one for each channel
        channel_participants(participant, channels if multichannel else 1)
    return DeepgramOptions(
        meeting_id=validate_id("meeting_id", meeting_id),
        participant=participant,
        language=_language(query.get("language", default_language)),
        sample_rate=sample_rate,
        interim_results=_flag(query, "interim_results", False),
        punctuate=_flag(query, "punctuate", False) or _flag(query, "smart_format", False),
        diarize=_flag(query, "diarize", False) or "diarize_model" in query,
        vad_events=_flag(query, "vad_events", False),
        endpointing=(endpointing or "").lower() != _FALSE,
        utterance_end_ms=utterance_end_ms,
        model=query.get("model"),
        keyterms=parse_keyterms([*keyterms, *keyword_terms(keywords)]),
        channels=channels,
        multichannel=multichannel,
        text=parse_text_options(redact, **{n: query.get(n) for n in TEXT_FLAGS}),
    )


def _language(tag: str) -> str:
    """A BCP-47 tag (`en-US`) → its language (`en`); `multi` → `auto`."""
    if tag in ("multi", "auto"):
        return "auto"
    match = _LANGUAGE.match(tag)
    if match is None:
        raise bad("language must be a BCP-47 tag such as 'en' or 'en-US', or 'multi'")
    return match.group(1)


class DeepgramCodec:
    """One `/v1/listen` stream's translation, both ways."""

    def __init__(
        self, options: DeepgramOptions, *, request_id: str, model_name: str, channel: int = 0
    ) -> None:
        self.options = options
        self._index = [channel, options.channels if options.multichannel else 1]
        self.request_id = request_id
        self.created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self._sha256 = hashlib.sha256()
        self._model_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"parley:{model_name}"))
        self._model_info = {
            "name": options.model or model_name,
            "version": model_name,
            "arch": "parley",
        }
        self._finalizes = 0  # Finalize messages not yet acknowledged by the actor
        self._held: list[Message] = []  # Deepgram messages waiting for that acknowledgement
        self._speech_stopped: deque[float] = deque()  # VAD stops not yet in a final
        self._last_end = 0.0
        self._speakers: dict[Any, int] = {}
        self._keyterms = options.keyterms  # those in effect (a Configure replaces them)

    # ------------------------------------------------------------------ client → actor

    def from_client(self, message: Message) -> Inbound:
        data: bytes | None = message.get("bytes")
        if data is not None:
            if not data:
                return Inbound([control("stop")])
            self._sha256.update(data)
            if self.options.channels > 1 and not self.options.multichannel:
                data = mix_down(data, self.options.channels, Encoding.PCM_S16LE)  # as Deepgram
            return Inbound([audio(data)])
        text = message.get("text") or ""
        try:
            kind = orjson.loads(text).get("type")
        except (orjson.JSONDecodeError, AttributeError):
            kind = None
        if kind == "KeepAlive":
            return Inbound([control("keepalive")])
        if kind == "Finalize":
            self._finalizes += 1
            return Inbound([control("finalize")])
        if kind == "CloseStream":
            return Inbound([control("stop")])
        if kind == "Configure":
            return self._configure(orjson.loads(text))
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            CloseCode.INVALID_PAYLOAD,
            "a text frame must be a JSON object with type KeepAlive, Finalize, CloseStream "
            "or Configure",
        )

    def _configure(self, data: dict[str, Any]) -> Inbound:
        """Deepgram's `Configure`: `keyterms` (a list) replaces the stream's, null or
        absent keeps them; answered `ConfigureSuccess` with the keyterms in effect, or
        `ConfigureFailure` (the stream goes on with its keyterms unchanged)."""
        try:
            terms = self._keyterms if data.get("keyterms") is None else keyterms_field(data)
        except ProtocolError as exc:
            failure = {
                "type": "ConfigureFailure",
                "request_id": self.request_id,
                "err_code": exc.code.value,
                "err_msg": exc.message,
            }
            return Inbound(replies=[self._dumps(failure)])
        self._keyterms = terms
        success = {
            "type": "ConfigureSuccess",
            "request_id": self.request_id,
            "keyterms": list(terms),
        }
        forward = {"type": "configure", "keyterms": list(terms)}
        return Inbound(
            [{"type": "websocket.receive", "text": orjson.dumps(forward).decode()}],
            [self._dumps(success)],
        )

    # ------------------------------------------------------------------ actor → client

    def from_server(self, message: Message) -> list[str]:
        kind = message["type"]
        out: list[Message] = []
        if kind == "vad.speech_started" and self.options.vad_events:
            out.append({"type": "SpeechStarted", "channel": self._index, "timestamp": message["t"]})
        elif kind == "vad.speech_stopped":
            self._speech_stopped.append(message["t"])
        elif kind == "transcript.partial":
            out.append(self._results(message, is_final=False, speech_final=False))
        elif kind == "transcript.final":
            out += self._final(message)
        elif kind == "finalize.done":
            return self._release(message["utterance_id"])
        elif kind == "error":
            return [*self._release_all(), error_message(message["code"], message["message"])]
        elif kind == "session.ended":
            return [*self._release_all(), self._dumps(self._metadata(message))]
        if self._finalizes:
            self._held += out
            return []
        return [self._dumps(m) for m in out]

    def _final(self, message: Message) -> list[Message]:
        """A final's Results (speech-final if a stop the VAD heard falls in it, with
        endpointing on), then UtteranceEnd if the speech stopped in it (utterance_end_ms).
        The stops up to its end are its own (or an earlier, emptied utterance's)."""
        stopped = False
        while self._speech_stopped and self._speech_stopped[0] <= message["end"] + 0.001:
            stopped |= message["start"] <= self._speech_stopped.popleft()
        speech_final = self.options.endpointing and stopped
        self._last_end = message["end"]
        results = self._results(message, is_final=True, speech_final=speech_final)
        if stopped and self.options.utterance_end_ms is not None:
            end = {
                "type": "UtteranceEnd",
                "channel": self._index,
                "last_word_end": message["end"],
            }
            return [results, end]
        return [results]

    def _release(self, utterance_id: str | None) -> list[str]:
        """The actor acknowledged the oldest Finalize: mark the final it produced."""
        self._finalizes = max(0, self._finalizes - 1)
        marked = False
        for held in self._held:
            mine = utterance_id is not None and held.get("_utterance_id") == utterance_id
            if held.get("is_final") and mine:
                held["from_finalize"] = marked = True
        if not marked:  # nothing was in progress, or it was not speech: say it is done
            empty = {
                "type": "transcript.final",
                "text": "",
                "start": self._last_end,
                "end": self._last_end,
            }
            self._held.append(self._results(empty, is_final=True, speech_final=False))
            self._held[-1]["from_finalize"] = True
        if self._finalizes:
            return []
        return self._release_all()

    def _release_all(self) -> list[str]:
        self._finalizes = 0
        held, self._held = self._held, []
        return [self._dumps(m) for m in held]

    def _results(self, message: Message, *, is_final: bool, speech_final: bool) -> Message:
        text = message["text"]
        words = [self._word(w, message.get("speaker")) for w in message.get("words") or []]
        if self.options.punctuate and is_final and words:
            first, last = words[0], words[-1]
            first["punctuated_word"] = capitalized(first["punctuated_word"])
            if speech_final:
                last["punctuated_word"] = ended(last["punctuated_word"])
        confidences = [w["confidence"] for w in words]
        start = message["start"]
        if self.options.punctuate and is_final:
            text = sentence(text, ending=speech_final)
        alternative: Message = {
            "transcript": text if self.options.punctuate else plain(text),
            "confidence": round(sum(confidences) / len(confidences), 4) if confidences else 1.0,
            "words": words,
        }
        if self.options.diarize and message.get("speaker") is not None:
            alternative["speaker"] = self._speaker(message["speaker"])  # words may be empty
        return {
            "type": "Results",
            "channel_index": self._index,
            "duration": round(message["end"] - start, 3),
            "start": start,
            "is_final": is_final,
            "speech_final": speech_final,
            "from_finalize": False,
            "channel": {"alternatives": [alternative]},
            "metadata": {
                "request_id": self.request_id,
                "model_info": self._model_info,
                "model_uuid": self._model_uuid,
            },
            "_utterance_id": message.get("utterance_id"),
        }

    def _word(self, word: Message, speaker: Any) -> Message:
        text = str(word.get("word", "")).strip()
        out: Message = {
            "word": plain(text),
            "start": word["start"],
            "end": word["end"],
            "confidence": word.get("probability", 1.0),
        }
        if self.options.punctuate:
            out["punctuated_word"] = text
        label = word.get("speaker", speaker)
        if self.options.diarize and label is not None:
            out["speaker"] = self._speaker(label)
        return out

    def _speaker(self, label: Any) -> int:
        """Parley's speaker labels ("S1", "S2", ...) as Deepgram's 0, 1, ... in order."""
        return self._speakers.setdefault(label, len(self._speakers))

    def _metadata(self, ended: Message) -> Message:
        return {
            "type": "Metadata",
            "transaction_key": "deprecated",
            "request_id": self.request_id,
            "sha256": self._sha256.hexdigest(),
            "created": self.created,
            "duration": ended["audio_seconds"],
            "channels": self.options.channels,
            "models": [self._model_uuid],
            "model_info": {self._model_uuid: self._model_info},
        }

    @staticmethod
    def _dumps(message: Message) -> str:
        message.pop("_utterance_id", None)
        return orjson.dumps(message).decode()


def keyword_terms(values: Iterable[str]) -> list[str]:
    """Deepgram's `keywords` (`word` or `word:boost`) as keyterms: the boost is dropped
    (Parley's bonus is fixed), and a keyword with a negative boost (Deepgram: suppress
    it) is not a keyterm."""
    terms = []
    for value in values:
        word, _, boost = value.rpartition(":")
        try:
            if boost and word and float(boost) < 0:
                continue
            terms.append(word if word and boost else value)
        except ValueError:
            terms.append(value)  # a colon that is part of the word
    return terms
