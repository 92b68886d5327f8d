"""Reading generate()'s rows against the recorded greedy steps, and per-row budgets."""

from __future__ import annotations

import pytest
import torch

from engine.decoding import BUDGET_FLOOR, GreedyLogprobs, TokenBudget, read_row, token_budget

END = 50256


def test_a_row_ends_at_its_end_token_which_counts_in_the_average() -> None:
    """Text tokens stop before <|endoftext|>; avg_logprob includes the end token."""
    generated = [11, 22, END, END]
    logprobs = torch.tensor([-0.1, -0.2, -0.3, -9.0])
    row = read_row(generated, torch.tensor([11, 22, END, 5]), logprobs, end_token=END, budget=10)
    assert row.tokens == [11, 22]
    assert not row.exhausted
    assert row.avg_logprob == pytest.approx(-0.2)


def test_a_row_stopped_by_its_budget_is_exhausted() -> None:
    """Past the budget the row is padded with the end token, which is not the model's."""
    generated = [7, 7, 7, END, END]
    picked = torch.tensor([7, 7, 7, 7, 7])
    row = read_row(generated, picked, torch.full((5,), -0.5), end_token=END, budget=3)
    assert row.tokens == [7, 7, 7]
    assert row.exhausted
    assert row.avg_logprob == pytest.approx(-0.5)


def test_disagreeing_records_are_an_error() -> None:
    """If the recorder saw other tokens than generate() returned, the average is wrong."""
    with pytest.raises(RuntimeError, match="differ"):
        read_row([1, END], torch.tensor([2, END]), torch.zeros(2), end_token=END, budget=9)


def test_budgets_stop_rows_independently() -> None:
    """TokenBudget marks each row done once it has its own number of tokens."""
    budget = TokenBudget([1, 3], torch.device("cpu"))
    ids = torch.zeros((2, 4), dtype=torch.long)
    assert budget(ids, None).tolist() == [True, False]  # type: ignore[arg-type]
    assert budget(ids, None).tolist() == [True, False]  # type: ignore[arg-type]
    assert budget(ids, None).tolist() == [True, True]  # type: ignore[arg-type]
    assert token_budget(0.0, 8.0, 224) == BUDGET_FLOOR
    assert token_budget(2.0, 8.0, 224) == BUDGET_FLOOR + 16
    assert token_budget(60.0, 8.0, 224) == 224


def test_recorder_takes_the_argmax_and_its_log_probability() -> None:
    """GreedyLogprobs leaves scores alone and records the greedy pick per row."""
    recorder = GreedyLogprobs()
    scores = torch.tensor([[0.0, 2.0, float("-inf")], [1.0, 0.0, 0.0]])
    assert recorder(torch.zeros((2, 1), dtype=torch.long), scores) is scores  # type: ignore[arg-type]
    tokens, logprobs = recorder.stacked()
    assert tokens.tolist() == [[1], [0]]
    expected = torch.log_softmax(scores, dim=-1).max(dim=-1).values
    assert torch.allclose(logprobs[:, 0], expected)
