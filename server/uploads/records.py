"""Upload jobs as other nodes see them: `StoredJob`, a job read back from the store.

The record (`Job.record()`, server/uploads/jobs.py) is the job resource (`describe()`), its
tenant, whether its text is labelled, and, once done, its finals (to render TXT, SRT
and VTT anywhere). A job whose node died before it finished (its node lease expired,
store/redis/leases.py) reads as failed with the code `node_lost`: the work ran on that
node, and nothing else will finish it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from server.uploads.jobs import JobStatus
from store.api import JobEntry
from store.records import FinalRecord
from wire.transcript import TranscriptFormat, render

NODE_LOST = "node_lost"


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job read from the store: another node runs it (or ran it)."""

    id: str
    body: dict[str, Any]
    tenant: str | None
    labelled: bool
    finals: list[FinalRecord]

    @classmethod
    def from_entry(cls, job_id: str, entry: JobEntry, lease_s: float) -> StoredJob:
        record = orjson.loads(entry.body)
        body: dict[str, Any] = record["job"]
        if not entry.finished and not entry.node_alive:
            body = {
                **body,
                "status": "failed",
                "error": {
                    "code": NODE_LOST,
                    "message": f"node {entry.node} that ran the job stopped (its lease of "
                    f"{lease_s:g} s expired) before the job finished; upload the file again",
                },
            }
        finals = [FinalRecord.from_dict(f) for f in record.get("finals", [])]
        return cls(job_id, body, record.get("tenant"), bool(record.get("labelled")), finals)

    @property
    def status(self) -> JobStatus:
        return JobStatus(self.body["status"])

    def describe(self) -> dict[str, Any]:
        return self.body

    def render(self, fmt: TranscriptFormat) -> str:
        if fmt is TranscriptFormat.JSON:
            return orjson.dumps(self.body).decode()
        return render(self.id, self.finals, fmt, labels=self.labelled)
