"""The Starlette application and its lifespan.

The lifespan owns the shared resources: the store, the VAD model, the speech model and
the batch scheduler. The speech model loads in the background so `/healthz` answers at
once and `/readyz` says when streams can be served. Shutdown runs in order: refuse new
streams, drain sessions (each flushes its finals), stop the scheduler, close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from engine.loading import load_whisper, set_torch_threads
from engine.memory import freeze_startup_objects
from engine.recognizer import Recognizer
from engine.scheduling.scheduler import BatchScheduler
from engine.speakers import SpeakerEmbedder, SpeakerEncoder
from engine.workers.processes import ProcessRecognizer, in_processes
from server.auth.access import ProxyHeaders, start_line, trusted_proxies
from server.auth.keys import build_authenticator
from server.auth.tokens import open_tokens
from server.compat import routes as compat_routes
from server.engine_plan import describe_plan, plan_engine
from server.heap_report import install_heap_reports, remove_heap_reports
from server.http import rest
from server.http import speakers as speakers_api
from server.http.problems import EXCEPTION_HANDLERS
from server.limits import CapacityMonitor, ListenerQuota, Slots, Turns
from server.memory_trim import trim_memory_forever
from server.metrics import Metrics
from server.registry import SessionRegistry
from server.settings import SettingError, Settings
from server.sockets import listeners, stream
from server.sockets.takeovers import watch_takeovers
from server.state import AppState, ModelState
from server.uploads import routes as uploads
from server.uploads.jobs import JobRegistry
from server.uploads.sandbox import SandboxMode, open_sandbox
from session.actor import CLOSE_TIMEOUT
from session.diarizer import DiarizerConfig
from session.segmenter import SegmenterConfig
from session.services import DIARIZATION_OFF, SessionServices
from session.turn import SmartTurn, TurnBatcher
from session.vad import DirectScorer, SileroVad, VadBatcher, VadScorer
from store.factory import open_store
from store.ttl import TTLSettings

logger = logging.getLogger(__name__)

RecognizerFactory = Callable[[Settings], Recognizer]


def whisper_recognizer(settings: Settings) -> Recognizer:
    """The default recognizer (blocking): Whisper, as the settings say, in worker
    processes (`PARLEY_MODEL_PROCESSES`) or in this one."""
    plan = plan_engine(settings)
    if in_processes(settings.model.model_processes, plan.model):
        return ProcessRecognizer(
            plan.model,
            plan.workers,
            plan.threads,
            settings.server.malloc_trim_interval_s,
            hang_after=settings.model.worker_hang_s,
        )
    return load_whisper(plan.model)


def segmenter_config(settings: Settings) -> SegmenterConfig:
    segmenter, turns = settings.segmenter, settings.turns
    return SegmenterConfig(
        threshold=segmenter.vad_threshold,
        min_silence=segmenter.min_silence_ms / 1000,
        speculate_after=segmenter.speculate_after_ms / 1000,
        pre_roll=segmenter.pre_roll_ms / 1000,
        max_utterance=segmenter.max_utterance_s,
        partial_interval=segmenter.partial_interval_s,
        turn_silence=turns.turn_silence_ms / 1000 if turns.turn_model else 0.0,
        turn_hold=max(turns.turn_hold_ms, segmenter.min_silence_ms) / 1000,
        turn_threshold=turns.turn_threshold,
    )


async def _load_turns(settings: Settings) -> TurnBatcher | None:
    """The turn model when PARLEY_TURN_MODEL is on; a missing one is a warning (the fixed
    silence rule serves), never a stop."""
    if not settings.turns.turn_model:
        return None
    try:
        model = await asyncio.to_thread(SmartTurn)
        await asyncio.to_thread(model.warmup)
        return TurnBatcher(model)
    except Exception as exc:
        logger.warning(
            "end of turn by the model is unavailable (%s): silence alone ends turns", exc
        )
        return None


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
    """Load the models and start the scheduler in the background. Whatever fails on the
    way (the load, or what is built from it) is logged with its traceback and reported
    by `/readyz` (503, model `failed`, with the reason), never lost in the task."""
    try:
        await _start_model(state, factory)
    except Exception as exc:
        logger.exception("model failed to load")
        state.model_state = ModelState.FAILED
        state.model_error = f"{type(exc).__name__}: {exc}"


async def _start_model(state: AppState, factory: RecognizerFactory) -> None:
    settings = state.settings
    loading = asyncio.ensure_future(asyncio.to_thread(factory, settings))
    try:
        recognizer = state.recognizer = await asyncio.shield(loading)
    except asyncio.CancelledError:  # shut down mid-load: the thread cannot be stopped
        built = await asyncio.gather(loading, return_exceptions=True)
        if isinstance(built[0], ProcessRecognizer):  # its children would outlive us
            await asyncio.to_thread(built[0].close)
        raise
    await asyncio.to_thread(recognizer.warmup)
    vad_model = await asyncio.to_thread(SileroVad)
    speakers, speakers_off = (
        await _load_speakers() if settings.speakers.diarization else (None, DIARIZATION_OFF)
    )
    segmenter = settings.segmenter
    vad: VadScorer = (
        VadBatcher(vad_model, max_delay=segmenter.vad_batch_ms / 1000)
        if segmenter.vad_batch
        else DirectScorer(vad_model)
    )
    state.file_vad = DirectScorer(vad_model)  # uploads score runs of windows, unbatched
    plan = plan_engine(settings)
    context = settings.context
    scheduler = BatchScheduler(
        recognizer, plan.scheduler, worker_init=partial(set_torch_threads, plan.threads)
    )
    services = SessionServices(
        scheduler=scheduler,
        store=state.store,
        vad=vad,
        segmenter=segmenter_config(settings),
        max_frame_bytes=settings.streams.max_frame_bytes,
        outbox_limit=settings.streams.outbox_limit,
        languages=recognizer.languages,
        prompts=context.prompt_tokens > 0,
        left_context=context.left_context_s,
        context_after_flush=context.context_after_flush,
        context_wait=context.context_wait_ms / 1000,
        context_languages=context.left_context_language_set,
        telemetry=state.metrics,
        speakers=speakers,
        speakers_off=speakers_off,
        diarizer=DiarizerConfig(max_speakers=settings.speakers.diarization_max_speakers),
        speaker_match=settings.speakers.speaker_match_similarity,
        turns=await _load_turns(settings),
        turn_words=settings.turns.turn_words,
    )
    scheduler.add_observer(state.metrics.observe_batch)
    scheduler.add_observer(state.capacity.observe_batch)
    scheduler.start()
    state.scheduler = scheduler
    state.recognizer_name = recognizer.name
    state.services = services
    state.model_state = ModelState.READY
    logger.info(
        "model %s ready in %s; %s; %d startup objects frozen",
        recognizer.name,
        "processes" if isinstance(recognizer, ProcessRecognizer) else "threads",
        describe_plan(plan),
        freeze_startup_objects(),  # engine/memory.py: full collections skip them
    )


async def drain(state: AppState) -> None:
    """Refuse new streams and let every session flush its finals (bounded). Sessions
    still waiting for the model after the drain timeout: the engine stops, and each says
    how many finals it lost (`session.ended`, close 1012) before uvicorn closes sockets."""
    if await state.registry.drain(state.settings.server.drain_timeout_s):
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
        api_keys=settings.auth.api_keys,
        api_keys_file=settings.auth.api_keys_file,
        tokens=open_tokens(
            settings.store.redis_url,
            settings.store.store_prefix,
            per_tenant=settings.auth.max_tokens_per_tenant,
        ),
        allowed_origins=settings.auth.allowed_origins,
        fast_replay_tenants=settings.auth.fast_replay_tenants,
        token_ttl_s=settings.auth.token_ttl_s,
        protected_mode=settings.auth.protected_mode,
        allowed_hosts=settings.auth.allowed_hosts,
    )
    upload_dir = settings.uploads.upload_dir
    if upload_dir is not None:  # made here, not at the first upload, so a bad one stops the start
        try:
            Path(upload_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SettingError(
                "upload_dir", upload_dir, f"cannot make it a folder: {exc}"
            ) from None
    # Fails here (SandboxUnavailable) when PARLEY_UPLOAD_SANDBOX=bwrap cannot be honoured.
    sandbox = open_sandbox(
        SandboxMode(settings.uploads.upload_sandbox),
        hidden=[Path(settings.auth.api_keys_file)] if settings.auth.api_keys_file else [],
    )
    # Said once nothing above refused to start: keys, protected, or anonymous on purpose.
    logger.log(*start_line(auth.access, settings.server.host, settings.server.port))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, AppState]]:
        registry = SessionRegistry(settings.streams.max_sessions, settings.streams.resume_headroom)
        store = open_store(
            settings.store.redis_url,
            prefix=settings.store.store_prefix,
            ttl=TTLSettings(
                base_s=settings.store.meeting_ttl_s, decay_s=settings.store.meeting_ttl_s
            ),
            node_lease_s=settings.store.node_lease_s,
        )
        state = AppState(
            settings=settings,
            store=store,
            registry=registry,
            metrics=Metrics(),
            jobs=JobRegistry(
                settings.uploads, store.jobs, live_streams=lambda: len(registry), sandbox=sandbox
            ),
            auth=auth,
            capacity=CapacityMonitor(
                settings.streams.admit_max_queue_wait_ms / 1000, settings.scheduler.max_batch_size
            ),
            listener_slots=ListenerQuota(
                store.quotas,
                settings.streams.max_listeners_per_meeting,
                settings.streams.max_listeners_per_tenant,
                settings.streams.max_listeners,
            ),
            waiting_auth=Slots(settings.auth.max_waiting_auth),
            enrollments=Turns(
                "enrollments",
                settings.speakers.enrol_concurrency,
                settings.speakers.enrol_queue,
                settings.speakers.enrol_wait_s,
            ),
        )
        state.metrics.watch(
            lambda: state.scheduler,
            lambda: len(state.registry),
            lambda: state.registry.meetings,
            lambda: state.store.failures,
            lambda: state.services.vad if state.services else None,
            state.worker_health,
        )
        app.state.parley = state  # for the CLI's graceful shutdown hook
        state.loader = asyncio.create_task(_load_model(state, recognizer_factory))
        install_heap_reports()
        trimmer = (
            asyncio.create_task(trim_memory_forever(settings.server.malloc_trim_interval_s))
            if settings.server.malloc_trim_interval_s > 0
            else None
        )
        takeovers = asyncio.create_task(watch_takeovers(store, registry), name="takeovers")
        try:
            yield {"parley": state}
        finally:
            background = [t for t in (state.loader, trimmer, takeovers) if t is not None]
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            remove_heap_reports()
            await drain(state)
            await state.jobs.close()  # uploads are cancelled, not drained: they may be hours
            if state.scheduler is not None:
                drained = await state.scheduler.drain(settings.server.drain_timeout_s)
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
        WebSocketRoute("/v1/meetings/{meeting_id}/events", listeners.events_endpoint),
        WebSocketRoute("/v1/listen", compat_routes.listen_endpoint),  # Deepgram live
        WebSocketRoute("/v2/listen", compat_routes.flux_endpoint),  # Deepgram Flux
        WebSocketRoute("/v1/realtime", compat_routes.realtime_endpoint),  # OpenAI realtime
        Route("/v1/meetings/{meeting_id}/transcript", rest.transcript, methods=["GET"]),
        Route("/v1/transcriptions", uploads.create_transcription, methods=["POST"]),
        Route("/v1/transcriptions/{job_id}", uploads.get_transcription, methods=["GET"]),
        Route("/v1/transcriptions/{job_id}", uploads.delete_transcription, methods=["DELETE"]),
        Route("/v1/meetings/{meeting_id}/tokens", rest.mint_token, methods=["POST"]),
        Route("/v1/speakers", speakers_api.create_speaker, methods=["POST"]),
        Route("/v1/speakers", speakers_api.list_speakers, methods=["GET"]),
        Route("/v1/speakers/{speaker_id}", speakers_api.get_speaker, methods=["GET"]),
        Route("/v1/speakers/{speaker_id}", speakers_api.delete_speaker, methods=["DELETE"]),
        Route("/healthz", rest.healthz, methods=["GET"]),
        Route("/readyz", rest.readyz, methods=["GET"]),
        Route("/metrics", rest.metrics, methods=["GET"]),
    ]
    static_dir = browser_client_dir(settings.server.static_dir)
    if static_dir is not None:
        routes.append(Mount("/", StaticFiles(directory=static_dir, html=True), name="static"))
    # The client's address behind trusted proxies, and whether a proxy named it.
    trusted = trusted_proxies(settings.auth.trusted_proxies)
    proxied = [Middleware(ProxyHeaders, trusted)]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=proxied,
        exception_handlers=EXCEPTION_HANDLERS,
    )


# The installed `server` package: its `static/` is the browser client that ships with it
# (package data in the wheel, the folder itself in a checkout or an editable install).
PACKAGE = Path(str(importlib.resources.files("server")))


def browser_client_dir(setting: str) -> Path | None:
    """The folder `PARLEY_STATIC_DIR` names: as given, or, when relative and not found
    under the working directory, inside the installed `server` package (the default,
    `static`, is the page shipped with it, served from any working directory); None, with
    a warning, where neither exists."""
    given = Path(setting)
    candidates = [given] if given.is_absolute() else [given, PACKAGE / given]
    for folder in candidates:
        if folder.is_dir():
            return folder
    logger.warning(
        "the browser client's folder %s is missing (PARLEY_STATIC_DIR): / serves no page",
        " or ".join(str(c) for c in candidates),
    )
    return None
