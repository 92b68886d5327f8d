"""Load-adaptive partial cadence: partials thin out as the recognition queue grows.

The segmenter proposes a partial every `partial_interval` of speech. Under load each
partial competes with finals for the model, so the policy lets one through only when
the audio since the last one it let through is at least

    interval × (1 + stretch × max(0, load − knee))

where `load` is the scheduler's: the model's recent utilization (0..1) plus queued
requests per batch slot. Below the knee partials keep their cadence; past `max_load`
they stop until the model catches up. Finals are never affected. Sans-I/O: numbers in,
a decision out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartialPolicyConfig:
    interval: float = 0.8  # seconds of audio between partials when idle
    stretch: float = 4.0  # how fast the interval grows with load past the knee
    knee: float = 0.5  # load below which partials keep their cadence
    max_load: float = 1.25  # above this, no partials at all

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.stretch < 0 or self.max_load <= 0:
            raise ValueError("need interval > 0, stretch >= 0, max_load > 0")


class PartialPolicy:
    """One per session: remembers where its last admitted partial ended."""

    def __init__(self, config: PartialPolicyConfig) -> None:
        self.config = config
        self._last_end: float | None = None
        self._utterance: int | None = None

    def admit(self, utterance: int, end: float, load: float) -> bool:
        """Should the partial of `utterance` ending at `end` seconds be submitted now?"""
        if load > self.config.max_load:
            return False
        if utterance != self._utterance:  # a new utterance: its first partial is due
            self._utterance = utterance
            self._last_end = None
        if self._last_end is not None:
            excess = max(0.0, load - self.config.knee)
            needed = self.config.interval * (1 + self.config.stretch * excess)
            if end - self._last_end < needed - 1e-9:
                return False
        self._last_end = end
        return True
