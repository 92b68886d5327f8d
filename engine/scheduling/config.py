"""`SchedulerConfig`: how the batch scheduler runs, as one frozen value.

It has no defaults on purpose: the server builds it from its settings
(`server.engine_plan.scheduler_config`), and so do the benches and the tests, so every
caller runs the scheduler the server runs. The checks are the engine's own (a
`ValueError` names the field); the settings refuse a bad value earlier, by its variable.
"""

from __future__ import annotations

from dataclasses import dataclass

# Model-seconds of unused partial time a quiet spell may save up (`PartialBudget`): a burst
# of new utterances gets its first partials at once, without letting partials hold the
# model for long. Not a setting: nothing measured asked for another value.
PARTIAL_BURST = 2.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """`workers` model workers run `max_batch_size` requests at most in one batch, partials
    at most `max_partial_batch`; a batch of finals waits `max_wait` seconds to fill; the
    queue holds `max_queue` requests. Partials take at most `partial_share` of the model's
    time and of its workers, and a final waits at most `partial_wait` seconds for a
    partial batch (0: partial batches of `max_partial_batch`, always stopped).
    `flat_batches`: a batch costs about what one row does (a GPU). `context_below` and
    `context_budget` gate live finals' left context (`engine.scheduling.context_gate`;
    None: no gate, no budget)."""

    workers: int
    max_batch_size: int
    max_partial_batch: int
    max_wait: float
    max_queue: int
    partial_share: float
    partial_wait: float
    flat_batches: bool
    context_below: float | None
    context_budget: float | None
    partial_burst: float = PARTIAL_BURST

    def __post_init__(self) -> None:
        if self.workers < 1 or self.max_batch_size < 1 or self.max_partial_batch < 1:
            raise ValueError("need at least one worker and batches of at least one")
        if self.max_queue < self.max_batch_size:
            raise ValueError("max_queue must be >= max_batch_size")
        if not 0 < self.partial_share <= 1:
            raise ValueError(f"partial_share must lie in (0, 1], got {self.partial_share}")
        if self.max_wait < 0 or self.partial_burst <= 0 or self.partial_wait < 0:
            raise ValueError("need max_wait >= 0, partial_burst > 0 and partial_wait >= 0")
        if self.context_below is not None and not 0 < self.context_below <= 1:
            raise ValueError("context_below must lie in (0, 1] (None: no load gate)")
        if self.context_budget is not None and self.context_budget <= 0:
            raise ValueError("context_budget must be positive (None: no budget)")

    @property
    def partial_workers(self) -> int:
        """Most workers running partials at once: their share of the workers, at least one."""
        return max(1, int(self.partial_share * self.workers))

    def partial_batch(self, per_row: float | None) -> int:
        """Most partials in one batch when a partial row costs `per_row` model-seconds
        (None: not known yet, one row: it measures the cost soonest, and a batch that
        finals stop measures nothing); with flat batches, `max_partial_batch` (rule 5 of
        `engine.scheduling.policy`)."""
        if self.partial_wait == 0 or self.flat_batches:
            return self.max_partial_batch
        if per_row is None:
            return 1
        if per_row <= 0:
            return self.max_partial_batch
        return max(1, min(self.max_partial_batch, int(self.partial_wait / per_row)))
