"""The one builder of every server → client message (wire.messages has their types).

Callers pass values in their own units (seconds, counts); the builder owns the message's
fields, their order and the precision of timings. `encode` turns any of them into the
JSON text frame that goes out.
"""

from __future__ import annotations

from typing import Any

import orjson

from wire.codes import PROTOCOL_VERSION, ErrorCode
from wire.messages import (
    ErrorMessage,
    Final,
    FinalizeDone,
    ServerMessage,
    SessionEnded,
    SessionLanguage,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    Timing,
    TranscriptFinal,
    TranscriptPartial,
    TranscriptSpeaker,
    Usage,
)
from wire.timeline import wall_time

TIMING_DIGITS = 4  # a final's server-side timings, in seconds: 0.1 ms


def encode(message: ServerMessage) -> str:
    return orjson.dumps(message).decode()


def session_started(
    *,
    session_id: str,
    meeting_id: str,
    participant: str,
    config: dict[str, Any],
    resume_token: str,
    resume_from: float,
    resumed: bool,
    last_seq: int,
    origin: float | None = None,
    send_from: float | None = None,
) -> SessionStarted:
    started: SessionStarted = {
        "type": "session.started",
        "protocol": PROTOCOL_VERSION,
        "session_id": session_id,
        "meeting_id": meeting_id,
        "participant": participant,
        "config": config,
        "resume_token": resume_token,
        "resume_from": resume_from,
        "resumed": resumed,
        "last_seq": last_seq,
    }
    if origin is not None:
        started["origin"] = origin
    if send_from is not None:
        started["send_from"] = send_from
    return started


def session_language(language: str, probability: float | None, utterances: int) -> SessionLanguage:
    return {
        "type": "session.language",
        "language": language,
        "probability": probability,
        "utterances": utterances,
    }


def speech_started(t: float, utterance_id: str) -> SpeechStarted:
    """`utterance_id`: the id the speech's final will carry, if it makes one."""
    return {"type": "vad.speech_started", "t": t, "utterance_id": utterance_id}


def speech_stopped(t: float) -> SpeechStopped:
    return {"type": "vad.speech_stopped", "t": t}


def transcript_partial(
    *, utterance_id: str, participant: str, text: str, start: float, end: float
) -> TranscriptPartial:
    return {
        "type": "transcript.partial",
        "utterance_id": utterance_id,
        "participant": participant,
        "text": text,
        "start": start,
        "end": end,
    }


def timing(*, queue: float, inference: float, total: float) -> Timing:
    return {
        "queue": round(queue, TIMING_DIGITS),
        "inference": round(inference, TIMING_DIGITS),
        "total": round(total, TIMING_DIGITS),
    }


def transcript_final(final: Final, timing: Timing | None = None) -> TranscriptFinal:
    """A final as sent live (with the server's `timing`) or read back (without)."""
    message: TranscriptFinal = {
        "type": "transcript.final",
        "utterance_id": final.utterance_id,
        "seq": final.seq,
        "participant": final.participant,
        "text": final.text,
        "start": final.start,
        "end": final.end,
        "language": final.language,
    }
    if final.words:
        message["words"] = final.words
    wall = wall_time(final)
    if wall is not None:
        message["wall_time"] = wall
    if final.speaker is not None:
        message["speaker"] = final.speaker
    if timing is not None:
        message["timing"] = timing
    return message


def transcript_speaker(utterance_id: str, speaker: str) -> TranscriptSpeaker:
    return {"type": "transcript.speaker", "utterance_id": utterance_id, "speaker": speaker}


def error(code: ErrorCode, message: str, *, retry_after: float | None = None) -> ErrorMessage:
    built: ErrorMessage = {"type": "error", "code": code.value, "message": message}
    if retry_after is not None:
        built["retry_after"] = retry_after
    return built


def finalize_done(utterance_id: str | None) -> FinalizeDone:
    """Internal: a `finalize` is done (see wire.messages.FinalizeDone)."""
    return {"type": "finalize.done", "utterance_id": utterance_id}


def session_ended(
    *, reason: str, audio_seconds: float, utterances: int, finals: int, finals_lost: int = 0
) -> SessionEnded:
    """`finals_lost`: utterances cut whose final was neither logged nor sent."""
    return {
        "type": "session.ended",
        "reason": reason,
        "audio_seconds": audio_seconds,
        "utterances": utterances,
        "finals": finals,
        "finals_lost": finals_lost,
        "usage": usage(audio_seconds),
    }


def usage(audio_seconds: float) -> Usage:
    """What a stream or an upload was billed: its seconds of audio heard."""
    return {"audio_seconds": round(audio_seconds, 3)}
