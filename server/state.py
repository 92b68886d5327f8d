"""The typed state the lifespan creates and every route reads."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from engine.recognizer import Recognizer
from engine.scheduling.scheduler import BatchScheduler
from engine.workers.processes import ProcessRecognizer, WorkerHealth
from server.auth.keys import Authenticator
from server.limits import CapacityMonitor, ListenerQuota, Slots
from server.metrics import Metrics
from server.registry import SessionRegistry
from server.settings import Settings
from server.uploads.jobs import JobRegistry
from session.services import SessionServices
from session.vad import VadScorer
from store.api import Store


class ModelState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


@dataclass
class AppState:
    """Everything the routes share, created by the lifespan."""

    settings: Settings
    store: Store
    registry: SessionRegistry
    metrics: Metrics
    jobs: JobRegistry
    auth: Authenticator
    capacity: CapacityMonitor
    listener_slots: ListenerQuota  # per meeting, per tenant, in all
    waiting_auth: Slots  # sockets waiting for their `auth` message, in all
    model_state: ModelState = ModelState.LOADING
    model_error: str | None = None
    scheduler: BatchScheduler | None = None
    services: SessionServices | None = None
    file_vad: VadScorer | None = None  # uploads' VAD: unbatched, over the same model
    recognizer: Recognizer | None = None
    recognizer_name: str = ""
    loader: asyncio.Task[None] | None = field(default=None, repr=False)

    def worker_health(self) -> WorkerHealth | None:
        """The model worker processes' health (None: the model runs in threads, or is
        not loaded yet)."""
        recognizer = self.recognizer
        return recognizer.health() if isinstance(recognizer, ProcessRecognizer) else None

    def unavailable(self) -> str | None:
        """Why streams and uploads cannot start now (the model is not loaded, or the engine
        died), or None when they can."""
        if self.scheduler is not None and self.scheduler.death is not None:
            return f"{self.scheduler.death}; see /readyz"
        if self.services is None:
            return f"model is {self.model_state.value}; retry when /readyz says ready"
        return None


def app_state(connection: HTTPConnection) -> AppState:
    state: AppState = connection.state.parley
    return state
