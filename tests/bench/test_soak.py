"""bench/soak's arithmetic and its wait for a round's streams to close."""

from __future__ import annotations

import os
from typing import cast

import pytest

from bench.processes import ServerProcess, status_kbs
from bench.soak import floor_slope, streams_closed


class Draining:
    """A server whose streams close one per /metrics read (the real one closes each a
    moment after its client's stop)."""

    def __init__(self, open_streams: int) -> None:
        self.open = open_streams
        self.reads = 0

    def active_sessions(self) -> int:
        self.reads += 1
        self.open = max(0, self.open - 1)
        return self.open


def test_the_between_rounds_sample_waits_for_the_streams_to_close() -> None:
    server = Draining(3)
    assert streams_closed(cast(ServerProcess, server), timeout_s=5.0)
    assert server.open == 0 and server.reads == 3


def test_a_stream_that_never_closes_is_waited_for_a_bounded_time() -> None:
    class Stuck(Draining):
        def active_sessions(self) -> int:
            return 1

    assert not streams_closed(cast(ServerProcess, Stuck(1)), timeout_s=0.6)


def test_floor_slope_is_percent_of_the_mean_per_hour() -> None:
    # 100 MiB rising 1 MiB an hour (1/60 a minute): ~1 % of the mean per hour.
    floors = {m: 100.0 + m / 60 for m in range(15, 75)}
    assert floor_slope(floors) == pytest.approx(100 / (100 + 44.5 / 60), rel=1e-6)
    assert floor_slope({1: 5.0, 2: 6.0}) != floor_slope({1: 5.0, 2: 6.0})  # NaN: too few


def test_rss_and_its_anonymous_part_come_from_one_read() -> None:
    rss, anon = status_kbs(os.getpid(), "VmRSS:", "RssAnon:")
    assert rss >= anon > 0
    with pytest.raises(RuntimeError, match="no Nope:"):
        status_kbs(os.getpid(), "VmRSS:", "Nope:")
