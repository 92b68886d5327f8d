"""What a session reports about itself, without knowing where it goes.

The server implements this with Prometheus metrics; tests and tools may use NullTelemetry.
"""

from __future__ import annotations

from typing import Protocol


class Telemetry(Protocol):
    def vad_processed(self, seconds: float, windows: int) -> None:
        """VAD + segmenter time spent on one frame, and how many windows it scored."""

    def partial_sent(self, since_previous: float | None) -> None:
        """A partial went out; `since_previous` is the gap to the last one of its utterance."""

    def partial_dropped(self, reason: str) -> None:
        """A partial was not sent: 'queue_full', 'superseded', 'cancelled' (before a
        result came), 'stale' (its result came after its final), 'empty', 'failed' or
        'waiting' (an earlier final of the source is still open: its prompt is unknown)."""

    def final_sent(self, latency: float) -> None:
        """A final went out, `latency` seconds after its utterance was closed."""

    def speculative_final(self, outcome: str) -> None:
        """A speculative final ended: 'used' by its final, 'discarded' (the model had
        started on it) or 'cancelled' (dropped while queued)."""

    def flush_answered(self, seconds: float, served: str) -> None:
        """A client's flush got its final `seconds` after it was received, served from a
        'speculation' ready by then, a 'speculation_unfinished' or 'decoded' at the flush."""

    def session_closed(self, reason: str, close_code: int) -> None: ...


class NullTelemetry:
    def vad_processed(self, seconds: float, windows: int) -> None:
        return None

    def partial_sent(self, since_previous: float | None) -> None:
        return None

    def partial_dropped(self, reason: str) -> None:
        return None

    def final_sent(self, latency: float) -> None:
        return None

    def speculative_final(self, outcome: str) -> None:
        return None

    def flush_answered(self, seconds: float, served: str) -> None:
        return None

    def session_closed(self, reason: str, close_code: int) -> None:
        return None
