"""Who is calling, and which meetings they may touch.

Authentication is off while no API key is configured (a developer's localhost): every
caller is `ANONYMOUS` and every meeting is open to it, and protected mode (server/auth/access.py)
keeps every caller but loopback ones out. It is on as soon as one key is
configured (`PARLEY_API_KEYS`, `PARLEY_API_KEYS_FILE`):

- bots send `Authorization: Bearer <api key>`;
- browsers, which cannot set headers on a WebSocket, use a meeting token: minted by an
  authenticated `POST /v1/meetings/{id}/tokens`, good for one connection to that meeting
  (single use, expiring), and passed as the subprotocol `parley.token.<token>`, the query
  parameter `access_token`, or the first message `{"type": "auth", "token": ...}`.

Each key belongs to a tenant. A meeting belongs to the tenant whose stream created it
(the store's meeting config keeps it, first writer wins); a tenant may create, join,
listen to, resume and read only its own meetings. Keys are held as SHA-256 digests and
compared in constant time; tokens are stored as digests too.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from server.auth.access import Access, admit
from server.auth.tokens import TokenGrant, TokenStore
from store.api import Store
from store.errors import StoreError
from store.records import SourceState
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

TOKEN_PREFIX = "pmt_"  # meeting tokens; anything else presented as a bearer is an API key
SUBPROTOCOL = "parley.v1"  # what the server selects when a browser offers subprotocols
TOKEN_SUBPROTOCOL = "parley.token."  # + token
OWNER_FIELD = "owner"  # key of the owning tenant in the meeting's stored config
OWNER_RECHECK_S = 30.0  # how long a listener's confirmation of the owner holds
MIN_KEY_LENGTH = 16
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: "$" takes a "\n"


class Scope(enum.StrEnum):
    """What a meeting token may open (a token without a scope opens any of them once)."""

    STREAM = "stream"
    EVENTS = "events"
    TRANSCRIPT = "transcript"


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str | None  # None: authentication is off
    fast_replay: bool  # may stream faster than PARLEY_REALTIME_FACTOR
    via_token: bool = False
    participant: str | None = None  # a meeting token bound to one participant


ANONYMOUS = Principal(tenant=None, fast_replay=True)


def unauthorized(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.UNAUTHORIZED, CloseCode.UNAUTHORIZED, message)


def forbidden(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.FORBIDDEN, CloseCode.FORBIDDEN, message)


# ---------------------------------------------------------------- API keys


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse_api_keys(inline: str | None, path: str | None) -> dict[bytes, str]:
    """`tenant:key` pairs (comma separated inline; one per line in the file, where `#`
    starts a comment) as {sha256(key): tenant}. A ValueError names the bad entry, never
    the key."""
    entries: list[tuple[str, str]] = []
    if inline:
        entries += [("PARLEY_API_KEYS", item) for item in inline.split(",")]
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"PARLEY_API_KEYS_FILE={path!r}: {exc.strerror or exc}") from None
        entries += [
            (f"PARLEY_API_KEYS_FILE {path}:{n}", line.split("#", 1)[0])
            for n, line in enumerate(lines, 1)
        ]
    keys: dict[bytes, str] = {}
    for where, item in entries:
        if not item.strip():
            continue
        tenant, sep, key = (part.strip() for part in item.partition(":"))
        if not sep or not _TENANT.fullmatch(tenant):
            raise ValueError(f"{where}: expected tenant:key, the tenant of letters, digits, _.-")
        if len(key) < MIN_KEY_LENGTH:
            raise ValueError(f"{where}: the key of {tenant!r} is under {MIN_KEY_LENGTH} chars")
        digest = _digest(key)
        if keys.setdefault(digest, tenant) != tenant:
            raise ValueError(f"{where}: one key is given to two tenants")
    return keys


def bearer(header: str | None) -> str | None:
    """The credential of an `Authorization: Bearer ...` header, None if absent or another
    scheme."""
    if not header:
        return None
    scheme, _, credential = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return None
    return credential.strip()


# ---------------------------------------------------------------- origins


@dataclass(frozen=True, slots=True)
class OriginPolicy:
    """Which browser pages may open WebSockets. A request without `Origin` (a bot)
    passes; listed origins pass (`*`: any); the server's own origin (its page in
    server/static/) passes.

    With nothing listed and authentication off (a developer's machine), `local_only`:
    pages served from a loopback host (`localhost`, 127.0.0.0/8, `[::1]`) pass too, and
    the server's own origin passes only when it is an IP address or `localhost` — a
    page on the web cannot open sockets to the developer's server, not even through
    DNS rebinding (a name of the attacker's that resolves to 127.0.0.1)."""

    allow_any: bool
    allowed: frozenset[str]
    local_only: bool = False

    @classmethod
    def from_setting(cls, raw: str | None, *, auth_enabled: bool) -> OriginPolicy:
        if raw is None:
            return cls(allow_any=False, allowed=frozenset(), local_only=not auth_enabled)
        items = {o.strip().rstrip("/").lower() for o in raw.split(",") if o.strip()}
        return cls(allow_any="*" in items, allowed=frozenset(items - {"*"}))

    def allows(self, origin: str | None, host: str | None) -> bool:
        if origin is None or self.allow_any:
            return True
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed:
            return True
        page = urlsplit(origin)
        if self.local_only and _is_loopback(page.hostname):
            return True
        same = bool(page.netloc) and host is not None and page.netloc == host.strip().lower()
        if same and self.local_only:  # a name could be the attacker's, rebound to us
            return _is_address(page.hostname)
        return same


def _is_loopback(hostname: str | None) -> bool:
    if hostname == "localhost" or (hostname or "").endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(hostname or "").is_loopback
    except ValueError:
        return False


def _is_address(hostname: str | None) -> bool:
    try:
        ipaddress.ip_address(hostname or "")
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- the authenticator


class Authenticator:
    """Resolves credentials to principals and mints meeting tokens."""

    def __init__(
        self,
        keys: Mapping[bytes, str],
        tokens: TokenStore,
        *,
        origins: OriginPolicy,
        fast_replay_tenants: str = "",
        token_ttl_s: float = 60.0,
        protected_mode: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = list(keys.items())
        self.access = Access.of(keys=bool(self._keys), protected_mode=protected_mode)
        self._tokens = tokens
        self.origins = origins
        fast = {t.strip() for t in fast_replay_tenants.split(",") if t.strip()}
        self._fast_all = "*" in fast
        self._fast = frozenset(fast)
        self.token_ttl_s = token_ttl_s
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def admit(self, client_host: str | None) -> None:
        """Before any credential: raise ProtocolError 4403 `protected_mode` if this server
        serves no meeting to this client (server/auth/access.py)."""
        admit(self.access, client_host)

    def key_tenant(self, key: str) -> str | None:
        """The tenant of an API key, None if no key matches. Compares every digest."""
        digest = _digest(key)
        found: str | None = None
        for candidate, tenant in self._keys:
            if hmac.compare_digest(candidate, digest):
                found = tenant
        return found

    def _principal(self, tenant: str, **extra: Any) -> Principal:
        return Principal(tenant, self._fast_all or tenant in self._fast, **extra)

    def key_principal(self, key: str | None) -> Principal:
        """An API key's principal (the ANONYMOUS one while authentication is off)."""
        if not self.enabled:
            return ANONYMOUS
        if key is None:
            raise unauthorized("authentication required: Authorization: Bearer <api key>")
        if key.startswith(TOKEN_PREFIX):
            raise unauthorized("this call needs an API key, not a meeting token")
        tenant = self.key_tenant(key)
        if tenant is None:
            raise unauthorized("unknown API key")
        return self._principal(tenant)

    async def presented(
        self, authorization: str | None, url_token: str | None, meeting_id: str, scope: Scope
    ) -> Principal | None:
        """The principal of the credentials a request brings: the Authorization header
        (which must be `Bearer`: an API key or a meeting token), else a meeting token from
        its URL (`access_token`, the token subprotocol). None when it brings neither.
        Raises ProtocolError as `resolve` does."""
        if not self.enabled:
            return ANONYMOUS
        if authorization is not None:
            credential = bearer(authorization)
            if credential is None:
                raise unauthorized("the Authorization header must be: Bearer <credential>")
            return await self.resolve(credential, meeting_id, scope, keys_allowed=True)
        if url_token is not None:
            return await self.resolve(url_token, meeting_id, scope, keys_allowed=False)
        return None

    async def resolve(
        self, credential: str, meeting_id: str, scope: Scope, *, keys_allowed: bool
    ) -> Principal:
        """The principal a credential stands for on `meeting_id`. A meeting token is spent
        by this call, whether it fits or not. Raises ProtocolError 4401/4403 (or 1013
        when the token store cannot be reached)."""
        if not self.enabled:
            return ANONYMOUS
        if not credential.startswith(TOKEN_PREFIX):
            if not keys_allowed:
                raise unauthorized(
                    "API keys go in the Authorization header, never in a URL or subprotocol"
                )
            return self.key_principal(credential)
        try:
            grant = await self._tokens.take(_digest(credential).hex())
        except StoreError as exc:
            raise ProtocolError(
                ErrorCode.OVERLOADED, CloseCode.TRY_AGAIN_LATER, f"token store: {exc}"
            ) from None
        if grant is None or not grant.tenant or grant.expires_at <= self._clock():
            raise unauthorized("unknown, used or expired meeting token")
        if grant.meeting_id != meeting_id:
            raise forbidden("the meeting token is for another meeting")
        if grant.scope is not None and grant.scope != scope.value:
            raise forbidden(f"the meeting token is for {grant.scope}, not {scope.value}")
        return self._principal(grant.tenant, via_token=True, participant=grant.participant)

    async def mint(
        self,
        principal: Principal,
        meeting_id: str,
        *,
        scope: Scope | None = None,
        participant: str | None = None,
        ttl_s: float | None = None,
    ) -> tuple[str, float]:
        """A new single-use token for one connection to `meeting_id`: (token, expires_at)."""
        ttl = self.token_ttl_s if ttl_s is None else min(ttl_s, self.token_ttl_s)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        expires_at = self._clock() + ttl
        grant = TokenGrant(
            tenant=principal.tenant or "",
            meeting_id=meeting_id,
            scope=None if scope is None else scope.value,
            participant=participant,
            expires_at=expires_at,
        )
        await self._tokens.put(_digest(token).hex(), grant, ttl)
        return token, expires_at

    async def close(self) -> None:
        await self._tokens.close()


# ---------------------------------------------------------------- tenancy


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


def build_authenticator(
    *,
    api_keys: str | None,
    api_keys_file: str | None,
    tokens: TokenStore,
    allowed_origins: str | None,
    fast_replay_tenants: str,
    token_ttl_s: float,
    protected_mode: bool = True,
) -> Authenticator:
    keys = parse_api_keys(api_keys, api_keys_file)
    return Authenticator(
        keys,
        tokens,
        origins=OriginPolicy.from_setting(allowed_origins, auth_enabled=bool(keys)),
        fast_replay_tenants=fast_replay_tenants,
        token_ttl_s=token_ttl_s,
        protected_mode=protected_mode,
    )
