"""The engine as the settings configure it, computed once: which model and how it runs
(`ModelConfig`), how many model workers with how many threads, and the scheduler's
`SchedulerConfig`. The server builds its engine from `plan_engine(settings)`; the benches
and the tests build theirs the same way, so they run what users run."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from engine.loading import ModelConfig, resolve_device, worker_plan
from engine.scheduling.config import SchedulerConfig
from server.settings import Settings


@dataclass(frozen=True, slots=True)
class EnginePlan:
    model: ModelConfig
    workers: int  # model workers, each running one batch at a time
    threads: int  # torch threads of each
    scheduler: SchedulerConfig


def model_config(settings: Settings) -> ModelConfig:
    model, context = settings.model, settings.context
    return ModelConfig(
        model=model.model,
        cache=Path(model.model_cache),
        device=model.device,
        dtype=model.dtype,
        encoder_dtype=model.encoder_dtype,
        quantize=model.quantize,
        partial_quantize=model.partial_quantize,
        drafts=model.drafts,
        prompt_tokens=context.prompt_tokens,
        context_window=context.context_window_s,
        context_own_window=context.context_own_window,
        word_timings=model.word_timings,
        decoder_graphs=model.decoder_graphs,
        workers=model.model_workers,
        torch_threads=model.torch_threads,
    )


def flat_batches(settings: Settings, model: ModelConfig) -> bool:
    """Whether a batch costs about what one row does (`PARLEY_BATCH_COST`; auto: on CUDA)."""
    cost = settings.scheduler.batch_cost
    if cost == "auto":
        return resolve_device(model) == "cuda"
    return cost == "flat"


def scheduler_config(settings: Settings, workers: int, flat: bool) -> SchedulerConfig:
    """The scheduler's config: `workers` model workers, `flat` batches (`flat_batches`)."""
    batching, context = settings.scheduler, settings.context
    return SchedulerConfig(
        workers=workers,
        max_batch_size=batching.max_batch_size,
        # MAX_PARTIAL_BATCH is at most MAX_BATCH_SIZE (its help says so)
        max_partial_batch=min(batching.max_partial_batch, batching.max_batch_size),
        max_wait=batching.batch_wait_ms / 1000,
        max_queue=batching.max_queue,
        partial_share=batching.partial_share,
        partial_wait=batching.partial_wait_ms / 1000,
        flat_batches=flat,
        context_below=context.context_gate,
        context_budget=context.context_budget,
    )


def describe_plan(plan: EnginePlan) -> str:
    """The effective engine settings on one line: the server logs it when its model is
    ready, and the benches print it, so a run says what it ran."""
    scheduler = ", ".join(
        f"{f.name}={getattr(plan.scheduler, f.name)}" for f in fields(plan.scheduler)
    )
    return (
        f"engine: {plan.workers} model workers x {plan.threads} torch threads; "
        f"scheduler: {scheduler}"
    )


@functools.cache
def plan_engine(settings: Settings) -> EnginePlan:
    """The plan of these settings, computed once (the recognizer's factory and the
    lifespan ask for the same one)."""
    model = model_config(settings)
    workers, threads = worker_plan(model)
    return EnginePlan(
        model, workers, threads, scheduler_config(settings, workers, flat_batches(settings, model))
    )


def scheduler_config_with(**fields: Any) -> SchedulerConfig:
    """The scheduler config of the default settings (one worker, batches costed per row),
    with `fields` replaced: how benches and tests build a scheduler of their own. A smaller
    `max_batch_size` bounds the partial batch and the queue's least size with it."""
    base = scheduler_config(Settings.from_env({}), workers=1, flat=False)
    batch = fields.get("max_batch_size", base.max_batch_size)
    fields.setdefault("max_partial_batch", min(base.max_partial_batch, batch))
    return replace(base, **fields)


def model_config_with(**fields: Any) -> ModelConfig:
    """The model config of the default settings with `fields` replaced (benches, tests)."""
    return replace(model_config(Settings.from_env({})), **fields)
