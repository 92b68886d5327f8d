"""Enrolled speakers: a tenant's named voices, kept as speaker embeddings (never audio).

`EnrolledSpeaker` is one record; `SpeakerBook` is what the store offers for them (the
Store's `speakers` attribute): add (bounded per tenant, names unique per tenant), list,
get, delete. `MemorySpeakerBook` keeps them in process; the Redis one is in
store/redis/enrolled.py. Enrolled speakers have no TTL: they stay until deleted.

A tenant is a name (server/auth/keys.py) or None while authentication is off; None has its
own book, like any tenant. One tenant never sees another's speakers.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Protocol

from store.errors import StoreError

ANONYMOUS_BOOK = "-"  # the book of tenant None (tenant names start with a letter or digit)


class SpeakerBookFull(StoreError):
    """The tenant holds its maximum number of enrolled speakers."""


class SpeakerNameTaken(StoreError):
    """The tenant already enrolled a speaker of that name."""


@dataclass(frozen=True, slots=True)
class EnrolledSpeaker:
    speaker_id: str
    name: str
    created_at: float  # Unix seconds
    seconds: float  # seconds of speech the embedding was computed from
    embedding: bytes  # float32 little-endian, unit length

    def public(self) -> dict[str, Any]:
        """What the API shows: everything but the embedding."""
        return {
            "speaker_id": self.speaker_id,
            "name": self.name,
            "created_at": self.created_at,
            "seconds": self.seconds,
        }

    def stored(self) -> dict[str, Any]:
        return {**self.public(), "embedding": base64.b64encode(self.embedding).decode()}

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> EnrolledSpeaker:
        return cls(
            speaker_id=str(data["speaker_id"]),
            name=str(data["name"]),
            created_at=float(data["created_at"]),
            seconds=float(data["seconds"]),
            embedding=base64.b64decode(data["embedding"]),
        )


def book_of(tenant: str | None) -> str:
    return ANONYMOUS_BOOK if tenant is None else tenant


class SpeakerBook(Protocol):
    async def add(self, tenant: str | None, speaker: EnrolledSpeaker, limit: int) -> None:
        """Keep `speaker` in the tenant's book. Raises SpeakerBookFull when the book holds
        `limit` speakers, SpeakerNameTaken when one has its name (case-insensitive),
        StoreUnavailable when the store cannot be reached."""
        ...

    async def list(self, tenant: str | None) -> list[EnrolledSpeaker]:
        """The tenant's speakers, oldest first."""
        ...

    async def get(self, tenant: str | None, speaker_id: str) -> EnrolledSpeaker | None: ...

    async def delete(self, tenant: str | None, speaker_id: str) -> bool:
        """Forget one speaker; False if the tenant has none of that id."""
        ...


class MemorySpeakerBook:
    def __init__(self) -> None:
        self._books: dict[str, dict[str, EnrolledSpeaker]] = {}

    async def add(self, tenant: str | None, speaker: EnrolledSpeaker, limit: int) -> None:
        book = self._books.setdefault(book_of(tenant), {})
        if any(s.name.casefold() == speaker.name.casefold() for s in book.values()):
            raise SpeakerNameTaken(speaker.name)
        if len(book) >= limit:
            raise SpeakerBookFull(f"{limit} speakers enrolled already")
        book[speaker.speaker_id] = speaker

    async def list(self, tenant: str | None) -> list[EnrolledSpeaker]:
        book = self._books.get(book_of(tenant), {})
        return sorted(book.values(), key=lambda s: (s.created_at, s.speaker_id))

    async def get(self, tenant: str | None, speaker_id: str) -> EnrolledSpeaker | None:
        return self._books.get(book_of(tenant), {}).get(speaker_id)

    async def delete(self, tenant: str | None, speaker_id: str) -> bool:
        return self._books.get(book_of(tenant), {}).pop(speaker_id, None) is not None
