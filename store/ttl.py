"""How long a meeting's context lives in the store: a decaying, activity-aware TTL.

    ttl = base * max(floor, 1 - idle / decay) * min(cap, 1 + per_access * accesses)
          * (1 + jitter * u)

- `accesses` counts every store call that touches the meeting (source created or resumed,
  final appended, transcript read), this one included.
- `idle` is the time since the meeting's last *write* (a final, a new or resumed source).
  A write is activity, so a write always computes with idle = 0 and *sets* the TTL. A read
  computes with the idle time so far and may only *extend* the TTL: reading an old
  transcript buys it a lease that shrinks the longer the meeting has been quiet.
- `u` is drawn uniformly from [-1, 1] so keys written together do not expire together.

The same arithmetic runs inside the Redis Lua scripts (store/redis/scripts.py); it is kept
in this order, in doubles, so both give the same millisecond. docs/store.md has the
constants and why.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Protocol

MIN_TTL_MS = 1_000  # never hand Redis a TTL so small that a key expires between two calls


class Clock(Protocol):
    """Wall-clock seconds since the epoch (shared across processes through the store)."""

    def __call__(self) -> float: ...


def system_clock() -> float:
    return time.time()


@dataclass(frozen=True, slots=True)
class TTLSettings:
    """The policy's constants (docs/store.md). The server sets `base_s` and `decay_s`
    from `PARLEY_MEETING_TTL_S`; the others are these defaults, no setting changes them."""

    base_s: float = 24 * 3600.0  # TTL of a meeting written once, before growth and decay
    floor: float = 0.3  # the decay factor never goes below this
    decay_s: float = 24 * 3600.0  # idle time at which the decay factor would reach 0
    per_access: float = 0.1  # growth per access
    cap: float = 2.0  # growth factor ceiling (reached after 10 accesses)
    jitter: float = 0.15  # ± fraction

    def __post_init__(self) -> None:
        if not self.base_s > 0:
            raise ValueError("base_s must be > 0")
        if not 0 < self.floor <= 1:
            raise ValueError("floor must lie in (0, 1]")
        if not self.decay_s > 0:
            raise ValueError("decay_s must be > 0")
        if self.per_access < 0:
            raise ValueError("per_access must be >= 0")
        if self.cap < 1:
            raise ValueError("cap must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must lie in [0, 1)")

    @property
    def max_ttl_ms(self) -> int:
        """The longest TTL the policy can give (busy meeting, no idle, +jitter)."""
        return ttl_ms(self, idle_s=0.0, accesses=1e12, u=1.0)

    def lua_args(self) -> list[str]:
        """The constants as Lua script arguments, in the order the scripts read them."""
        return [
            repr(self.base_s * 1000.0),
            repr(self.floor),
            repr(self.decay_s),
            repr(self.per_access),
            repr(self.cap),
            repr(self.jitter),
        ]


def ttl_ms(settings: TTLSettings, *, idle_s: float, accesses: float, u: float) -> int:
    """The TTL in milliseconds for a meeting idle `idle_s` after `accesses` accesses."""
    decay = max(settings.floor, 1 - max(0.0, idle_s) / settings.decay_s)
    growth = min(settings.cap, 1 + settings.per_access * accesses)
    value = math.floor(settings.base_s * 1000.0 * decay * growth * (1 + settings.jitter * u))
    return max(MIN_TTL_MS, value)


def ttl_bounds_ms(settings: TTLSettings, *, idle_s: float, accesses: float) -> tuple[int, int]:
    """The range jitter can put the TTL in, both ends included."""
    return (
        ttl_ms(settings, idle_s=idle_s, accesses=accesses, u=-1.0),
        ttl_ms(settings, idle_s=idle_s, accesses=accesses, u=1.0),
    )


def draw_jitter(rng: random.Random) -> float:
    """One `u` in [-1, 1]."""
    return rng.uniform(-1.0, 1.0)
