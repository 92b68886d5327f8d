"""Upload jobs: one Job per uploaded file, one asyncio task per job, one registry.

A job is admitted when its upload starts (`RECEIVING`: the POST handler streams the
file to the job's own temp folder and decodes it there); an upload that is refused is
discarded with its folder. An accepted job waits (`QUEUED`) for one of
`upload_concurrency` runner slots, transcribes (`RUNNING`), and ends `DONE`, `FAILED`
or `CANCELLED`. Its temp folder (the decoded audio) is removed as soon as it ends,
whatever the reason; only the transcript stays in memory.

Bounds: at most `upload_max_jobs` unfinished jobs (more uploads get 503), and as many
finished ones, each kept `upload_job_ttl_s` (the oldest finished job goes first when
more finish). Nothing else about uploads lives on the app: the registry holds the jobs,
each job holds its own state.

Other nodes see the jobs through the store (`Job.record()`, written on every change and
every `job_sync_s` while unfinished, kept `upload_job_ttl_s`; server/uploads/records.py reads
it back). A cancel asked on another node reaches this one at its next write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from engine.api import SchedulerError
from server.settings import UploadSettings
from server.uploads.decode import DecodedAudio, DecodeLimits, decode_file
from server.uploads.sandbox import UNCONFINED, Sandbox
from session.enrolled import load_voices
from session.file_transcriber import FileOptions, FileProgress, FileTranscriber
from session.services import SessionServices
from session.vad import VadScorer
from store.api import JobStore
from store.errors import StoreError
from store.records import SourceState
from wire.transcript import TranscriptFormat, render, utterances

logger = logging.getLogger(__name__)


class JobStatus(enum.Enum):
    RECEIVING = "receiving"  # inside the POST: upload and decode (never seen by clients)
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED}


_TRANSITIONS = {
    JobStatus.RECEIVING: {JobStatus.QUEUED, JobStatus.CANCELLED},
    JobStatus.QUEUED: {JobStatus.RUNNING, JobStatus.CANCELLED},
    JobStatus.RUNNING: {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED},
    JobStatus.DONE: set(),
    JobStatus.FAILED: set(),
    JobStatus.CANCELLED: set(),
}


class JobsFull(Exception):
    """No room for another unfinished job, or the registry is closed."""


@dataclass(frozen=True, slots=True)
class JobOptions:
    language: str | None  # None: detect (multilingual models)
    participant: str
    labelled: bool  # the client named the participant: label TXT/SRT/VTT lines with it
    meeting_id: str | None
    format: TranscriptFormat  # of the result when the POST answers with it (`wait=true`)
    diarize: bool = False  # label each utterance's speaker (a recording of several voices)
    # Unix seconds the recording started at, as the client gave it (`started_at`): the
    # meeting source's origin. None: the upload's start is.
    started_at: float | None = None
    keyterms: tuple[str, ...] = ()  # words to expect (`wire.keyterms`)

    def as_dict(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "language": self.language or "auto",
            "participant": self.participant,
            "meeting_id": self.meeting_id,
            "format": self.format.value,
        }
        if self.diarize:
            options["diarize"] = True
        if self.started_at is not None:
            options["started_at"] = self.started_at
        if self.keyterms:
            options["keyterms"] = list(self.keyterms)
        return options


@dataclass(eq=False)
class Job:
    id: str
    options: JobOptions
    workdir: Path
    created_at: float = field(default_factory=time.time)  # wall clock, for clients
    status: JobStatus = JobStatus.RECEIVING
    filename: str = ""
    upload_bytes: int = 0
    audio: DecodedAudio | None = None
    progress: FileProgress | None = None
    meeting_source: SourceState | None = None
    tenant: str | None = None  # the API key's tenant that owns the job (auth on)
    error: dict[str, str] | None = None
    started_at: float | None = None  # monotonic, when transcription began
    finished_at: float | None = None  # monotonic
    queued_at: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    finished: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def location(self) -> str:
        return f"/v1/transcriptions/{self.id}"

    def transition(self, new: JobStatus) -> None:
        if new not in _TRANSITIONS[self.status]:
            raise RuntimeError(
                f"job {self.id}: illegal transition {self.status.value} → {new.value}"
            )
        self.status = new
        if new.finished:
            self.finished_at = time.monotonic()
            self.finished.set()

    def describe(self) -> dict[str, Any]:
        """The job resource as `GET /v1/transcriptions/{id}` returns it."""
        body: dict[str, Any] = {
            "id": self.id,
            "status": self.status.value,
            "created_at": _iso(self.created_at),
            "options": self.options.as_dict(),
            "file": {"name": self.filename, "bytes": self.upload_bytes},
        }
        if self.audio is not None:
            body["file"].update(
                format=self.audio.format,
                codec=self.audio.codec,
                sample_rate=self.audio.source_rate,
                channels=self.audio.channels,
            )
            body["duration"] = round(self.audio.seconds, 3)
        if self.progress is not None:
            total = self.progress.total_seconds
            done = self.progress.processed_seconds
            body["progress"] = {
                "processed_seconds": done,
                "total_seconds": total,
                "fraction": round(done / total, 4) if total else 1.0,
            }
        body["timing"] = self._timing()
        if self.error is not None:
            body["error"] = self.error
        if self.status is JobStatus.DONE and self.progress is not None:
            finals = self.progress.finals
            body["result"] = {
                "text": " ".join(f.text for f in finals),
                "language": finals[0].language if finals else self.options.language,
                "utterances": utterances(finals),
            }
        return body

    def record(self) -> bytes:
        """What the store keeps of the job now, for other nodes (server/uploads/records.py)."""
        record: dict[str, Any] = {
            "job": self.describe(),
            "tenant": self.tenant,
            "labelled": self.options.labelled,
        }
        if self.status is JobStatus.DONE and self.progress is not None:
            record["finals"] = [f.as_dict() for f in self.progress.finals]
        return orjson.dumps(record)

    def render(self, fmt: TranscriptFormat) -> str:
        """The finished transcript as JSON (the job resource), TXT, SRT or VTT."""
        if fmt is TranscriptFormat.JSON or self.progress is None:
            return orjson.dumps(self.describe()).decode()
        return render(self.id, self.progress.finals, fmt, labels=self.options.labelled)

    def _timing(self) -> dict[str, float]:
        timing: dict[str, float] = {}
        if self.audio is not None:
            timing["decode_s"] = round(self.audio.decode_seconds, 3)
        if self.queued_at is not None and self.started_at is not None:
            timing["queued_s"] = round(self.started_at - self.queued_at, 3)
        if self.started_at is not None:
            end = self.finished_at or time.monotonic()
            timing["transcribe_s"] = round(end - self.started_at, 3)
            if self.status is JobStatus.DONE and self.audio is not None and end > self.started_at:
                timing["realtime_factor"] = round(self.audio.seconds / (end - self.started_at), 2)
        return timing


class JobRegistry:
    """Every upload job of this process, bounded; the only server-wide view of them."""

    def __init__(
        self,
        settings: UploadSettings,
        records: JobStore,
        live_streams: Callable[[], int] = lambda: 0,
        sandbox: Sandbox = UNCONFINED,
    ) -> None:
        """`records`: where other nodes read the jobs (the store's). `live_streams()`
        counts the open live streams: while there are any, a job keeps only
        `upload_in_flight_live` requests in the scheduler. `sandbox` confines the
        decoder subprocesses."""
        self._settings = settings
        self._records = records
        self._sync: asyncio.Task[None] | None = None
        self.sandbox = sandbox
        self._live_streams = live_streams
        self._jobs: dict[str, Job] = {}
        self._decoders = asyncio.Semaphore(settings.upload_decoders)
        self._runners = asyncio.Semaphore(settings.upload_concurrency)
        self._closed = False
        self._root = Path(settings.upload_dir or tempfile.gettempdir())
        self.limits = DecodeLimits(
            max_seconds=settings.max_upload_seconds,
            cpu_seconds=settings.upload_decode_cpu_s,
            memory_bytes=settings.upload_decode_memory_mb << 20,
            wall_seconds=settings.upload_decode_timeout_s,
        )

    def __len__(self) -> int:
        return len(self._jobs)

    def unfinished(self) -> int:
        return sum(not j.status.finished for j in self._jobs.values())

    def admit(self, options: JobOptions) -> Job:
        """Reserve room for a new upload and its temp folder, or raise JobsFull.

        `options` come from the query string; the POST handler replaces them once the
        form fields that travel with the file have arrived."""
        if self._closed:
            raise JobsFull("the server is shutting down")
        self._expire()
        if self.unfinished() >= self._settings.upload_max_jobs:
            raise JobsFull(
                f"{self._settings.upload_max_jobs} upload jobs are already in progress; retry later"
            )
        self._root.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="parley-upload-", dir=self._root))
        job = Job(id=secrets.token_hex(8), options=options, workdir=workdir)
        self._jobs[job.id] = job
        return job

    def get(self, job_id: str) -> Job | None:
        self._expire()
        job = self._jobs.get(job_id)
        return None if job is None or job.status is JobStatus.RECEIVING else job

    async def decode(self, job: Job, upload: Path) -> DecodedAudio:
        """Decode the job's upload in a subprocess (bounded in number); drop the upload."""
        async with self._decoders:
            try:
                return await decode_file(
                    upload, job.workdir / "audio.s16", self.limits, self.sandbox
                )
            finally:
                await asyncio.to_thread(upload.unlink, missing_ok=True)

    @property
    def root(self) -> Path:
        """Where upload folders are made."""
        return self._root

    async def decode_other(self, src: Path, dst: Path, max_seconds: float) -> DecodedAudio:
        """Decode a file that is no job's (an enrollment recording) in the sandbox, under
        the same bound on decoders and the same limits but `max_seconds`."""
        async with self._decoders:
            limits = dataclasses.replace(self.limits, max_seconds=max_seconds)
            return await decode_file(src, dst, limits, self.sandbox)

    async def start(
        self,
        job: Job,
        audio: DecodedAudio,
        services: SessionServices,
        vad: VadScorer,
        meeting_source: SourceState | None = None,
    ) -> None:
        """The upload is good audio: queue its transcription as the job's own task.
        `vad` scores its windows; `meeting_source`: the meeting source its finals are
        logged as, if attached. The job's record is in the store when this returns, so
        another node can read it as soon as the client has its id."""
        if self._closed:
            raise JobsFull("the server is shutting down")
        job.meeting_source = meeting_source
        job.audio = audio
        job.progress = FileProgress(total_samples=audio.samples)
        job.queued_at = time.monotonic()
        job.transition(JobStatus.QUEUED)
        await self._publish(job)
        job.task = asyncio.create_task(self._run(job, services, vad), name=f"upload-{job.id}")
        if self._sync is None:
            self._sync = asyncio.create_task(self._sync_forever(), name="upload-jobs-sync")

    async def discard(self, job: Job) -> None:
        """Forget a job that never started (its upload was refused) and remove its files."""
        self._jobs.pop(job.id, None)
        await _remove(job.workdir)

    async def cancel(self, job: Job) -> None:
        """Stop a job (if it still runs), remove its files, and forget it (here and in
        the store)."""
        if job.task is not None and not job.task.done():
            job.task.cancel()
            await asyncio.gather(job.task, return_exceptions=True)
        self._jobs.pop(job.id, None)
        await _remove(job.workdir)
        try:
            await self._records.delete(job.id)
        except StoreError as exc:  # the record expires with its TTL
            logger.warning("upload job %s: could not delete its record: %s", job.id, exc)

    async def close(self) -> None:
        """Shutdown: refuse new jobs, cancel every running one, remove every temp folder."""
        self._closed = True
        tasks = [j.task for j in self._jobs.values() if j.task is not None and not j.task.done()]
        if self._sync is not None:
            tasks.append(self._sync)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for job in list(self._jobs.values()):
            await _remove(job.workdir)

    # ------------------------------------------------------------------ the job's task

    async def _publish(self, job: Job) -> bool:
        """Write the job's record for other nodes; False if one of them asked to cancel it.
        Best effort: while the store is unreachable the job runs on, unseen elsewhere."""
        try:
            return await self._records.put(
                job.id,
                job.record(),
                finished=job.status.finished,
                ttl_s=self._settings.upload_job_ttl_s,
            )
        except StoreError as exc:
            logger.warning("upload job %s: could not write its record: %s", job.id, exc)
            return True

    async def _sync_forever(self) -> None:
        """Every `job_sync_s`: each unfinished job's progress out, cancels in."""
        while True:
            await asyncio.sleep(self._settings.job_sync_s)
            for job in [j for j in self._jobs.values() if j.task is not None]:
                if job.status.finished or await self._publish(job):
                    continue
                logger.info("upload job %s cancelled through another node", job.id)
                await self.cancel(job)

    async def _run(self, job: Job, services: SessionServices, vad: VadScorer) -> None:
        assert job.audio is not None and job.progress is not None
        try:
            async with self._runners:
                job.started_at = time.monotonic()
                job.transition(JobStatus.RUNNING)
                await self._publish(job)
                source = job.meeting_source
                options = FileOptions(
                    source_id=f"upload-{job.id}" if source is None else source.session_id,
                    participant=job.options.participant,
                    language=job.options.language,
                    meeting_source=source,
                    diarize=job.options.diarize,
                    keyterms=job.options.keyterms,
                    enrolled=(
                        await load_voices(services.store, job.tenant, services.speaker_match)
                        if job.options.diarize
                        else None
                    ),
                    in_flight=self._in_flight,
                    model_share=self._model_share,
                )
                transcriber = FileTranscriber(job.audio.path, services, options, job.progress, vad)
                await transcriber.run()
            job.transition(JobStatus.DONE)
            logger.info(
                "upload job done",
                extra={"job_id": job.id, "audio_s": job.audio.seconds, **job.describe()["timing"]},
            )
        except asyncio.CancelledError:
            job.transition(JobStatus.CANCELLED)
            await self._publish(job)
            raise
        except (SchedulerError, StoreError) as exc:
            logger.warning("upload job %s failed: %s: %s", job.id, type(exc).__name__, exc)
            job.error = {"code": "unavailable", "message": f"transcription stopped: {exc}"}
            job.transition(JobStatus.FAILED)
        except Exception:
            logger.exception("upload job %s failed", job.id)
            job.error = {"code": "internal", "message": "internal error; see server log"}
            job.transition(JobStatus.FAILED)
        finally:
            await _remove(job.workdir)
        await self._publish(job)

    def _model_share(self) -> float:
        return self._settings.upload_live_share if self._live_streams() > 0 else 1.0

    def _in_flight(self) -> int:
        if self._live_streams() > 0:
            return self._settings.upload_in_flight_live
        return self._settings.upload_in_flight

    def _expire(self) -> None:
        """Drop finished jobs past their TTL, and the oldest beyond the retention bound."""
        now = time.monotonic()
        finished = [j for j in self._jobs.values() if j.status.finished]
        finished.sort(key=lambda j: j.finished_at or 0.0)
        excess = len(finished) - self._settings.upload_max_jobs
        for i, job in enumerate(finished):
            expired = now - (job.finished_at or now) > self._settings.upload_job_ttl_s
            if i < excess or expired:
                del self._jobs[job.id]


async def _remove(path: Path) -> None:
    await asyncio.to_thread(shutil.rmtree, path, ignore_errors=True)


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
