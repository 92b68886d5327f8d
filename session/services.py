"""What every session shares, owned by the server's lifespan."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.api import Recognition, SpeakerEmbedding
from session.diarizer import DiarizerConfig
from session.enrolled import DEFAULT_THRESHOLD
from session.segmenter import SegmenterConfig
from session.telemetry import NullTelemetry, Telemetry
from session.turn import TurnScorer
from session.vad import DirectScorer, SileroVad, VadScorer
from store.api import Store

DIARIZATION_OFF = "diarization is off on this server (PARLEY_DIARIZATION=false)"


@dataclass(frozen=True, slots=True)
class SessionServices:
    """Shared by every live session and file transcription; no per-session state."""

    scheduler: Recognition
    store: Store
    vad: VadScorer
    segmenter: SegmenterConfig
    max_frame_bytes: int
    outbox_limit: int
    languages: frozenset[str]  # what the recognizer transcribes (`{'en'}`: English only)
    # Each utterance is decoded after its source's previous finals (Committer: prompts).
    prompts: bool = False
    # Most seconds of a source's previous utterance heard before each final (0: off).
    left_context: float = 0.0
    # Keep left context once a stream's client has flushed (False: its later finals go
    # without, as a voice agent waits on each: CONTEXT_AFTER_FLUSH).
    context_after_flush: bool = False
    # Most seconds a live final waits for the one before it (its prompt or context).
    context_wait: float = 1.0
    # The languages whose sources' finals carry left context; None: every language.
    context_languages: frozenset[str] | None = frozenset({"en"})
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    clock: Callable[[], float] = time.monotonic
    # Speaker embeddings for `diarize=true` sources; None: diarization is off, and
    # `speakers_off` says why (a `diarize=true` request is refused with it).
    speakers: SpeakerEmbedding | None = None
    speakers_off: str = DIARIZATION_OFF
    diarizer: DiarizerConfig = field(default_factory=DiarizerConfig)
    # How alike a voice must be to an enrolled speaker to show its name.
    speaker_match: float = DEFAULT_THRESHOLD
    # The turn model that ends live utterances at a short silence (session/turn.py);
    # None: the fixed silence rule alone.
    turns: TurnScorer | None = None
    # With the turn model, a live turn whose speculative final stops where a sentence
    # cannot end waits, whatever the model says (session/turn_words.py).
    turn_words: bool = True


def offline_services(
    scheduler: Recognition, store: Store, languages: frozenset[str] = frozenset({"en"})
) -> SessionServices:
    """Services for transcribing files outside the server (benchmarks, tests): Silero VAD
    scored in the calling thread, the default segmenter, and frame and outbox limits that a
    file transcription never reaches."""
    return SessionServices(
        scheduler=scheduler,
        store=store,
        vad=DirectScorer(SileroVad()),
        segmenter=SegmenterConfig(),
        max_frame_bytes=1 << 20,
        outbox_limit=100,
        languages=languages,
    )
