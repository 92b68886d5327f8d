"""The Starlette application and its lifespan.

The lifespan owns the shared resources: the store, the VAD model, the speech model and
the batch scheduler. The speech model loads in the background so `/healthz` answers at
once and `/readyz` says when streams can be served. Shutdown runs in order: refuse new
streams, drain sessions (each flushes its finals), stop the scheduler, close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from engine.loading import (
    ModelConfig,
    load_whisper,
    resolve_device,
    set_torch_threads,
    worker_plan,
)
from engine.recognizer import Recognizer
from engine.scheduler import BatchScheduler
from engine.speakers import SpeakerEmbedder, SpeakerEncoder
from engine.worker_processes import ProcessRecognizer, in_processes
from server import rest, stream, uploads
from server.auth import build_authenticator
from server.compat import routes as compat_routes
from server.jobs import JobRegistry
from server.limits import CapacityMonitor, ListenerQuota, Slots
from server.memory_trim import trim_memory_forever
from server.metrics import Metrics
from server.registry import SessionRegistry
from server.sandbox import SandboxMode, open_sandbox
from server.settings import Settings
from server.state import AppState, ModelState
from server.tokens import open_tokens
from session.actor import CLOSE_TIMEOUT
from session.diarizer import DiarizerConfig
from session.segmenter import SegmenterConfig
from session.services import DIARIZATION_OFF, SessionServices
from session.vad import DirectScorer, SileroVad, VadBatcher, VadScorer
from store.factory import open_store
from store.ttl import TTLSettings

logger = logging.getLogger(__name__)

RecognizerFactory = Callable[[Settings], Recognizer]


def model_config(settings: Settings) -> ModelConfig:
    return ModelConfig(
        model=settings.model,
        cache=Path(settings.model_cache),
        device=settings.device,
        dtype=settings.dtype,  # type: ignore[arg-type]  # Settings checked the value
        encoder_dtype=settings.encoder_dtype,  # type: ignore[arg-type]  # Settings checked it
        quantize=settings.quantize,  # type: ignore[arg-type]  # Settings checked the value
        partial_quantize=settings.partial_quantize,  # type: ignore[arg-type]  # checked too
        drafts=settings.drafts,
        prompt_tokens=settings.prompt_tokens,
        context_window=settings.context_window_s,
        context_own_window=settings.context_own_window,
        word_timings=settings.word_timings,
        workers=settings.model_workers,
        torch_threads=settings.torch_threads,
        max_batch_size=settings.max_batch_size,
    )


def whisper_recognizer(settings: Settings) -> Recognizer:
    """The default recognizer (blocking): Whisper, as the settings say, in worker
    processes (`PARLEY_MODEL_PROCESSES`) or in this one."""
    config = model_config(settings)
    if in_processes(settings.model_processes, config):  # type: ignore[arg-type]  # checked
        workers, threads = worker_plan(config)
        return ProcessRecognizer(config, workers, threads, settings.malloc_trim_interval_s)
    return load_whisper(config)


def flat_batches(settings: Settings) -> bool:
    """Whether a batch costs about what one row does (`PARLEY_BATCH_COST`; auto: on CUDA)."""
    if settings.batch_cost == "auto":
        return resolve_device(model_config(settings)) == "cuda"
    return settings.batch_cost == "flat"


def segmenter_config(settings: Settings) -> SegmenterConfig:
    return SegmenterConfig(
        threshold=settings.vad_threshold,
        min_silence=settings.min_silence_ms / 1000,
        speculate_after=settings.speculate_after_ms / 1000,
        pre_roll=settings.pre_roll_ms / 1000,
        max_utterance=settings.max_utterance_s,
        partial_interval=settings.partial_interval_s,
    )


async def _load_speakers() -> tuple[SpeakerEmbedder | None, str]:
    """The speaker model for diarization, or why there is none: an optional part that is
    missing or broken switches diarization off with a warning; it never stops
    transcription."""
    try:
        return SpeakerEmbedder(await asyncio.to_thread(SpeakerEncoder)), ""
    except Exception as exc:
        reason = f"diarization is unavailable on this server: {exc}"
        logger.warning("%s; transcription goes on without it", reason)
        return None, reason


async def _load_model(state: AppState, factory: RecognizerFactory) -> None:
    settings = state.settings
    try:
        recognizer = state.recognizer = await asyncio.to_thread(factory, settings)
        await asyncio.to_thread(recognizer.warmup)
        vad_model = await asyncio.to_thread(SileroVad)
        speakers, speakers_off = (
            await _load_speakers() if settings.diarization else (None, DIARIZATION_OFF)
        )
    except Exception as exc:
        logger.exception("model failed to load")
        state.model_state = ModelState.FAILED
        state.model_error = f"{type(exc).__name__}: {exc}"
        return
    vad: VadScorer = (
        VadBatcher(vad_model, max_delay=settings.vad_batch_ms / 1000)
        if settings.vad_batch
        else DirectScorer(vad_model)
    )
    state.file_vad = DirectScorer(vad_model)  # uploads score runs of windows, unbatched
    workers, threads = worker_plan(model_config(settings))
    scheduler = BatchScheduler(
        recognizer,
        workers=workers,
        max_batch_size=settings.max_batch_size,
        max_partial_batch=settings.max_partial_batch,
        max_wait=settings.batch_wait_ms / 1000,
        max_queue=settings.max_queue,
        partial_share=settings.partial_share,
        partial_wait=settings.partial_wait_ms / 1000,
        context_below=settings.context_gate,
        context_budget=settings.context_budget,
        flat_batches=flat_batches(settings),
        worker_init=partial(set_torch_threads, threads),
    )
    scheduler.add_observer(state.metrics.observe_batch)
    scheduler.add_observer(state.capacity.observe_batch)
    scheduler.start()
    state.scheduler = scheduler
    state.recognizer_name = recognizer.name
    state.services = SessionServices(
        scheduler=scheduler,
        store=state.store,
        vad=vad,
        segmenter=segmenter_config(settings),
        max_frame_bytes=settings.max_frame_bytes,
        outbox_limit=settings.outbox_limit,
        languages=recognizer.languages,
        prompts=settings.prompt_tokens > 0,
        left_context=settings.left_context_s,
        context_wait=settings.context_wait_ms / 1000,
        context_languages=settings.left_context_language_set,
        telemetry=state.metrics,
        speakers=speakers,
        speakers_off=speakers_off,
        diarizer=DiarizerConfig(max_speakers=settings.diarization_max_speakers),
    )
    state.model_state = ModelState.READY
    logger.info(
        "model %s ready: %d workers (%s), %d torch threads each",
        recognizer.name,
        workers,
        "processes" if isinstance(recognizer, ProcessRecognizer) else "threads",
        threads,
    )


async def drain(state: AppState) -> None:
    """Refuse new streams and let every session flush its finals (bounded). Sessions
    still waiting for the model after the drain timeout: the engine stops, and each says
    how many finals it lost (`session.ended`, close 1012) before uvicorn closes sockets."""
    if await state.registry.drain(state.settings.drain_timeout_s):
        return
    if state.scheduler is not None:
        await state.scheduler.stop()
        await state.registry.drain(2 * CLOSE_TIMEOUT)  # their last messages and close


def create_app(
    settings: Settings | None = None, recognizer_factory: RecognizerFactory = whisper_recognizer
) -> Starlette:
    settings = settings or Settings.from_env()
    # Fails here, at start, on a bad key entry (ValueError), not on the first request.
    auth = build_authenticator(
        api_keys=settings.api_keys,
        api_keys_file=settings.api_keys_file,
        tokens=open_tokens(
            settings.redis_url, settings.store_prefix, per_tenant=settings.max_tokens_per_tenant
        ),
        allowed_origins=settings.allowed_origins,
        fast_replay_tenants=settings.fast_replay_tenants,
        token_ttl_s=settings.token_ttl_s,
    )
    if not auth.enabled:
        logger.warning("no API keys configured: authentication is OFF (development mode)")
    # Fails here (SandboxUnavailable) when PARLEY_UPLOAD_SANDBOX=bwrap cannot be honoured.
    sandbox = open_sandbox(
        SandboxMode(settings.upload_sandbox),
        hidden=[Path(settings.api_keys_file)] if settings.api_keys_file else [],
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, AppState]]:
        registry = SessionRegistry(settings.max_sessions)
        state = AppState(
            settings=settings,
            store=open_store(
                settings.redis_url,
                prefix=settings.store_prefix,
                ttl=TTLSettings(base_s=settings.meeting_ttl_s, decay_s=settings.meeting_ttl_s),
            ),
            registry=registry,
            metrics=Metrics(),
            jobs=JobRegistry(settings, live_streams=lambda: len(registry), sandbox=sandbox),
            auth=auth,
            capacity=CapacityMonitor(
                settings.admit_max_queue_wait_ms / 1000, settings.max_batch_size
            ),
            stream_slots=Slots(settings.max_streams_per_key),
            listener_slots=ListenerQuota(
                settings.max_listeners_per_meeting,
                settings.max_listeners_per_tenant,
                settings.max_listeners,
            ),
            waiting_auth=Slots(settings.max_waiting_auth),
        )
        state.metrics.watch(
            lambda: state.scheduler,
            lambda: len(state.registry),
            lambda: state.registry.meetings,
            lambda: state.store.failures,
            lambda: state.services.vad if state.services else None,
        )
        app.state.parley = state  # for the CLI's graceful shutdown hook
        state.loader = asyncio.create_task(_load_model(state, recognizer_factory))
        trimmer = (
            asyncio.create_task(trim_memory_forever(settings.malloc_trim_interval_s))
            if settings.malloc_trim_interval_s > 0
            else None
        )
        try:
            yield {"parley": state}
        finally:
            background = [task for task in (state.loader, trimmer) if task is not None]
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await drain(state)
            await state.jobs.close()  # uploads are cancelled, not drained: they may be hours
            if state.scheduler is not None:
                drained = await state.scheduler.drain(settings.drain_timeout_s)
                if not drained:
                    logger.warning("scheduler still busy at shutdown; failing what is left")
                await state.scheduler.stop()
            if isinstance(state.recognizer, ProcessRecognizer):
                await asyncio.to_thread(state.recognizer.close)
            if state.services is not None and isinstance(state.services.speakers, SpeakerEmbedder):
                await state.services.speakers.close()
            await state.store.close()
            await state.auth.close()

    routes: list[BaseRoute] = [
        WebSocketRoute("/v1/meetings/{meeting_id}/stream", stream.stream_endpoint),
        WebSocketRoute("/v1/meetings/{meeting_id}/events", stream.events_endpoint),
        WebSocketRoute("/v1/listen", compat_routes.listen_endpoint),  # Deepgram live
        WebSocketRoute("/v1/realtime", compat_routes.realtime_endpoint),  # OpenAI realtime
        Route("/v1/meetings/{meeting_id}/transcript", rest.transcript, methods=["GET"]),
        Route("/v1/transcriptions", uploads.create_transcription, methods=["POST"]),
        Route("/v1/transcriptions/{job_id}", uploads.get_transcription, methods=["GET"]),
        Route("/v1/transcriptions/{job_id}", uploads.delete_transcription, methods=["DELETE"]),
        Route("/v1/meetings/{meeting_id}/tokens", rest.mint_token, methods=["POST"]),
        Route("/healthz", rest.healthz, methods=["GET"]),
        Route("/readyz", rest.readyz, methods=["GET"]),
        Route("/metrics", rest.metrics, methods=["GET"]),
    ]
    static_dir = Path(settings.static_dir)
    if static_dir.is_dir():
        routes.append(Mount("/", StaticFiles(directory=static_dir, html=True), name="static"))
    return Starlette(routes=routes, lifespan=lifespan)
