"""Per-source language detection for `language=auto`: decide once, then pin (sans-I/O).

The recognizer detects the language of every utterance that does not pin one, at no
extra model cost (see `engine.whisper`). A source's first utterances are therefore each
detected on their own; `LanguageDetector` takes their results in utterance order and
says when to pin: at the first utterance detected with at least `confidence`, or else
after `max_utterances` utterances, the language with the largest summed probability. A
stream that ends before either asks `decide()` for the best it has seen. Utterances the
hallucination guard emptied are not evidence and are not given to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_CONFIDENCE = 0.7
DEFAULT_MAX_UTTERANCES = 3


@dataclass(frozen=True, slots=True)
class LanguagePinned:
    language: str
    # The deciding utterance's probability of `language`; for a vote, the language's summed
    # probability over the utterances seen, divided by their number.
    probability: float
    utterances: int  # how many utterances were looked at


@dataclass(slots=True)
class LanguageDetector:
    confidence: float = DEFAULT_CONFIDENCE
    max_utterances: int = DEFAULT_MAX_UTTERANCES
    _votes: dict[str, float] = field(default_factory=dict)
    _seen: int = 0
    _pinned: LanguagePinned | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} is not in (0, 1]")
        if self.max_utterances < 1:
            raise ValueError(f"max_utterances must be >= 1, got {self.max_utterances}")

    @property
    def pinned(self) -> LanguagePinned | None:
        return self._pinned

    def observe(self, language: str, probability: float) -> LanguagePinned | None:
        """One utterance's detected language; the pin when this utterance decides it."""
        if self._pinned is not None:
            raise RuntimeError(f"language already pinned to {self._pinned.language!r}")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability {probability} is not in [0, 1]")
        self._seen += 1
        self._votes[language] = self._votes.get(language, 0.0) + probability
        if probability >= self.confidence:
            self._pinned = LanguagePinned(language, probability, self._seen)
        elif self._seen >= self.max_utterances:
            self._pinned = self._best()
        return self._pinned

    def decide(self) -> LanguagePinned | None:
        """The pin, forced from what was seen (None if nothing was)."""
        if self._pinned is None and self._seen:
            self._pinned = self._best()
        return self._pinned

    def _best(self) -> LanguagePinned:
        language = max(self._votes, key=lambda code: self._votes[code])
        return LanguagePinned(language, self._votes[language] / self._seen, self._seen)
