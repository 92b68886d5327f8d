"""Whether Redis answers, as the Redis store's parts see it: which errors mean
"unreachable", and the one reachability state they share (for logs, errors, /readyz)."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from store.errors import StoreUnavailable

logger = logging.getLogger(__name__)

# Errors after which Redis is treated as unreachable (the write is buffered). Python's
# TimeoutError is an OSError; a READONLY reply means we talk to a replica mid-failover.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, ReadOnlyError)


class Link:
    """The last word on reachability: `failing` after a failed call, until one succeeds.
    Each change is logged once, not on every call."""

    def __init__(self) -> None:
        self.failing = False  # the last call to Redis failed
        self.last_error = ""
        self.failures = 0  # calls that failed, ever (parley_store_errors_total)

    def note_failure(self, exc: BaseException) -> None:
        self.failures += 1
        if not self.failing:
            logger.warning("redis unreachable: %s", exc)
        self.failing = True
        self.last_error = f"{type(exc).__name__}: {exc}"

    def note_error(self, reason: str) -> None:
        """Redis answered with an error (already logged by the caller)."""
        self.failures += 1
        self.failing = True
        self.last_error = reason

    def note_success(self) -> None:
        if self.failing:
            logger.warning("redis reachable again")
        self.failing = False

    def unavailable(self, exc: BaseException, what: str) -> StoreUnavailable:
        self.note_failure(exc)
        return StoreUnavailable(f"redis unreachable ({self.last_error}): cannot {what}")


def log_crash(task: asyncio.Task[None]) -> None:
    """A background task of the store died of a bug: say so loudly, with the traceback."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("store task %s crashed", task.get_name(), exc_info=exc)
