"""The turn model's settings: end of turn by a model for streams that send no flush."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from server.settings.base import SettingError, setting, within


@dataclass(frozen=True, slots=True)
class TurnSettings:
    TITLE: ClassVar[str] = "End of turn"

    turn_model: bool = setting(
        False,
        "Let a model (smart-turn v3.2, from the pipecat-ai wheel: `pip install --no-deps "
        "pipecat-ai==1.14.0`) decide at TURN_SILENCE_MS whether a live speaker has finished: "
        "a complete turn's utterance ends there, an incomplete one waits up to TURN_HOLD_MS "
        "of silence. Off: MIN_SILENCE_MS ends every utterance. docs/performance.md: end of "
        "turn.",
    )
    turn_silence_ms: float = setting(
        192.0,
        "Silence after which the turn model is asked (counted in 32 ms VAD windows; below "
        "MIN_SILENCE_MS).",
    )
    turn_hold_ms: float = setting(
        1000.0,
        "Most silence an utterance the turn model judged incomplete waits for more speech "
        "(at least MIN_SILENCE_MS).",
    )
    turn_threshold: float = setting(
        0.5, "The turn model's probability of a complete turn from which the utterance ends."
    )
    turn_words: bool = setting(
        True,
        "With the turn model, also ask the words so far (the utterance's speculative final, "
        "when decoded by the time the silence rule would end it): an English turn that "
        "stops on an article, a conjunction, 'of', 'to', 'than' or a modal verb ('we "
        "should') waits as an incomplete one does, whatever the model says. "
        "docs/performance.md: end of turn.",
    )

    def __post_init__(self) -> None:
        within(self, "turn_silence_ms", 32.0, 1000.0, " ms")
        within(self, "turn_hold_ms", self.turn_silence_ms, 10_000.0, " ms")
        if not 0 < self.turn_threshold <= 1:
            raise SettingError("turn_threshold", self.turn_threshold, "must lie in (0, 1]")
