"""What the model workers run next: the scheduler's policy, with no I/O and no clock.

The scheduler (`engine.scheduling.scheduler`) owns the queue, the futures and the workers; on every
change it shows this module what is queued, which workers are free and what the busy
ones run, and `plan` answers with the batches to start, the partial batches to stop and
when to look again. The rules:

1. **Finals first, on any free worker.** Finals (oldest first), then file requests, in
   batches of up to `max_batch_size`, shared out over the free workers (two finals and
   two free workers make two batches of one: a batch's rows all wait for its slowest,
   and on the CPU a row costs nearly as much in a batch as alone). A batch waits up to
   `max_wait` after its oldest request arrived for more to join, unless it is full.
   A final whose client waits on it (`Queued.awaited`: a stream that flushes, rule 3)
   goes ahead of the other finals, at once and, on the CPU, in a batch of its own: a
   meeting's final has ~1 s to spare, a voice agent's flush ~0.1 s, and in a batch
   with a long final behind its left context it waited ~0.6 s.
2. **Finals wait for a partial batch only briefly.** When finals are queued and no
   worker is free, a running partial batch is told to stop (the recognizer stops at its
   next decoder step or encoder row); its partials go back to the queue and the worker
   takes the finals. But a partial batch expected to end before the oldest waiting final
   has waited `partial_wait` is left to finish: stopping it would throw its work away to
   save the final less than that (under load on the CPU, stopped partial batches were most
   of the partials' model time: docs/performance.md#partials). It is left only until then:
   one that overruns is stopped when the final has waited `partial_wait` (the plan wakes
   then), so `partial_wait` bounds a final's wait for partials. Its expected end is its
   start plus its rows times `PartialCost`'s
   measure of a partial row; partial batches are sized to fit `partial_wait` (rule 4),
   so on the CPU, where a row costs ~0.1-0.3 s, they are single rows left to finish,
   while larger batches (on a GPU, or before any cost is known) are stopped as before.
   File requests do not preempt: they are not waited for live.
3. **Speculative finals use what finals and partials leave.** A final decoded before its
   endpoint (SPECULATIVE) starts only on a worker that no final, file request or partial
   (within its budget, rule 4) takes, one per batch (a row promoted to a final would
   wait for every other row of its batch, most of them finals-to-be of sessions whose
   endpoint comes later, or never), oldest first; finals stop a
   speculative batch (before a partial one) and its requests go back to the queue. So
   speculation spends idle model time: it never delays a final by more than a step, and
   it does not thin the partials, whose text is the finals' decoding draft. Under
   overload it does not run, and its final is decoded as a final.
   An *awaited* speculation (`Queued.awaited`: its client flushes, so it will ask for
   this final within ~0.2 s, when its own VAD has heard the silence; or the turn model's
   decision reads its words, `BatchScheduler.expedite`) is a final that is about to be
   asked for: it starts before partials (after finals and file
   requests) and, when no worker is free, stops a partial batch (the newest), not on
   flat batches (rule 5: there a partial batch is short and many rows' work); finals
   do not stop it (they wait for it as for a final: one row, ~0.1-0.3 s on the CPU).
   Behind partials it waited for one to end and was stopped by other rooms' finals
   (its work thrown away ~0.1 s before its flush), and beside 8 rooms most flushes
   found it unfinished (docs/performance.md#beside-other-rooms).
4. **Partials share a budget, first partials, then the stalest.** Partials run only on
   a worker no final or file request needs, and only while `PartialBudget` has credit:
   partials may take at most `partial_share` of the model's time (all workers
   together), averaged over a few seconds, and at most that share of the workers at
   once (at least one): below 1.0, with two workers one is left for finals and
   preemption stays rare; at 1.0 (the server's default, `PARLEY_PARTIAL_SHARE`) partials
   take whatever finals leave, on every worker, and rule 2 bounds a final's wait.
   Among the queued partials (one per session, the latest audio), those of
   utterances that have shown no partial yet (`Queued.first`) go first, so a new
   utterance's first words do not wait a whole round behind every session that waited
   longer; then, and among those, the one whose session has waited longest since its
   last partial was taken, so under load every session's later partials slow down alike
   (round robin) instead of some starving. A partial batch holds at most
   `max_partial_batch` rows, and no more than are expected to run within `partial_wait`
   (`PartialCost`), at least one; one until a partial batch has run to its end.
5. **Flat batches (a GPU).** Where a batch costs about what one row does
   (`flat_batches`: on CUDA, docs/performance.md#a-gpu-node), rows are not rationed
   by their cost: a batch of finals takes every ready final (up to `max_batch_size`,
   not shared out over the free workers), a partial batch every queued partial (up to
   `max_partial_batch`), and a partial batch's expected end is its start plus what a
   partial batch has cost (`PartialCost.per_batch`), not its rows times a row's cost.
   Sized per row, as on the CPU, the first partial batch of one row measures a row at a
   whole batch's cost, so every later one holds one row too and partials crawl; a batch
   of 16 would look 16 times too long and finals would stop every partial batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.api import Priority
from engine.scheduling.config import SchedulerConfig

# A final behind its left context takes longer than alone (the longer encoder window):
# this ratio is the middle of the measured range (docs/performance.md#left-context).
CONTEXT_RATIO = 1.7


class PartialBudget:
    """A bucket of model time for partials.

    Credit grows by `partial_share x workers` model-seconds per wall second, up to
    `partial_burst`; every partial batch's model time (run to the end or stopped) is
    charged when it ends. Partials may start while the credit is positive, so the bucket
    goes negative by at most the batches in flight, and pays that back before the next.
    """

    def __init__(self, config: SchedulerConfig, now: float) -> None:
        self._rate = config.partial_share * config.workers
        self._burst = config.partial_burst
        self._credit = config.partial_burst
        self._at = now

    def credit(self, now: float) -> float:
        self._credit = min(self._burst, self._credit + (now - self._at) * self._rate)
        self._at = max(self._at, now)
        return self._credit

    def charge(self, seconds: float, now: float) -> None:
        self._credit = self.credit(now) - seconds

    def available_at(self, now: float) -> float:
        """When the credit is positive again (now, if it is)."""
        credit = self.credit(now)
        return now if credit > 0 else now + (1e-6 - credit) / self._rate


class PartialCost:
    """What partials cost the model, as measured: moving averages of the model seconds per
    row and per batch of the partial batches that ran to their end (a stopped batch says
    nothing of what it would have cost). None until the first one ends."""

    def __init__(self, weight: float = 0.2) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must lie in (0, 1], got {weight}")
        self._weight = weight
        self.per_row: float | None = None
        self.per_batch: float | None = None

    def record(self, seconds: float, rows: int) -> None:
        if rows < 1 or seconds < 0:
            raise ValueError("a batch of at least one row, in non-negative time")
        self.per_row = moving_average(self.per_row, seconds / rows, self._weight)
        self.per_batch = moving_average(self.per_batch, seconds, self._weight)

    def expected_end(self, started: float, rows: int, flat: bool = False) -> float | None:
        """When a partial batch of `rows` started at `started` should end (None: unknown):
        its rows times a row's cost, or with `flat` batches (rule 5) a batch's cost."""
        if self.per_row is None or self.per_batch is None:
            return None
        return started + (self.per_batch if flat else rows * self.per_row)


class ContextCost:
    """What a batch of finals is expected to cost behind its left context: the moving
    average of the model seconds of final batches decoded without context, times the
    moving average of how much longer a batch with context took than that (`ratio`,
    starting at `CONTEXT_RATIO`). Both keep learning while contexts are shed: batches
    without context go on feeding the first, so a slow spell ends with the load.
    None until a final batch without context has ended."""

    def __init__(self, weight: float = 0.2, ratio: float = CONTEXT_RATIO) -> None:
        if not 0 < weight <= 1 or ratio <= 0:
            raise ValueError("weight must lie in (0, 1] and ratio be positive")
        self._weight = weight
        self.alone: float | None = None
        self.ratio = ratio

    def record(self, seconds: float, *, behind_context: bool) -> None:
        if seconds < 0:
            raise ValueError("a batch takes non-negative time")
        if not behind_context:
            self.alone = moving_average(self.alone, seconds, self._weight)
        elif self.alone:
            self.ratio = moving_average(self.ratio, seconds / self.alone, self._weight)

    def expected(self) -> float | None:
        return None if self.alone is None else self.alone * self.ratio


def moving_average(previous: float | None, sample: float, weight: float) -> float:
    """An exponential moving average's next value (the sample itself when there is none)."""
    return sample if previous is None else previous + weight * (sample - previous)


@dataclass(frozen=True, slots=True)
class Queued:
    """A request as the policy sees it. `since`: a final's submit time; a partial's
    time since its session has been waiting (kept when a newer partial replaces it).
    `first`: a partial of an utterance that has shown no partial yet. `awaited`: a
    final or speculative final whose client flushes (rules 1 and 3)."""

    key: int
    priority: Priority
    since: float
    first: bool = False
    awaited: bool = False  # a final (or speculative one) its client waits on (rules 1, 3)


@dataclass(frozen=True, slots=True)
class Running:
    """A busy worker: what kind of batch it runs, and whether it was told to stop.
    `speculative`: a batch of speculative finals none of which was promoted yet;
    `awaited`: one of them is awaited (rule 3).
    `expected_end`: a partial batch's (`PartialCost`), None if not known."""

    worker: int
    partial: bool
    stopping: bool = False
    speculative: bool = False
    expected_end: float | None = None
    awaited: bool = False

    @property
    def preemptible(self) -> bool:
        return self.partial or (self.speculative and not self.awaited)

    def ends_by(self, deadline: float, now: float) -> bool:
        """A partial batch expected to end by `deadline`, which has not passed: one still
        running at the deadline is overdue, and ends by nothing."""
        return (
            self.partial
            and self.expected_end is not None
            and now < deadline
            and self.expected_end <= deadline
        )


@dataclass(frozen=True, slots=True)
class Start:
    worker: int
    keys: tuple[int, ...]
    partial: bool


@dataclass(frozen=True, slots=True)
class Plan:
    starts: list[Start] = field(default_factory=list)
    preempt: list[int] = field(default_factory=list)  # workers whose partial batch stops
    wake_at: float | None = None  # look again then, if nothing else happens first


def plan(
    queued: Sequence[Queued],
    free: Sequence[int],
    running: Sequence[Running],  # in the order the batches started
    budget: PartialBudget,
    config: SchedulerConfig,
    now: float,
    partial_cost: float | None = None,
) -> Plan:
    """The batches to start on the `free` workers now, and the partial batches to stop.
    `partial_cost`: model-seconds per partial row (`PartialCost.per_row`), if known."""
    urgent = sorted(
        (q for q in queued if q.priority in (Priority.FINAL, Priority.FILE)),
        key=lambda q: (q.priority, not q.awaited, q.since),
    )
    speculative = sorted((q for q in queued if q.priority is Priority.SPECULATIVE), key=_staleness)
    awaited = [q for q in speculative if q.awaited]
    early = [q for q in speculative if not q.awaited]
    partials = sorted((q for q in queued if q.priority is Priority.PARTIAL), key=_partial_order)
    result = Plan()
    workers = list(free)
    wake: list[float] = []
    while urgent and workers:
        alone = urgent[0].awaited and not config.flat_batches  # rule 1: a client waits
        full = len(urgent) >= config.max_batch_size
        ready_at = min(q.since for q in urgent) + config.max_wait
        if not full and not alone and ready_at > now:
            wake.append(ready_at)
            break
        share = len(urgent) if config.flat_batches else -(-len(urgent) // len(workers))
        size = 1 if alone else min(config.max_batch_size, share)
        batch, urgent = urgent[:size], urgent[size:]
        result.starts.append(Start(workers.pop(0), tuple(q.key for q in batch), partial=False))
    finals_left = any(q.priority is Priority.FINAL for q in urgent)
    if finals_left and not workers and not wake:
        # Stop speculative batches (not awaited ones: rule 3), then partial ones, the
        # newest first, as many as the finals left need; not a partial batch that ends
        # before the oldest final has waited `partial_wait`, until it has (rule 2).
        finals = [q for q in urgent if q.priority is Priority.FINAL]
        needed = -(-len(finals) // config.max_batch_size)
        deadline = min(q.since for q in finals) + config.partial_wait
        stopping = sum(1 for r in running if r.preemptible and r.stopping)
        eligible = [r for r in running if r.preemptible and not r.stopping]
        left = {r.worker for r in eligible if config.partial_wait > 0 and r.ends_by(deadline, now)}
        candidates = [
            r.worker
            for r in sorted(reversed(eligible), key=lambda r: r.partial)
            if r.worker not in left
        ]
        result.preempt.extend(candidates[: max(0, needed - stopping)])
        if left and len(result.preempt) < needed - stopping:
            wake.append(deadline)  # stop what is still running then
    if not urgent:
        _start_one_row_each(awaited, workers, result.starts)
    if awaited and not workers and not urgent and not config.flat_batches:
        # An awaited speculation stops a partial batch, the newest first (rule 3).
        stopping = sum(1 for r in running if r.partial and r.stopping)
        batches = [r.worker for r in reversed(running) if r.partial and not r.stopping]
        result.preempt.extend(batches[: max(0, len(awaited) - stopping)])
    slots = config.partial_workers - sum(1 for r in running if r.partial and not r.stopping)
    if partials and workers and not urgent and slots > 0:
        if budget.credit(now) > 0:
            size = config.partial_batch(partial_cost)
            while partials and workers and slots > 0:
                batch, partials = partials[:size], partials[size:]
                result.starts.append(Start(workers.pop(0), tuple(q.key for q in batch), True))
                slots -= 1
        else:
            wake.append(budget.available_at(now))
    if not urgent:
        _start_one_row_each(early, workers, result.starts)
    return Plan(result.starts, result.preempt, min(wake) if wake else None)


def _start_one_row_each(queued: list[Queued], workers: list[int], starts: list[Start]) -> None:
    """Start the `queued` speculations in order, one row a batch (rule 3), while
    `workers` last; both lists lose what is started."""
    while queued and workers:
        starts.append(Start(workers.pop(0), (queued.pop(0).key,), partial=False))


def _staleness(queued: Queued) -> tuple[float, int]:
    return (queued.since, queued.key)


def _partial_order(queued: Queued) -> tuple[bool, float, int]:
    """An utterance's first partial ahead of later ones, then the stalest (rule 4)."""
    return (not queued.first, queued.since, queued.key)
