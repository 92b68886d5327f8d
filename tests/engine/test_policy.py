"""The scheduler's policy, pure: finals first, preemption of partials, the partial budget,
partial batches sized to what a partial row costs."""

from __future__ import annotations

import pytest

from engine.api import Priority
from engine.scheduling.config import SchedulerConfig
from engine.scheduling.policy import (
    CONTEXT_RATIO,
    ContextCost,
    PartialBudget,
    PartialCost,
    Queued,
    Running,
    Start,
    plan,
)
from server.engine_plan import scheduler_config_with

FINAL, FILE, PARTIAL = Priority.FINAL, Priority.FILE, Priority.PARTIAL


def config(**overrides: float) -> SchedulerConfig:
    """The server's scheduler config, with what these cases were written against: two
    workers, batches of 4, partials on half the model and in batches of up to 16."""
    values: dict[str, float] = {
        "workers": 2,
        "max_batch_size": 4,
        "max_wait": 0.0,
        "partial_share": 0.5,
        "max_partial_batch": 16,
    }
    values.update(overrides)
    return scheduler_config_with(**values)


def test_finals_go_first_then_file_requests_and_partials_wait() -> None:
    """With one free worker, the finals (oldest first) and then file requests fill the batch."""
    cfg = config(workers=1)
    queued = [
        Queued(1, PARTIAL, 0.0),
        Queued(2, FILE, 0.5),
        Queued(3, FINAL, 2.0),
        Queued(4, FINAL, 1.0),
    ]
    result = plan(queued, [0], [], PartialBudget(cfg, 0.0), cfg, now=3.0)
    assert result.starts == [Start(0, (4, 3, 2), partial=False)]
    assert result.preempt == []


def test_a_batch_of_finals_waits_to_fill_unless_full() -> None:
    """A lone final waits until `max_wait` after it arrived; a full batch goes at once."""
    cfg = config(max_wait=0.02)
    budget = PartialBudget(cfg, 0.0)
    lone = plan([Queued(1, FINAL, 1.0)], [0, 1], [], budget, cfg, now=1.005)
    assert lone.starts == [] and lone.wake_at == pytest.approx(1.02)
    full = [Queued(i, FINAL, 1.0) for i in range(4)]
    assert plan(full, [0], [], budget, cfg, now=1.005).starts == [
        Start(0, (0, 1, 2, 3), partial=False)
    ]


def test_finals_are_shared_out_over_the_free_workers() -> None:
    """Ready finals go to every free worker in near-equal batches, oldest first, each at
    most `max_batch_size`; what no worker takes stays queued."""
    cfg = config()
    budget = PartialBudget(cfg, 0.0)
    two = [Queued(1, FINAL, 1.0), Queued(2, FINAL, 1.1)]
    assert plan(two, [0, 1], [], budget, cfg, now=2.0).starts == [
        Start(0, (1,), partial=False),
        Start(1, (2,), partial=False),
    ]
    five = [Queued(i, FINAL, 1.0 + i / 10) for i in range(5)]
    assert plan(five, [0, 1], [], budget, cfg, now=2.0).starts == [
        Start(0, (0, 1, 2), partial=False),
        Start(1, (3, 4), partial=False),
    ]
    many = [Queued(i, FINAL, 1.0 + i / 100) for i in range(10)]
    assert plan(many, [0, 1], [], budget, cfg, now=2.0).starts == [
        Start(0, (0, 1, 2, 3), partial=False),
        Start(1, (4, 5, 6, 7), partial=False),
    ]


def test_finals_preempt_a_running_partial_batch_when_no_worker_is_free() -> None:
    """Finals with every worker busy stop the newest partial batch, once."""
    cfg = config()
    budget = PartialBudget(cfg, 0.0)
    running = [Running(0, partial=True), Running(1, partial=True)]
    result = plan([Queued(7, FINAL, 1.0)], [], running, budget, cfg, now=2.0)
    assert result.starts == [] and result.preempt == [1]
    stopping = [Running(0, partial=True), Running(1, partial=True, stopping=True)]
    assert plan([Queued(7, FINAL, 1.0)], [], stopping, budget, cfg, now=2.0).preempt == []


def test_finals_let_a_partial_batch_about_to_end_finish() -> None:
    """A partial batch expected to end within `partial_wait` of a new final is not
    stopped; one further from its end, or of unknown cost, is; speculative batches always
    are; partial_wait 0 stops every partial batch (as before)."""
    cfg = config(partial_wait=0.25)
    budget = PartialBudget(cfg, 0.0)
    final = [Queued(7, FINAL, 2.0)]

    def stops(other: Running, policy: SchedulerConfig = cfg) -> list[int]:
        running = [Running(0, partial=False), other]
        return plan(final, [], running, budget, policy, now=2.0).preempt

    assert stops(Running(1, partial=True, expected_end=2.2)) == []
    assert stops(Running(1, partial=True, expected_end=1.9)) == []  # overdue: ends any moment
    assert stops(Running(1, partial=True, expected_end=2.3)) == [1]
    assert stops(Running(1, partial=True)) == [1]
    assert stops(Running(1, partial=False, speculative=True, expected_end=2.1)) == [1]
    assert stops(Running(1, partial=True, expected_end=2.1), config(partial_wait=0.0)) == [1]


def test_partial_wait_bounds_a_finals_wait_for_an_overdue_partial_batch() -> None:
    """A partial batch left to finish for a final is stopped once the final has waited
    `partial_wait`, however overdue the batch is (it was never stopped: `PARLEY_PARTIAL_
    WAIT_MS` bounded nothing); the plan wakes at that moment to stop it."""
    cfg = config(partial_wait=0.25)
    budget = PartialBudget(cfg, 0.0)
    final = [Queued(7, FINAL, 2.0)]
    running = [Running(0, partial=False), Running(1, partial=True, expected_end=2.2)]
    left = plan(final, [], running, budget, cfg, now=2.1)
    assert left.preempt == [] and left.wake_at == pytest.approx(2.25)
    assert plan(final, [], running, budget, cfg, now=2.25).preempt == [1]
    assert plan(final, [], running, budget, cfg, now=9.0).preempt == [1]
    # A final that has waited longer than `partial_wait` already stops it at once.
    assert plan([Queued(7, FINAL, 1.0)], [], running, budget, cfg, now=2.1).preempt == [1]


def test_partial_batches_are_sized_to_the_wait() -> None:
    """A partial batch holds no more rows than run within `partial_wait` at the measured
    cost per row (at least one, at most `max_partial_batch`); unknown cost: one row;
    partial_wait 0: `max_partial_batch`, as before."""
    cfg = config(max_partial_batch=4, partial_wait=0.25)
    budget = PartialBudget(cfg, 0.0)
    queued = [Queued(i, PARTIAL, float(i)) for i in range(6)]

    def sizes(cost: float | None, policy: SchedulerConfig = cfg) -> list[int]:
        starts = plan(queued, [0, 1], [], budget, policy, now=9.0, partial_cost=cost).starts
        return [len(start.keys) for start in starts]

    assert sizes(0.1) == [2]
    assert sizes(0.002) == [4]
    assert sizes(1.0) == [1]
    assert sizes(None) == [1]  # not known yet: one row measures it
    assert sizes(0.1, config(max_partial_batch=4, partial_wait=0.0)) == [4]
    assert plan(queued, [0], [], budget, cfg, 9.0, 0.1).starts == [Start(0, (0, 1), True)]


def test_partial_cost_is_a_moving_average_of_rows() -> None:
    """The cost per row starts unknown, takes the first batch's, then moves by `weight`."""
    cost = PartialCost(weight=0.5)
    assert cost.per_row is None and cost.expected_end(1.0, 2) is None
    cost.record(0.4, rows=2)
    assert cost.per_row == pytest.approx(0.2)
    cost.record(0.1, rows=1)
    assert cost.per_row == pytest.approx(0.15)
    assert cost.expected_end(1.0, 2) == pytest.approx(1.3)
    with pytest.raises(ValueError):
        cost.record(0.1, rows=0)


def test_flat_batches_take_every_ready_final_and_every_queued_partial() -> None:
    """Where a batch costs what one row does (a GPU), finals are not shared out over the
    free workers and partial batches are not sized by a row's cost: one row measured at a
    whole batch's cost would hold every later partial batch to one row."""
    flat = config(max_batch_size=8, max_partial_batch=4, partial_wait=0.25, flat_batches=True)
    budget = PartialBudget(flat, 0.0)
    finals = [Queued(i, FINAL, 1.0 + i / 10) for i in range(5)]
    assert plan(finals, [0, 1], [], budget, flat, now=2.0).starts == [
        Start(0, (0, 1, 2, 3, 4), partial=False)
    ]
    partials = [Queued(i, PARTIAL, float(i)) for i in range(6)]
    starts = plan(partials, [0], [], budget, flat, now=9.0, partial_cost=0.138).starts
    assert starts == [Start(0, (0, 1, 2, 3), partial=True)]
    per_row = config(max_batch_size=8, max_partial_batch=4, partial_wait=0.25)
    assert plan(partials, [0], [], budget, per_row, now=9.0, partial_cost=0.138).starts == [
        Start(0, (0,), partial=True)
    ]


def test_a_flat_partial_batch_is_expected_to_take_a_batchs_time() -> None:
    """With flat batches a partial batch's expected end is its start plus a partial
    batch's measured time, whatever its rows: a final waits for a batch of 16 about to
    end instead of stopping it as if it took 16 rows' time."""
    cost = PartialCost(weight=0.5)
    cost.record(0.14, rows=1)
    cost.record(0.14, rows=16)
    assert cost.per_batch == pytest.approx(0.14)
    assert cost.expected_end(1.0, 16, flat=True) == pytest.approx(1.14)
    assert cost.expected_end(1.0, 16) == pytest.approx(1.0 + 16 * (0.14 + 0.14 / 16) / 2)
    flat = config(partial_wait=0.25, flat_batches=True)
    running = [Running(0, partial=True, expected_end=cost.expected_end(1.0, 16, flat=True))]
    left = plan([Queued(7, FINAL, 1.0)], [], running, PartialBudget(flat, 0.0), flat, now=1.01)
    assert left.preempt == [] and left.wake_at == pytest.approx(1.25)


def test_finals_behind_finals_and_file_requests_preempt_nothing() -> None:
    """A busy worker running finals is waited for; file requests never preempt partials."""
    cfg = config(workers=1)
    budget = PartialBudget(cfg, 0.0)
    finals_running = [Running(0, partial=False)]
    assert plan([Queued(1, FINAL, 0.0)], [], finals_running, budget, cfg, 1.0).preempt == []
    partials_running = [Running(0, partial=True)]
    assert plan([Queued(1, FILE, 0.0)], [], partials_running, budget, cfg, 1.0).preempt == []


def test_partials_take_the_stalest_first_on_their_share_of_the_workers() -> None:
    """Stalest partials first; with two workers and a 0.5 share, one worker at a time."""
    cfg = config(max_partial_batch=2)
    budget = PartialBudget(cfg, 0.0)
    queued = [Queued(1, PARTIAL, 3.0), Queued(2, PARTIAL, 1.0), Queued(3, PARTIAL, 2.0)]
    result = plan(queued, [0, 1], [], budget, cfg, now=4.0, partial_cost=0.01)
    assert result.starts == [Start(0, (2, 3), partial=True)]
    busy = plan(queued, [1], [Running(0, partial=True)], budget, cfg, now=4.0)
    assert busy.starts == []


def test_first_partials_of_utterances_go_ahead_of_staler_later_ones() -> None:
    """An utterance's first partial before every later one, however stale; the stalest
    first among the first partials and among the later ones."""
    cfg = config(max_partial_batch=1)
    budget = PartialBudget(cfg, 0.0)
    queued = [
        Queued(1, PARTIAL, 1.0),
        Queued(2, PARTIAL, 3.0, first=True),
        Queued(3, PARTIAL, 0.5),
        Queued(4, PARTIAL, 2.0, first=True),
    ]
    order: list[int] = []
    while queued:
        (start,) = plan(queued, [0, 1], [], budget, cfg, now=4.0, partial_cost=0.1).starts
        order.extend(start.keys)
        queued = [q for q in queued if q.key not in start.keys]
    assert order == [4, 2, 3, 1]


def test_first_partials_do_not_pass_finals_or_their_budget() -> None:
    """A first partial is still a partial: finals go before it, and the budget holds it."""
    cfg = config(workers=1, partial_burst=1.0)
    budget = PartialBudget(cfg, 0.0)
    queued = [Queued(1, PARTIAL, 0.0, first=True), Queued(2, FINAL, 1.0)]
    assert plan(queued, [0], [], budget, cfg, now=1.0).starts == [Start(0, (2,), partial=False)]
    budget.charge(2.0, now=1.0)
    assert plan(queued[:1], [0], [], budget, cfg, now=1.0).starts == []


def test_the_budget_holds_partials_to_their_share_of_model_time() -> None:
    """After partials overdraw their credit, they wait until it has grown back."""
    cfg = config(workers=1, partial_share=0.5, partial_burst=1.0)
    budget = PartialBudget(cfg, 0.0)
    queued = [Queued(1, PARTIAL, 0.0)]
    assert plan(queued, [0], [], budget, cfg, now=0.0).starts  # a full bucket
    budget.charge(2.0, now=2.0)  # a 2 s partial batch ended at t=2: credit 1 - 2 = -1
    held = plan(queued, [0], [], budget, cfg, now=2.0)
    assert held.starts == [] and held.wake_at == pytest.approx(4.0, abs=1e-3)
    assert plan(queued, [0], [], budget, cfg, now=4.01).starts


def test_budget_credit_is_capped_by_the_burst() -> None:
    """An idle hour does not save up an hour of partials."""
    cfg = config(workers=2, partial_share=0.5, partial_burst=2.0)
    budget = PartialBudget(cfg, 0.0)
    assert budget.credit(3600.0) == 2.0
    budget.charge(3.0, now=3600.0)
    assert budget.credit(3600.5) == pytest.approx(-0.5)


def test_config_is_validated() -> None:
    """Shares outside (0, 1] and empty pools are refused."""
    for bad in (
        {"partial_share": 0.0},
        {"partial_share": 1.5},
        {"workers": 0},
        {"partial_wait": -0.1},
    ):
        with pytest.raises(ValueError):
            config(**bad)


def test_context_cost_is_the_finals_cost_alone_times_what_context_adds() -> None:
    """Unknown until a final batch without context ends; then that times the ratio, which
    batches behind a context correct; batches alone keep moving the estimate while
    contexts are shed (a slow spell is not remembered for ever)."""
    cost = ContextCost(weight=0.5)
    assert cost.expected() is None
    cost.record(1.0, behind_context=True)  # no batch alone yet: nothing to compare with
    assert cost.expected() is None and cost.ratio == CONTEXT_RATIO
    cost.record(0.2, behind_context=False)
    assert cost.expected() == pytest.approx(0.2 * CONTEXT_RATIO)
    cost.record(0.5, behind_context=True)  # 2.5x the batches alone
    assert cost.ratio == pytest.approx((CONTEXT_RATIO + 2.5) / 2)
    cost.record(0.1, behind_context=False)
    assert cost.expected() == pytest.approx(0.15 * cost.ratio)
    with pytest.raises(ValueError):
        cost.record(-1.0, behind_context=False)
    with pytest.raises(ValueError):
        ContextCost(weight=0.0)


@pytest.mark.parametrize("flat", [False, True])
def test_speculation_never_outranks_a_final_nor_a_partial(flat: bool) -> None:
    """A speculative final (even the oldest request) starts only on a worker no final and
    no partial takes, and a final queued with no worker free stops a speculative batch
    before a partial one, on the CPU's policy and on the flat (GPU) one."""
    SPECULATIVE = Priority.SPECULATIVE
    cfg = config(workers=1, partial_share=1.0, flat_batches=flat)
    budget = PartialBudget(cfg, 0.0)
    queued = [Queued(1, SPECULATIVE, 0.0), Queued(2, PARTIAL, 0.5), Queued(3, FINAL, 1.0)]
    assert plan(queued, [0], [], budget, cfg, now=2.0).starts == [Start(0, (3,), partial=False)]
    assert plan(queued[:2], [0], [], budget, cfg, now=2.0).starts == [Start(0, (2,), partial=True)]
    assert plan(queued[:1], [0], [], budget, cfg, now=2.0).starts == [Start(0, (1,), partial=False)]
    two = config(workers=2, partial_share=1.0, flat_batches=flat)
    both = plan(queued, [0, 1], [], PartialBudget(two, 0.0), two, now=2.0)
    assert both.starts == [Start(0, (3,), partial=False), Start(1, (2,), partial=True)]
    # Both workers busy, the speculative batch started first: it is the one stopped.
    running = [Running(0, partial=False, speculative=True), Running(1, partial=True)]
    stopped = plan([Queued(3, FINAL, 1.0)], [], running, PartialBudget(two, 0.0), two, now=2.0)
    assert stopped.preempt == [0] and stopped.starts == []


@pytest.mark.parametrize("flat", [False, True])
def test_an_awaited_speculation_goes_before_partials_and_finals_do_not_stop_it(
    flat: bool,
) -> None:
    """A speculative final its client will flush for starts before a queued partial (a
    plain one does not), never before a final; finals with no worker free stop a plain
    speculative batch, then a partial one, never the awaited one."""
    SPECULATIVE = Priority.SPECULATIVE
    cfg = config(workers=1, partial_share=1.0, flat_batches=flat)
    budget = PartialBudget(cfg, 0.0)
    awaited = Queued(1, SPECULATIVE, 1.0, awaited=True)
    plain, partial = Queued(4, SPECULATIVE, 0.0), Queued(2, PARTIAL, 0.5)
    final = Queued(3, FINAL, 1.5)
    assert plan([partial, plain, awaited], [0], [], budget, cfg, now=2.0).starts == [
        Start(0, (1,), partial=False)
    ]
    assert plan([partial, awaited, final], [0], [], budget, cfg, now=2.0).starts == [
        Start(0, (3,), partial=False)
    ]
    three = config(workers=3, partial_share=1.0, flat_batches=flat)
    running = [
        Running(0, partial=False, speculative=True, awaited=True),
        Running(1, partial=True),
        Running(2, partial=False, speculative=True),
    ]
    finals = [Queued(5 + i, FINAL, 1.0) for i in range(9)]  # three batches of four or fewer
    for needed, stopped in ((1, [2]), (2, [2, 1]), (3, [2, 1])):
        wanted = finals[: 4 * needed]
        result = plan(wanted, [], running, PartialBudget(three, 0.0), three, now=2.0)
        assert result.preempt == stopped


def test_an_awaited_speculation_stops_a_partial_batch_on_the_cpu_only() -> None:
    """No worker free: an awaited speculation stops the newest partial batch (not one
    already stopping, not a speculative one) on the CPU's policy; a plain speculation
    stops nothing, and on flat batches (a GPU) it waits for a short partial batch."""
    SPECULATIVE = Priority.SPECULATIVE
    awaited, plain = Queued(1, SPECULATIVE, 1.0, awaited=True), Queued(2, SPECULATIVE, 1.0)
    running = [Running(0, partial=True), Running(1, partial=True), Running(2, partial=False)]
    for flat, stopped in ((False, [1]), (True, [])):
        cfg = config(workers=3, partial_share=1.0, flat_batches=flat)
        budget = PartialBudget(cfg, 0.0)
        assert plan([awaited], [], running, budget, cfg, now=2.0).preempt == stopped
        assert plan([plain], [], running, budget, cfg, now=2.0).preempt == []
    cfg = config(workers=3, partial_share=1.0)
    one_stopping = [Running(0, partial=True), Running(1, partial=True, stopping=True)]
    assert plan([awaited], [], one_stopping, PartialBudget(cfg, 0.0), cfg, now=2.0).preempt == []


def test_a_final_its_client_waits_on_goes_first_alone_and_at_once() -> None:
    """An awaited final (its client flushes) starts ahead of older finals and without
    waiting `max_wait` for a batch to fill, in a batch of its own on the CPU; on flat
    batches (a GPU) it leads the one batch of every final."""
    cfg = config(workers=1, max_wait=0.05)
    older = [Queued(1, FINAL, 1.0), Queued(2, FINAL, 1.01)]
    awaited = Queued(3, FINAL, 1.02, awaited=True)
    starts = plan([*older, awaited], [0], [], PartialBudget(cfg, 0.0), cfg, now=1.03).starts
    assert starts == [Start(0, (3,), partial=False)]
    two = config(workers=2, max_wait=0.05)
    starts = plan([*older, awaited], [0, 1], [], PartialBudget(two, 0.0), two, now=1.06).starts
    assert starts == [Start(0, (3,), partial=False), Start(1, (1, 2), partial=False)]
    flat = config(workers=1, max_wait=0.0, flat_batches=True)
    starts = plan([*older, awaited], [0], [], PartialBudget(flat, 0.0), flat, now=1.03).starts
    assert starts == [Start(0, (3, 1, 2), partial=False)]
