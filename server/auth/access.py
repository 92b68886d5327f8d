"""Who may reach meetings at all: the server's access mode, judged by the client's address.

Three modes, one per server:

- `keys`: API keys are configured; every caller authenticates (server/auth/keys.py), from
  anywhere.
- `protected` (the default while no key is configured): only loopback clients
  (127.0.0.0/8, ::1) reach meetings: streams, listeners, transcripts, uploads, tokens, the
  compat sockets. Anyone else is refused with 403 / close 4403 `protected_mode`, and told
  the two ways past it. Like Redis's protected mode: a developer's `make run` works with no
  setting, and a server bound to a network by mistake serves nobody's meeting to it.
- `anonymous`: no key, and `PARLEY_PROTECTED_MODE=off`: anyone who reaches the port, on
  purpose.

`/healthz`, `/readyz` and `/metrics` (counts only: no meeting, no tenant) stay open in
every mode: balancers and scrapers probe them from other hosts.

`admit` is the one rule every meeting route, HTTP and socket, applies before any
credential: the client's address (protected mode), the `Host` it names (protected mode:
a loopback name or PARLEY_ALLOWED_HOSTS, against DNS rebinding) and, on sockets and
state-changing requests, its page's `Origin` (`OriginPolicy`, in every mode). A web
page on the developer's machine is a loopback client: the last two keep it out.

The client's address is the socket peer's, or, when that peer is a trusted proxy
(`PARLEY_TRUSTED_PROXIES`), the one its `X-Forwarded-For` names: `ProxyHeaders`, the
app's outermost middleware, rewrites the ASGI scope's `client` (uvicorn's proxy-headers
handling) and ignores the header from anyone else. A forwarded address is never loopback
(`is_local`): a proxy inside the trusted ranges may write any address, 127.0.0.1 too, as
Redis's protected mode never takes a forwarded identity for a local one. A proxy on this
host therefore makes its clients remote, which they are.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

PROTECTED_MESSAGE = (
    "protected mode: this server has no API key configured, so it serves loopback clients "
    "only. Configure API keys (PARLEY_API_KEYS_FILE), or set PARLEY_PROTECTED_MODE=off to "
    "serve anyone anonymously"
)


HOST_MESSAGE = (
    "protected mode: this server answers requests for its loopback names only (localhost, "
    "127.0.0.1, [::1]), not this Host; add the name to PARLEY_ALLOWED_HOSTS if it is this "
    "server's"
)
ORIGIN_MESSAGE = (
    "this page's Origin may not use this server (open its sockets, send it uploads): list "
    "it in PARLEY_ALLOWED_ORIGINS"
)


class Access(enum.StrEnum):
    KEYS = "keys"  # API keys configured: every caller authenticates
    PROTECTED = "protected"  # no key: loopback clients only
    ANONYMOUS = "anonymous"  # no key, PARLEY_PROTECTED_MODE=off: anyone, on purpose

    @classmethod
    def of(cls, *, keys: bool, protected_mode: bool) -> Access:
        if keys:
            return cls.KEYS
        return cls.PROTECTED if protected_mode else cls.ANONYMOUS


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (a dual-stack socket's view of
    127.0.0.1). Anything else, a name or no address included, is not."""
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def trusted_proxies(raw: str) -> list[str]:
    """PARLEY_TRUSTED_PROXIES as uvicorn's `trusted_hosts`: each address or network,
    and for an IPv4 one its IPv4-mapped IPv6 form too. A server bound to `::` sees an IPv4
    peer as ::ffff:a.b.c.d, which uvicorn would not match to a.b.c.d: a proxy on 127.0.0.1
    would then go untrusted, and every client it forwards would look like loopback."""
    found: list[str] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        network = ipaddress.ip_network(item, strict=False)
        found.append(str(network))
        if isinstance(network, ipaddress.IPv4Network):
            mapped = ipaddress.IPv6Address(f"::ffff:{network.network_address}")
            found.append(f"{mapped}/{96 + network.prefixlen}")
    return found


FORWARDED = "parley.forwarded"  # ASGI scope key: True when `client` is a proxy's word


class ProxyHeaders:
    """The client's address behind trusted proxies: uvicorn's proxy-headers middleware
    (a trusted peer's `X-Forwarded-For` names the client; from any other peer it is
    ignored), and in the scope under FORWARDED whether the request came through a trusted
    proxy that named a client, so `is_local` can tell the socket's own peer from a
    forwarded address. ASGI middleware: the app's outermost (server/app.py)."""

    def __init__(self, app: ASGIApp, trusted: Sequence[str]) -> None:
        self._proxied = ProxyHeadersMiddleware(app, trusted_hosts=list(trusted))  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            peer = scope.get("client")
            scope[FORWARDED] = (
                peer is not None
                and peer[0] in self._proxied.trusted_hosts
                and any(name == b"x-forwarded-for" for name, _ in scope["headers"])
            )
        await self._proxied(scope, receive, send)  # type: ignore[arg-type]


def client_host(connection: HTTPConnection) -> str | None:
    """The client's address as the app sees it (after a trusted proxy's X-Forwarded-For)."""
    return connection.client.host if connection.client is not None else None


def is_local(connection: HTTPConnection) -> bool:
    """Whether the connection's client is loopback: the socket's peer is, and no proxy
    named it (a forwarded address never is). What protected mode and the decoder's sandbox
    rule (server/uploads/sandbox.py `Sandbox.admit`) trust."""
    return is_loopback(client_host(connection)) and not connection.scope.get(FORWARDED, False)


def protected_refusal() -> ProtocolError:
    return ProtocolError(ErrorCode.PROTECTED_MODE, CloseCode.FORBIDDEN, PROTECTED_MESSAGE)


@dataclass(frozen=True, slots=True)
class OriginPolicy:
    """Which browser pages may use the server, and by which names it may be reached.

    `allows`: a request without `Origin` (a bot) passes; listed origins pass (`*`: any);
    the server's own origin (its page in server/static/) passes. With nothing listed and
    authentication off (a developer's machine), `local_only`: pages served from a
    loopback host (`localhost`, 127.0.0.0/8, `[::1]`) pass too, and the server's own
    origin passes only by an IP address, a loopback name or an allowed host name — a page
    on the web cannot use the developer's server, not even through DNS rebinding (a name
    of the attacker's that resolves to 127.0.0.1).

    `allows_host`: the `Host` a request names is loopback (`localhost`, `*.localhost`,
    127.0.0.0/8, `[::1]`) or listed in `hosts` (`*`: any); protected mode refuses any
    other, as Jupyter does while it serves locally: a rebound name reads nothing."""

    allow_any: bool
    allowed: frozenset[str]
    local_only: bool = False
    hosts: frozenset[str] = frozenset()  # PARLEY_ALLOWED_HOSTS, lower case

    @classmethod
    def from_setting(cls, raw: str | None, *, auth_enabled: bool, hosts: str = "") -> OriginPolicy:
        names = frozenset(h.strip().rstrip(".").lower() for h in hosts.split(",") if h.strip())
        if raw is None:
            return cls(False, frozenset(), local_only=not auth_enabled, hosts=names)
        items = {o.strip().rstrip("/").lower() for o in raw.split(",") if o.strip()}
        return cls(allow_any="*" in items, allowed=frozenset(items - {"*"}), hosts=names)

    def allows(self, origin: str | None, host: str | None) -> bool:
        if origin is None or self.allow_any:
            return True
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed:
            return True
        page = urlsplit(origin)
        if self.local_only and _loopback_name(page.hostname):
            return True
        same = bool(page.netloc) and host is not None and page.netloc == host.strip().lower()
        if same and self.local_only:  # a name could be the attacker's, rebound to us
            return _is_address(page.hostname) or page.hostname in self.hosts
        return same

    def allows_host(self, host: str | None) -> bool:
        if host is None or "*" in self.hosts:  # no Host: no browser sent it
            return True
        try:
            name = urlsplit(f"//{host.strip()}").hostname
        except ValueError:
            return False
        name = (name or "").rstrip(".")
        return _loopback_name(name) or name in self.hosts


def _loopback_name(hostname: str | None) -> bool:
    if hostname == "localhost" or (hostname or "").endswith(".localhost"):
        return True
    return is_loopback(hostname)


def _is_address(hostname: str | None) -> bool:
    try:
        ipaddress.ip_address(hostname or "")
    except ValueError:
        return False
    return True


def _state_changing(connection: HTTPConnection) -> bool:
    """A socket (browsers open them from any page) or an HTTP request that may change
    something: what a page's `Origin` is checked on. GET and HEAD read, and a page of
    another origin cannot read their answers."""
    if connection.scope["type"] == "websocket":
        return True
    return str(connection.scope.get("method", "GET")) not in ("GET", "HEAD", "OPTIONS")


def admit(access: Access, origins: OriginPolicy, connection: HTTPConnection) -> None:
    """The one rule for a request to a meeting route, HTTP or socket, before any
    credential. Raises ProtocolError (403 / close 4403):

    - `protected_mode`: protected mode, and the client is not local (`is_local`);
    - `host_not_allowed`: protected mode, and the `Host` is no loopback name or address
      and not in PARLEY_ALLOWED_HOSTS (DNS rebinding: an attacker's name resolved to us);
    - `forbidden`: a socket, or a state-changing request (POST, DELETE, ...), from a
      browser page whose `Origin` the policy does not allow (PARLEY_ALLOWED_ORIGINS)."""
    headers = connection.headers
    if access is Access.PROTECTED:
        if not is_local(connection):
            raise protected_refusal()
        if not origins.allows_host(headers.get("host")):
            raise ProtocolError(ErrorCode.HOST_NOT_ALLOWED, CloseCode.FORBIDDEN, HOST_MESSAGE)
    if _state_changing(connection) and not origins.allows(
        headers.get("origin"), headers.get("host")
    ):
        raise ProtocolError(ErrorCode.FORBIDDEN, CloseCode.FORBIDDEN, ORIGIN_MESSAGE)


def bound_to_loopback(host: str) -> bool:
    return host == "localhost" or is_loopback(host)


def start_line(access: Access, host: str, port: int) -> tuple[int, str]:
    """(log level, message): the one line that says, at start, who this server serves."""
    where = f"{host}:{port}"
    if access is Access.KEYS:
        return logging.INFO, f"access: keys: every caller on {where} authenticates with a key"
    if bound_to_loopback(host):
        return logging.INFO, (
            f"access: {access.value}: no API keys (development mode), listening on "
            f"loopback only ({where})"
        )
    if access is Access.PROTECTED:
        return logging.WARNING, (
            f"access: protected: listening on {where} with no API key configured: only "
            "loopback clients reach meetings, others get 403/4403 protected_mode (configure "
            "PARLEY_API_KEYS_FILE, or set PARLEY_PROTECTED_MODE=off to serve anyone)"
        )
    return logging.WARNING, (
        f"access: anonymous: listening on {where} with no API key and "
        "PARLEY_PROTECTED_MODE=off: anyone who reaches this port may stream, listen to and "
        "read every meeting"
    )
