"""The assignment solver against every permutation, and at a size permutations cannot reach."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from session.assignment import best_assignment


def brute_force(score: np.ndarray) -> float:
    """The best total over every permutation (n! of them: small matrices only)."""
    rows, columns = score.shape
    return max(
        sum(float(score[i, j]) for i, j in enumerate(perm))
        for perm in itertools.permutations(range(columns), rows)
    )


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 5).flatmap(
        lambda rows: st.tuples(
            st.just(rows), st.integers(max(rows, 1), 6), st.integers(0, 2**32 - 1)
        )
    )
)
def test_best_assignment_matches_every_permutation(shape: tuple[int, int, int]) -> None:
    """Any small matrix (ties included: scores are small integers): distinct columns whose
    total is the best any permutation reaches."""
    rows, columns, seed = shape
    score = np.random.default_rng(seed).integers(0, 4, (rows, columns)).astype(np.float64)
    chosen = best_assignment(score)
    assert len(chosen) == rows and len(set(chosen)) == rows
    assert all(0 <= j < columns for j in chosen)
    total = sum(score[i, j] for i, j in enumerate(chosen))
    assert total == brute_force(score) if rows else total == 0


def test_twenty_six_speakers_are_assigned_at_once() -> None:
    """26 labels (the most the diarizer names): a shuffled diagonal comes back exactly."""
    rng = np.random.default_rng(7)
    order = rng.permutation(26)
    score = rng.uniform(0, 0.1, (26, 26))
    score[np.arange(26), order] = 5.0
    assert best_assignment(score) == order.tolist()


def test_more_rows_than_columns_is_refused() -> None:
    """A caller pads the columns; the solver says so rather than guess."""
    with pytest.raises(ValueError, match="rows <= columns"):
        best_assignment(np.zeros((3, 2)))
