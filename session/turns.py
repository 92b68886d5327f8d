"""A live stream's pipeline, its segmenter settings, and turn messages.

The server's segmenter config holds its turn model's settings (`turn_silence` 0: none is
loaded); a stream narrows them: no partials without `interim_results`, its own threshold,
eager threshold and hold (the compat adapters map their vendors' options onto them); it
gets turn events (`AudioPipeline(turn_events=...)`) only when it asks for them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from engine.api import Transcription
from session.audio import FrameDecoder
from session.pipeline import AudioPipeline, TurnWords, seconds
from session.segmenter import SegmenterConfig, TurnCheck, TurnEnded, TurnResumed
from session.services import SessionServices
from session.turn_words import ends_unfinished
from session.vad import VadState
from wire import build
from wire.messages import ServerMessage
from wire.query import StreamConfig

TurnEvent = TurnEnded | TurnResumed  # what becomes a turn message
logger = logging.getLogger(__name__)

Speculated = Callable[[float], Awaitable[Transcription | None]]  # `Speculator.transcription`


def stream_segmenter(services: SessionServices, config: StreamConfig) -> SegmenterConfig:
    """The segmenter config of one live stream."""
    segmenter = services.segmenter
    if not config.interim_results:
        segmenter = dataclasses.replace(segmenter, partial_interval=0.0)
    if services.turns is None or not config.turn_model:
        segmenter = dataclasses.replace(segmenter, turn_silence=0.0)
    threshold = config.turn_threshold or segmenter.turn_threshold
    hold = segmenter.turn_hold if config.turn_hold is None else config.turn_hold
    return dataclasses.replace(
        segmenter,
        turn_threshold=threshold,
        turn_eager=min(config.turn_eager, threshold),
        turn_hold=max(hold, segmenter.min_silence),
    )


def live_pipeline(
    services: SessionServices,
    config: StreamConfig,
    *,
    start_sample: int,
    first_index: int,
    vad_start: VadState | None,
    speculated: Speculated,
) -> AudioPipeline:
    """A live stream's pipeline: its decoder, the shared VAD, its segmenter, the turn model
    (when the server runs one), its turn events (when it asks) and, with TURN_WORDS, the
    words so far: `speculated(timeout)`, the utterance's speculative final."""
    segmenter = stream_segmenter(services, config)
    words: TurnWords | None = None
    if segmenter.turn_silence and services.turn_words:
        # Waited for no longer than the silence rule would take to end the utterance.
        wait = segmenter.min_silence - segmenter.turn_silence

        async def words(check: TurnCheck) -> bool:
            asked = time.perf_counter()
            heard = await speculated(wait)
            text = None if heard is None else heard.text
            unfinished = heard is not None and ends_unfinished(heard.text, heard.language)
            logger.debug(
                "turn %d: words %r, unfinished %s (waited %.0f ms)",
                check.index, text, unfinished, (time.perf_counter() - asked) * 1000,
            )  # fmt: skip
            return unfinished

    return AudioPipeline(
        FrameDecoder(config.encoding, config.sample_rate),
        services.vad,
        segmenter,
        start_sample=start_sample,
        first_index=first_index,
        telemetry=services.telemetry,
        vad_start=vad_start,
        turns=services.turns,
        turn_events=config.turn_events,
        turn_words=words,
    )


def turn_message(session_id: str, event: TurnEvent) -> ServerMessage:
    """`turn.ended` / `turn.resumed` for a segmenter's turn event."""
    utterance_id = f"{session_id}-{event.index}"
    if isinstance(event, TurnResumed):
        return build.turn_resumed(utterance_id, seconds(event.sample))
    return build.turn_ended(
        utterance_id, seconds(event.sample), event.probability, eager=event.eager
    )
