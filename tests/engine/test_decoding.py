"""Reading decoded rows, and per-utterance token budgets."""

from __future__ import annotations

import pytest
import torch

from engine.whisper.decoding import BUDGET_FLOOR, read_row, token_budget

END = 50256


def test_a_row_ends_at_its_end_token_which_counts_in_the_average() -> None:
    """Text tokens stop before <|endoftext|>; avg_logprob includes the end token."""
    logprobs = torch.tensor([-0.1, -0.2, -0.3, -9.0])
    row = read_row([11, 22, END, END], logprobs, end_token=END, budget=10)
    assert row.tokens == [11, 22]
    assert not row.exhausted
    assert row.avg_logprob == pytest.approx(-0.2)


def test_a_row_stopped_by_its_budget_is_exhausted() -> None:
    """Past the budget the row is padded with the end token, which is not the model's."""
    row = read_row([7, 7, 7, END, END], torch.full((5,), -0.5), end_token=END, budget=3)
    assert row.tokens == [7, 7, 7]
    assert row.exhausted
    assert row.avg_logprob == pytest.approx(-0.5)


def test_special_tokens_above_the_end_token_are_not_text() -> None:
    """Tokens past <|endoftext|> in the vocabulary (timestamps, languages) are dropped."""
    row = read_row([END + 5, 42, END], torch.zeros(3), end_token=END, budget=9)
    assert row.tokens == [42]


def test_tokens_and_logprobs_must_pair_up() -> None:
    with pytest.raises(ValueError, match="log-probabilities"):
        read_row([1, END], torch.zeros(3), end_token=END, budget=9)


def test_budgets_grow_with_duration_up_to_the_cap() -> None:
    assert token_budget(0.0, 8.0, 224) == BUDGET_FLOOR
    assert token_budget(2.0, 8.0, 224) == BUDGET_FLOOR + 16
    assert token_budget(60.0, 8.0, 224) == 224
