"""Greedy decoding bookkeeping around transformers' `generate()`.

`GreedyLogprobs` records each step's chosen token and its log-probability (Whisper's
`avg_logprob` is their mean, the end token included). `TokenBudget` stops each row of the
batch at its own budget, so one utterance that loops does not keep the whole batch
decoding to the window's limit. `read_row` turns one row of generated ids into text
tokens, the average log-probability, and whether the budget ran out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria

# Tokens every utterance may use however short it is ("Okay." is three with the end).
BUDGET_FLOOR = 8


class GreedyLogprobs(LogitsProcessor):
    """Records, at every step, the token greedy search picks and its log-probability.

    Given to `generate()` as the last logits processor, it sees the scores every other
    processor has shaped, the scores greedy search takes the argmax of: the numbers
    `output_scores` would return, without keeping a (steps, batch, vocabulary) tensor.
    """

    def __init__(self) -> None:
        self.tokens: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        token = scores.argmax(dim=-1)
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        self.tokens.append(token)
        self.logprobs.append(logprobs.gather(-1, token[:, None])[:, 0])
        return scores

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, logprobs), each (batch, steps), on the CPU."""
        if not self.tokens:
            raise RuntimeError("generate() decoded no step")
        return (
            torch.stack(self.tokens, dim=1).cpu(),
            torch.stack(self.logprobs, dim=1).cpu(),
        )


class TokenBudget(StoppingCriteria):
    """Ends row i once it has generated `budgets[i]` tokens."""

    def __init__(self, budgets: Sequence[int], device: torch.device) -> None:
        self.budgets = torch.tensor(list(budgets), device=device)
        self.steps = 0

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        self.steps += 1  # called once per generated token, after it is appended
        done: torch.BoolTensor = self.budgets <= self.steps  # type: ignore[assignment]
        return done


def token_budget(duration: float, tokens_per_second: float, cap: int) -> int:
    """How many tokens an utterance of `duration` seconds may decode into."""
    return min(cap, BUDGET_FLOOR + math.ceil(duration * tokens_per_second))


@dataclass(frozen=True, slots=True)
class Row:
    """One utterance's decoding: its text tokens, before any text is made of them."""

    tokens: list[int]
    avg_logprob: float
    exhausted: bool  # stopped by its budget, not by <|endoftext|>


def read_row(
    generated: list[int],
    picked: torch.Tensor,
    logprobs: torch.Tensor,
    *,
    end_token: int,
    budget: int,
) -> Row:
    """Read one row of `generate()`'s new tokens against what `GreedyLogprobs` recorded.

    A row stopped by its budget is padded with the end token (Whisper pads with
    <|endoftext|>), so an end token at or past the budget is padding, not the model's.
    """
    end = generated.index(end_token) if end_token in generated else len(generated)
    exhausted = end >= budget
    stop = min(end, budget)
    counted = stop if exhausted else stop + 1  # Whisper averages over the end token too
    if picked[:counted].tolist() != generated[:counted]:
        raise RuntimeError("recorded greedy tokens differ from generate()'s output")
    return Row(
        tokens=[token for token in generated[:stop] if token < end_token],
        avg_logprob=float(logprobs[:counted].mean()) if counted else 0.0,
        exhausted=exhausted,
    )
