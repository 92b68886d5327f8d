"""What Whisper reads off the decoder's first position, <|startoftranscript|>: the
no-speech probability and, where an utterance leaves it open, its language."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.api import Utterance
from engine.whisper.config import ENGLISH


@dataclass(frozen=True, slots=True)
class FirstRead:
    """Per row: the no-speech probability, the language, and the probability of a
    detected language (None where it was pinned)."""

    no_speech: list[float]
    languages: list[str]
    probabilities: list[float | None]


class FirstStep:
    """Reads a batch's logits at <|startoftranscript|> (`GreedyDecoder.start`)."""

    def __init__(
        self, name: str, no_speech: int, lang_to_id: dict[str, int] | None, device: torch.device
    ) -> None:
        """`no_speech`: the <|nospeech|> token; `lang_to_id`: a multilingual model's
        language tokens (None: an English-only model)."""
        self._name = name
        self._no_speech = no_speech
        self._lang_to_id = lang_to_id or {}
        self._multilingual = lang_to_id is not None
        self._codes = list(self._lang_to_id)
        self._ids = torch.tensor(list(self._lang_to_id.values()), device=device)
        self._device = device

    def read(self, logits: torch.Tensor, batch: Sequence[Utterance]) -> FirstRead:
        """No-speech probability at <|startoftranscript|>, and each utterance's language
        with the probability of the detected ones (None where it was pinned).

        Whisper reads both off the decoder's first position, before any prompt token
        beyond <|startoftranscript|>, so one decoder step serves both. The language is the
        most probable language token (softmax over language tokens only, as Whisper's
        `detect_language`), computed only for the rows that leave it open.
        """
        no_speech: list[float] = logits.softmax(dim=-1)[:, self._no_speech].tolist()
        probabilities: list[float | None] = [None] * len(batch)
        if not self._multilingual:
            return FirstRead(no_speech, [ENGLISH] * len(batch), probabilities)
        for utterance in batch:
            if utterance.language is not None and utterance.language not in self._lang_to_id:
                raise ValueError(f"{self._name} does not know language {utterance.language!r}")
        open_rows = [i for i, utterance in enumerate(batch) if utterance.language is None]
        detected: dict[int, str] = {}
        if open_rows:
            rows = torch.tensor(open_rows, device=self._device)
            scores = logits[rows][:, self._ids].softmax(dim=-1)
            best_probability, best = scores.max(dim=-1)
            for row, index, probability in zip(
                open_rows, best.tolist(), best_probability.tolist(), strict=True
            ):
                detected[row] = self._codes[index]
                probabilities[row] = probability
        languages = [
            detected[i] if utterance.language is None else utterance.language
            for i, utterance in enumerate(batch)
        ]
        return FirstRead(no_speech, languages, probabilities)
