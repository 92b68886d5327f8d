"""The left-context load gate: whether a batch's live finals go to the model behind their
left context (`Utterance.left`) or alone.

A left context makes a final's encoder window longer (docs/performance.md#left-context): a loaded
server sheds that cost before it sheds rooms or makes a final late. A live final goes
behind its context only while no final waits in the queue, the share of the model's
recent time that finals and files took is below `below`, and the batch's oldest final is
expected back within `budget` of its cut (`RecognitionRequest.closed_at`, else its
submit; `ContextCost`); otherwise it is decoded alone (`SchedulerStats.contexts_shed`).
Partials do not count in the share: they fill whatever time finals leave, so the model
looks busy as soon as one room speaks. File requests keep their context (no listener
waits on each final). A rule whose setting is None does not apply; with both None there
is no gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from engine.api import Priority, Utterance
from engine.scheduling.policy import ContextCost
from engine.scheduling.records import BusyTime, Entry, Worker


class ContextGate:
    """The gate's settings and what it measures: the finals' recent model time and what
    a batch of finals costs behind its context."""

    def __init__(
        self, below: float | None, budget: float | None, clock: Callable[[], float]
    ) -> None:
        """`below` and `budget` as `SchedulerConfig` checked them."""
        self._below = below
        self._budget = budget
        self._clock = clock
        self._cost = ContextCost()
        self.busy = BusyTime()  # of the batches that held a final or a file request

    def finals_utilization(self, workers: Sequence[Worker]) -> float:
        """Fraction of the last `BusyTime.window` seconds `workers` spent on batches that
        held a final or a file request (partial and speculative batches left out)."""
        running = (w.started for w in workers if w.holds_finals())
        return self.busy.utilization(self._clock(), running, len(workers))

    def has_slack(
        self, queued: Iterable[Entry], workers: Sequence[Worker], oldest: float | None = None
    ) -> bool:
        """Whether live finals may be decoded behind their left context now: no final
        among `queued`, the finals' share of the model over the last `LOAD_WINDOW` seconds
        below `below`, and a batch whose oldest final was cut (or submitted) at `oldest`
        expected back within `budget`."""
        if self._below is None and self._budget is None:
            return True
        if any(e.request.priority is Priority.FINAL for e in queued):
            return False
        if self._below is not None and self.finals_utilization(workers) >= self._below:
            return False
        expected = self._cost.expected()
        if self._budget is None or oldest is None or expected is None:
            return True
        return self._clock() - oldest + expected <= self._budget

    def utterances(
        self, live: Sequence[Entry], queued: Iterable[Entry], workers: Sequence[Worker]
    ) -> tuple[list[Utterance], int]:
        """A batch's utterances, its live finals without their left context unless the
        model has room for it (`has_slack`); and how many contexts were shed."""
        utterances = [e.request.utterance for e in live]
        sheddable = [
            u.left is not None and not u.left.essential and e.request.priority is not Priority.FILE
            for e, u in zip(live, utterances, strict=True)
        ]
        cut = [
            e.submitted_at if e.request.closed_at is None else e.request.closed_at
            for e, shed in zip(live, sheddable, strict=True)
            if shed
        ]
        if not cut or self.has_slack(queued, workers, oldest=min(cut)):
            return utterances, 0
        shed = [
            replace(u, left=None) if shed else u
            for u, shed in zip(utterances, sheddable, strict=True)
        ]
        return shed, len(cut)

    def batch_ended(self, worker: Worker, started: float, ended: float, ran: bool) -> None:
        """`worker`'s batch ended (`ran`: to its end, with results): count its time if it
        held finals, and learn what finals cost behind their context."""
        if not worker.holds_finals():
            return
        self.busy.add(started, ended)
        if ran and any(e.request.priority is Priority.FINAL for e in worker.batch):
            self._cost.record(ended - started, behind_context=worker.behind_context)
