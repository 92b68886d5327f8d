"""Which meetings a principal may touch: a meeting belongs to the tenant whose stream
created it (the store's meeting config keeps it, first writer wins); a tenant may create,
join, listen to, resume and read only its own meetings."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from server.auth.keys import Principal, forbidden
from store.api import Store
from store.errors import StoreError
from store.records import SourceState
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

OWNER_FIELD = "owner"  # key of the owning tenant in the meeting's stored config
OWNER_RECHECK_S = 30.0  # how long a listener's confirmation of the owner holds


async def meeting_access(store: Store, meeting_id: str, principal: Principal) -> bool:
    """True if the meeting exists and `principal` may use it, False if it does not exist
    (yet). Raises ProtocolError 4403 if it belongs to another tenant, or to none while
    authentication is on; 1013 if the store cannot be reached."""
    if principal.tenant is None:
        return True
    try:
        config = await store.meeting_config(meeting_id)
    except StoreError as exc:
        raise ProtocolError(
            ErrorCode.OVERLOADED, CloseCode.TRY_AGAIN_LATER, f"meeting store: {exc}"
        ) from None
    if config is None:
        return False
    if config.get(OWNER_FIELD) != principal.tenant:
        raise forbidden(f"meeting {meeting_id!r} belongs to another tenant")
    return True


class OwnerCheck:
    """A listener's proof that the meeting is its tenant's, taken before the first byte
    is sent and again once it is OWNER_RECHECK_S old. A listener may wait on a meeting
    that does not exist yet; if another tenant then creates it, the listener is refused
    before any of its events. (A meeting id is reused only after hours of idleness, when
    the store has expired the meeting.)"""

    def __init__(
        self,
        store: Store,
        meeting_id: str,
        principal: Principal,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._meeting_id = meeting_id
        self._principal = principal
        self._clock = clock
        self._confirmed_at: float | None = None

    async def start(self) -> None:
        """Refuse (4403) a meeting of another tenant; note whether this one exists."""
        if await meeting_access(self._store, self._meeting_id, self._principal):
            self._confirmed_at = self._clock()

    async def confirm(self) -> None:
        """Before sending: raise ProtocolError unless the meeting is (still) the tenant's."""
        if self._principal.tenant is None:
            return
        now = self._clock()
        if self._confirmed_at is not None and now - self._confirmed_at < OWNER_RECHECK_S:
            return
        if not await meeting_access(self._store, self._meeting_id, self._principal):
            raise ProtocolError(
                ErrorCode.NOT_FOUND, CloseCode.NOT_FOUND, "the meeting no longer exists"
            )
        self._confirmed_at = now


def owned_config(config: Mapping[str, Any], principal: Principal) -> dict[str, Any]:
    """The meeting config a new source stores (first writer wins): with its owner."""
    if principal.tenant is None:
        return dict(config)
    return {**config, OWNER_FIELD: principal.tenant}


async def create_owned_source(
    store: Store,
    meeting_id: str,
    participant: str,
    config: Mapping[str, Any],
    principal: Principal,
    *,
    origin: float | None = None,
) -> tuple[SourceState, str]:
    """A new source (state, resume token) of a meeting that is, or becomes, the
    principal's: checked before, and checked again after when the meeting was new, since
    another tenant may have created it in between (first writer wins). `origin`: Unix
    seconds of the source's time 0 (default: now). Raises ProtocolError 4403 (1013 if
    the store cannot be reached) or StoreError."""
    exists = await meeting_access(store, meeting_id, principal)
    source, token = await store.create_source(
        meeting_id, participant, owned_config(config, principal), origin=origin
    )
    if not exists:
        await meeting_access(store, meeting_id, principal)
    return source, token
