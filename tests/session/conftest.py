"""Fixtures shared by the session tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bench.fake_recognizer import FakeRecognizer
from engine.scheduling.scheduler import BatchScheduler
from tests.support.scheduling import scheduler_config


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeRecognizer, BatchScheduler]]:
    """A started scheduler over a fake recognizer (batches of up to 8)."""
    recognizer = FakeRecognizer()
    scheduler = BatchScheduler(recognizer, scheduler_config(max_batch_size=8))
    scheduler.start()
    yield recognizer, scheduler
    await scheduler.stop()
