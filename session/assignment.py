"""The best one-to-one assignment of rows to columns (Kuhn-Munkres, O(n³)).

The diarizer relabels its clusters by the labels they overlap most: trying every
permutation costs n! (10 speakers: 3.6 M tries holding the GIL); this solves the same
problem in n³ steps. Small and exact, so no 40 MB SciPy for one function.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def best_assignment(score: npt.NDArray[np.float64]) -> list[int]:
    """For a rows × columns matrix with rows <= columns, the column given to each row
    (distinct columns) that maximises the sum of the chosen scores."""
    rows, columns = score.shape
    if rows > columns:
        raise ValueError(f"need rows <= columns, got {rows} x {columns}")
    if rows == 0:
        return []
    # Minimise cost = -score with the potentials method (1-based, column 0 is a sentinel).
    cost = -np.asarray(score, dtype=np.float64)
    inf = float("inf")
    u = [0.0] * (rows + 1)  # row potentials
    v = [0.0] * (columns + 1)  # column potentials
    owner = [0] * (columns + 1)  # the row holding each column (0: none)
    way = [0] * (columns + 1)
    for row in range(1, rows + 1):
        owner[0] = row
        column = 0
        least = [inf] * (columns + 1)
        used = [False] * (columns + 1)
        while True:  # grow an alternating tree until it reaches a free column
            used[column] = True
            current = owner[column]
            delta, nxt = inf, 0
            for j in range(1, columns + 1):
                if used[j]:
                    continue
                reduced = cost[current - 1, j - 1] - u[current] - v[j]
                if reduced < least[j]:
                    least[j], way[j] = reduced, column
                if least[j] < delta:
                    delta, nxt = least[j], j
            for j in range(columns + 1):
                if used[j]:
                    u[owner[j]] += delta
                    v[j] -= delta
                else:
                    least[j] -= delta
            column = nxt
            if owner[column] == 0:
                break
        while column:  # flip the augmenting path
            previous = way[column]
            owner[column] = owner[previous]
            column = previous
    chosen = [0] * rows
    for j in range(1, columns + 1):
        if owner[j]:
            chosen[owner[j] - 1] = j - 1
    return chosen
