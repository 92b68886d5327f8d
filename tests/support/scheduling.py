"""The scheduler config the scheduler and session tests were written against."""

from __future__ import annotations

from typing import Any

from engine.scheduling.config import SchedulerConfig
from server.engine_plan import scheduler_config_with


def scheduler_config(**fields: Any) -> SchedulerConfig:
    """The server's scheduler config (`server.engine_plan`) with what the scheduler and
    session tests were written against, unless a test says otherwise: one worker, partials
    on half the model's time, partial batches of up to 16 (at most a batch), and no
    left-context gate or budget (`fields` override any of these and name any other field)."""
    pinned: dict[str, Any] = {
        "partial_share": 0.5,
        "max_partial_batch": min(16, fields.get("max_batch_size", 16)),
        "context_below": None,
        "context_budget": None,
    }
    return scheduler_config_with(**{**pinned, **fields})
