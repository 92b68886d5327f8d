"""The search for the most rooms a server sustains: double until a trial fails, then bisect.

Sans-I/O: `next_rooms()` says what to try, `record()` takes the outcome. The caller runs
the trials and bounds the total time; the search itself ends after at most
log2(max_rooms) doublings plus log2(max_rooms) bisections.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RoomSearch:
    start: int = 1
    max_rooms: int = 256
    precision: float = 0.05  # stop bisecting when the gap is ≤ this x the best passing N
    best: int = 0  # most rooms that passed
    lowest_failed: int | None = None
    steps: list[tuple[int, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.max_rooms:
            raise ValueError("need 1 ≤ start ≤ max_rooms")

    def next_rooms(self) -> int | None:
        """The number of rooms to try next, or None when the search is over."""
        if self.lowest_failed is None:
            if self.best >= self.max_rooms:
                return None
            return self.start if self.best == 0 else min(2 * self.best, self.max_rooms)
        gap = self.lowest_failed - self.best
        if gap <= max(1, int(self.best * self.precision)):
            return None
        return (self.best + self.lowest_failed) // 2

    def record(self, rooms: int, passed: bool) -> None:
        """Take the outcome of a trial with `rooms` rooms."""
        self.steps.append((rooms, passed))
        if passed:
            self.best = max(self.best, rooms)
        elif self.lowest_failed is None or rooms < self.lowest_failed:
            self.lowest_failed = rooms
