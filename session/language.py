"""Per-source language detection for `language=auto`: decide once, then pin (sans-I/O).

The recognizer detects the language of every utterance that does not pin one, at no
extra model cost (see `engine.whisper.recognizer`). A source's first utterances are therefore each
detected on their own; `LanguageDetector` takes their results in utterance order and
says when to pin: at the first utterance detected with at least `confidence`, or else
after `max_utterances` utterances, the language with the largest summed probability. A
stream that ends before either asks `decide()` for the best it has seen. Utterances the
hallucination guard emptied are not evidence and are not given to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

DEFAULT_CONFIDENCE = 0.7
DEFAULT_MAX_UTTERANCES = 3

Held = TypeVar("Held")


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


class LanguageGate(Generic[Held]):
    """The language of one source's requests, and which finals wait for it (sans-I/O).

    A source whose language is given (or stored by an earlier connection, or the only one
    the model knows) pins it from the start. Otherwise (`language=auto`) the gate detects
    once: its first final goes to the model without a language, and the finals cut while
    that one is being recognized are held back (`admit` says False). When the detecting
    final's result comes back, `detected` feeds it to a `LanguageDetector`; once that pins
    a language, the held finals are released with it (and every later request carries it).
    While it is unsure, the next held final is released to detect on its own: one
    detection at a time per source. The caller submits what is released, in order.
    """

    def __init__(
        self, requested: str | None, stored: str | None, model_languages: frozenset[str]
    ) -> None:
        """`requested`: the language the client asked for, None for auto; `stored`: what
        an earlier connection of the source pinned; `model_languages`: what the model
        transcribes."""
        self.language = requested or stored
        if self.language is None and len(model_languages) == 1:  # an English-only model
            self.language = next(iter(model_languages))
        self.detector = LanguageDetector() if self.language is None else None
        self._detecting = False  # a final without a language is with the model
        self._held: list[Held] = []

    def admit(self, final: Held) -> bool:
        """Submit `final` now (in `self.language`), or hold it (False) until a detection
        under way decides its language."""
        if self.language is None and self._detecting:
            self._held.append(final)
            return False
        self._detecting = self.language is None
        return True

    def detected(
        self, language: str, probability: float | None, speech: bool
    ) -> LanguagePinned | None:
        """A final sent without a language came back having been decoded in `language`
        (with `probability`); `speech`: the guard kept its text. Returns the pin when this
        result decides it. Then take `released()`."""
        if (
            self.language is None
            and self.detector is not None
            and speech
            and probability is not None
            and (pinned := self.detector.observe(language, probability)) is not None
        ):
            self.language = pinned.language
            return pinned
        return None

    def released(self) -> list[Held]:
        """The held finals to submit now, after a detection: all of them once the language
        is pinned, else the next one (it detects in turn)."""
        if self.language is None:
            released, self._held = self._held[:1], self._held[1:]
            self._detecting = bool(released)
        else:
            released, self._held = self._held, []
        return released

    def finish(self) -> LanguagePinned | None:
        """The source is over: if detection never became sure, pin the best it heard."""
        if self.detector is None or self.language is not None:
            return None
        pinned = self.detector.decide()
        if pinned is not None:
            self.language = pinned.language
        return pinned
