"""Per-utterance bookkeeping of greedy decoding: token budgets, reading a decoded row, and
the decoding the recognizer judges.

`token_budget` bounds how many tokens an utterance may decode into, so one utterance that
loops does not keep the whole batch decoding to the window's limit. `read_row` turns one
row of decoded tokens (`engine.whisper.greedy`) into text tokens, the average log-probability
(Whisper's `avg_logprob`: the mean over the tokens, the end token included) and whether the
budget ran out. `Decoded` is one utterance's decoding with its text, before the
hallucination guard (`engine.whisper.guard`) and the retry policy (`engine.whisper.window_policy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.api import WordTiming

# Tokens every utterance may use however short it is ("Okay." is three with the end).
BUDGET_FLOOR = 8


def token_budget(duration: float, tokens_per_second: float, cap: int) -> int:
    """How many tokens an utterance of `duration` seconds may decode into."""
    return min(cap, BUDGET_FLOOR + math.ceil(duration * tokens_per_second))


@dataclass(frozen=True, slots=True)
class Row:
    """One utterance's decoding: its text tokens, before any text is made of them."""

    tokens: list[int]
    token_logprobs: list[float]  # each text token's log-probability
    avg_logprob: float
    exhausted: bool  # stopped by its budget, not by <|endoftext|>


def read_row(tokens: list[int], logprobs: torch.Tensor, *, end_token: int, budget: int) -> Row:
    """Read one decoded row, `logprobs[i]` being the log-probability of `tokens[i]`.

    A row stopped by its budget is padded with the end token (as Whisper pads), so an end
    token at or past the budget is padding, not the model's.
    """
    if len(tokens) != logprobs.shape[0]:
        raise ValueError(f"{len(tokens)} tokens but {logprobs.shape[0]} log-probabilities")
    end = tokens.index(end_token) if end_token in tokens else len(tokens)
    exhausted = end >= budget
    stop = min(end, budget)
    counted = stop if exhausted else stop + 1  # Whisper averages over the end token too
    pairs = zip(tokens[:stop], logprobs[:stop].tolist(), strict=True)
    kept = [(token, float(logprob)) for token, logprob in pairs if token < end_token]
    return Row(
        tokens=[token for token, _ in kept],
        token_logprobs=[logprob for _, logprob in kept],
        avg_logprob=float(logprobs[:counted].mean()) if counted else 0.0,
        exhausted=exhausted,
    )


@dataclass(frozen=True, slots=True)
class Decoded:
    """One utterance's greedy decoding, before the guard."""

    text: str
    avg_logprob: float
    no_speech_prob: float
    language: str
    language_probability: float | None  # None: pinned, not detected
    exhausted: bool  # ran out of tokens without <|endoftext|>
    tokens: list[int] = field(default_factory=list)  # the text tokens
    logprobs: list[float] = field(default_factory=list)  # each text token's
    words: tuple[WordTiming, ...] = ()
    # Tokens between the prompt and the text: the left context's text (forced) and what
    # the model wrote before this utterance's first word (`engine.whisper.context`).
    lead: list[int] = field(default_factory=list)
