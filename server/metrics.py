"""Prometheus metrics: per-stage latency, batch shape, load, and what clients received.

Each app has its own CollectorRegistry, so several apps in one process never clash.
Labels stay low-cardinality: priorities, reasons and close codes — never meeting ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.api import Priority, RecognitionRequest, RecognitionResult
from engine.memory import heap_usage
from engine.scheduling.scheduler import BatchScheduler
from engine.workers.processes import RESTART_REASONS, WorkerHealth
from session.vad import VadScorer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_FAST_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
_FLUSH_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class _LiveCollector(Collector):
    """Gauges read at scrape time from the objects that own the numbers."""

    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        return self._read()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, ...
        r.register(_LiveCollector(_heap_families))
        self.vad_seconds = Histogram(
            "parley_vad_seconds",
            "VAD and segmenter time per audio frame",
            registry=r,
            buckets=_FAST_BUCKETS,
        )
        self.queue_wait = Histogram(
            "parley_queue_wait_seconds",
            "Time a request waited for its batch",
            ["priority"],
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.inference = Histogram(
            "parley_inference_seconds",
            "Model time per batch",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.batch_size = Histogram(
            "parley_batch_size", "Requests per batch", registry=r, buckets=_BATCH_BUCKETS
        )
        self.batch_sessions = Histogram(
            "parley_batch_sessions",
            "Distinct sessions per batch",
            registry=r,
            buckets=_BATCH_BUCKETS,
        )
        self.final_latency = Histogram(
            "parley_final_latency_seconds",
            "From an utterance being closed to its final being sent",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.partial_interval = Histogram(
            "parley_partial_interval_seconds",
            "Gap between consecutive partials of one utterance",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.finals = Counter("parley_finals", "Finals sent to clients", registry=r)
        self.partials = Counter("parley_partials", "Partials sent to clients", registry=r)
        self.partials_dropped = Counter(
            "parley_partials_dropped", "Partials not sent, by reason", ["reason"], registry=r
        )
        self.speculative_finals = Counter(
            "parley_speculative_finals",
            "Finals decoded before their endpoint, by outcome: used by the final, discarded "
            "after the model started on them (wasted), cancelled while queued",
            ["outcome"],
            registry=r,
        )
        self.flush = Histogram(
            "parley_flush_seconds",
            "From a client's flush (finalize, Finalize, commit) being received to its final "
            "being sent, by what served it: a speculation ready by then, one unfinished, "
            "or a decoding at the flush",
            ["served"],
            registry=r,
            buckets=_FLUSH_BUCKETS,
        )
        self.sessions = Counter(
            "parley_sessions",
            "Audio streams ended, by reason and close code",
            ["reason", "close_code"],
            registry=r,
        )
        self.refused = Counter(
            "parley_refused",
            "Sockets (streams, listeners) refused before being served, by close code",
            ["close_code"],
            registry=r,
        )
        self.listeners = Gauge("parley_listeners", "Open listener sockets", registry=r)

    def watch(
        self,
        scheduler: Callable[[], BatchScheduler | None],
        sessions: Callable[[], int],
        meetings: Callable[[], int],
        store_failures: Callable[[], int],
        vad: Callable[[], VadScorer | None],
        worker_health: Callable[[], WorkerHealth | None],
    ) -> None:
        """Register the live gauges, read from their owners at scrape time."""

        def read() -> Iterable[Metric]:
            active = GaugeMetricFamily("parley_active_sessions", "Open audio streams")
            active.add_metric([], sessions())
            rooms = GaugeMetricFamily("parley_active_meetings", "Meetings with an open stream")
            rooms.add_metric([], meetings())
            depth = GaugeMetricFamily(
                "parley_queue_depth", "Queued recognition requests", labels=["priority"]
            )
            current = scheduler()
            counts = current.depth_by_priority() if current else dict.fromkeys(Priority, 0)
            for priority, count in counts.items():
                depth.add_metric([priority.name.lower()], count)
            workers = GaugeMetricFamily(
                "parley_model_workers", "Model workers (threads or processes)"
            )
            workers.add_metric([], current.workers if current else 0)
            busy = CounterMetricFamily(
                "parley_model_seconds",
                "Model time spent on batches, by kind (a stopped partial batch counts)",
                labels=["kind"],
            )
            seconds = current.stats.model_seconds if current else dict.fromkeys(Priority, 0.0)
            for priority, value in seconds.items():
                busy.add_metric([priority.name.lower()], value)
            preempted = CounterMetricFamily(
                "parley_preempted_batches", "Partial batches stopped so that finals could run"
            )
            preempted.add_metric([], current.stats.preempted_batches if current else 0)
            shed = CounterMetricFamily(
                "parley_contexts_shed",
                "Live finals decoded without their left context (no room, or it would be late)",
            )
            shed.add_metric([], current.stats.contexts_shed if current else 0)
            tasks = GaugeMetricFamily("parley_event_loop_tasks", "asyncio tasks alive")
            tasks.add_metric([], len(asyncio.all_tasks()))
            store = CounterMetricFamily(
                "parley_store_errors", "Store calls that failed to reach the store"
            )
            store.add_metric([], store_failures())
            scorer = vad()
            vad_calls = CounterMetricFamily(
                "parley_vad_calls", "VAD model calls for live streams (batched: many windows each)"
            )
            vad_calls.add_metric([], scorer.calls if scorer else 0)
            vad_windows = CounterMetricFamily(
                "parley_vad_windows", "VAD windows (32 ms) scored for live streams"
            )
            vad_windows.add_metric([], scorer.windows if scorer else 0)
            families = [active, rooms, depth, workers, busy, preempted, shed, tasks, store]
            return [*families, vad_calls, vad_windows, *_worker_families(worker_health(), current)]

        self.registry.register(_LiveCollector(read))

    def observe_batch(
        self, requests: Sequence[RecognitionRequest], results: Sequence[RecognitionResult]
    ) -> None:
        """BatchScheduler observer: one call per batch that ran."""
        self.batch_size.observe(len(requests))
        self.batch_sessions.observe(len({r.session_id for r in requests}))
        if results:
            self.inference.observe(results[0].inference)
        for request, result in zip(requests, results, strict=True):
            self.queue_wait.labels(request.priority.name.lower()).observe(result.queue_wait)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # Telemetry protocol (session.telemetry) -------------------------------------------

    def vad_processed(self, seconds: float, windows: int) -> None:
        self.vad_seconds.observe(seconds)

    def partial_sent(self, since_previous: float | None) -> None:
        self.partials.inc()
        if since_previous is not None:
            self.partial_interval.observe(since_previous)

    def partial_dropped(self, reason: str) -> None:
        self.partials_dropped.labels(reason).inc()

    def final_sent(self, latency: float) -> None:
        self.finals.inc()
        self.final_latency.observe(latency)

    def speculative_final(self, outcome: str) -> None:
        self.speculative_finals.labels(outcome).inc()

    def flush_answered(self, seconds: float, served: str) -> None:
        self.flush.labels(served).observe(seconds)

    def session_closed(self, reason: str, close_code: int) -> None:
        self.sessions.labels(reason, str(close_code)).inc()


def _heap_families() -> list[Metric]:
    """What this process's heaps hold: a leak grows what is in use, fragmentation what
    malloc keeps free (docs/performance.md#long-runs-memory)."""
    usage = heap_usage()
    blocks = GaugeMetricFamily(
        "parley_python_allocated_blocks", "Blocks held by Python's allocator (objects, buffers)"
    )
    blocks.add_metric([], usage.python_blocks)
    heap = GaugeMetricFamily(
        "parley_malloc_bytes",
        "This process's malloc heap (glibc): in_use (allocated), free (freed but kept)",
        labels=["kind"],
    )
    if usage.malloc_in_use is not None and usage.malloc_free is not None:
        heap.add_metric(["in_use"], usage.malloc_in_use)
        heap.add_metric(["free"], usage.malloc_free)
    return [blocks, heap]


def _worker_families(health: WorkerHealth | None, scheduler: BatchScheduler | None) -> list[Metric]:
    """The model workers up, and the worker processes restarted by reason (threads: every
    worker is up, none is restarted)."""
    alive = GaugeMetricFamily(
        "parley_model_workers_alive",
        "Model workers up and serving (a worker process being restarted is not)",
    )
    threads = scheduler.workers if scheduler else 0
    alive.add_metric([], health.alive if health else threads)
    restarts = CounterMetricFamily(
        "parley_model_worker_restarts",
        "Model worker processes replaced, by reason: died, hung (no heartbeat), "
        "load_failed (a replacement that failed or timed out to load)",
        labels=["reason"],
    )
    for reason in RESTART_REASONS:
        restarts.add_metric([reason], health.restarts[reason] if health else 0)
    return [alive, restarts]
