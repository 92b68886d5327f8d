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

The client's address is the socket peer's, or, when that peer is a trusted proxy
(`PARLEY_TRUSTED_PROXIES`), the one its `X-Forwarded-For` names: uvicorn's proxy-headers
middleware (server/__main__.py configures it) rewrites the ASGI scope's `client` before
the app sees it, and ignores the header from anyone else.
"""

from __future__ import annotations

import enum
import ipaddress
import logging

from starlette.requests import HTTPConnection

from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

PROTECTED_MESSAGE = (
    "protected mode: this server has no API key configured, so it serves loopback clients "
    "only. Configure API keys (PARLEY_API_KEYS_FILE), or set PARLEY_PROTECTED_MODE=off to "
    "serve anyone anonymously"
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
    """PARLEY_TRUSTED_PROXIES as uvicorn's `forwarded_allow_ips`: each address or network,
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


def client_host(connection: HTTPConnection) -> str | None:
    """The client's address as the app sees it (after a trusted proxy's X-Forwarded-For)."""
    return connection.client.host if connection.client is not None else None


def protected_refusal() -> ProtocolError:
    return ProtocolError(ErrorCode.PROTECTED_MODE, CloseCode.FORBIDDEN, PROTECTED_MESSAGE)


def admit(access: Access, client_host: str | None) -> None:
    """Raise ProtocolError 4403 `protected_mode` if `access` keeps this client out."""
    if access is Access.PROTECTED and not is_loopback(client_host):
        raise protected_refusal()


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
