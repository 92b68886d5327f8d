"""Whether a turn's words so far stop where an English sentence hardly ever ends.

The turn model hears only audio, and on a pause it wavers: on espeak-ng's voices its
probability of a complete turn swings by 0.3-0.4 from one 32 ms window of a pause to the
next (`python -m bench.turns`), so one question at TURN_SILENCE_MS closes about one
unfinished thought in three. The words heard so far say more: a turn that stops on "the",
"and", "to", "of", "than" or a modal waiting for its verb ("we should ...") goes on.
The segmenter holds such a turn (as it holds one the model judged incomplete, up to
TURN_HOLD_MS) whatever the model says (session/segmenter.py `decide`).

The words are the utterance's speculative final, decoded from the first silent window
(SPECULATE_AFTER_MS), when it is decoded by the time the model answers; otherwise the
model decides alone. English only: a speculation decoded in another language (a
multilingual model on `language=auto` says which it heard) holds nothing.

The list is closed-class words that need a word after them: articles and possessive
determiners, conjunctions, the prepositions "of", "into", "onto", "than" and the
infinitive "to", and modal verbs. Chosen by grammar, not fitted to any clip. What it costs:
an elliptical answer that ends on one ("yes, we should", "I'd love to") waits for the
hold, a late close rather than an early one. Prepositions that questions end on ("what
is it for", "where are you from") and auxiliaries that short answers end on ("yes, I do",
"it is") are left out.
"""

from __future__ import annotations

import re

UNFINISHED = frozenset(
    {
        # articles and possessive determiners
        "a", "an", "the", "my", "your", "our", "their", "its",
        # conjunctions
        "and", "or", "nor", "but", "because", "if", "unless", "whether", "although",
        "whereas",
        # prepositions that do not end a sentence, and the infinitive's "to"
        "of", "into", "onto", "than", "to",
        # modal verbs
        "can", "could", "may", "might", "must", "shall", "should", "will", "would",
    }
)  # fmt: skip
_WORD = re.compile(r"[a-z']+")


def ends_unfinished(text: str, language: str) -> bool:
    """Whether `text` (a transcript so far, decoded in `language`) stops on a word a
    sentence needs more after, or on a comma, dash or ellipsis; never outside English."""
    if language != "en":
        return False
    stripped = text.strip()
    if stripped.endswith((",", "-", "...", "…")):
        return True
    words = _WORD.findall(stripped.lower())
    return bool(words) and words[-1] in UNFINISHED
