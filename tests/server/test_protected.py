"""Protected mode and the upload sandbox's reach, on the real app (fake engine): with no
API key only loopback clients reach meetings, and a client is remote when a trusted proxy
says so. Here the proxy is the loopback peer itself (trusted by default) naming a remote
client in `X-Forwarded-For`; tests/server/test_protected_netns.py has a real remote host."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route, WebSocketRoute

from server.__main__ import uvicorn_config
from server.app import create_app
from server.auth.access import Access, is_loopback, start_line
from server.settings import Settings
from tests.support.appserver import serve_app
from tests.support.route_probe import (
    MEETING_ROUTES,
    OPEN_ROUTES,
    SERVED,
    mismatches,
    probe,
    refused_everywhere,
    served_everywhere,
)

REMOTE = {"X-Forwarded-For": "10.9.8.7"}  # a remote client, as a proxy on loopback names it
KEY = "protected-test-key-0123456789"


def test_the_probe_tries_every_route_of_the_app() -> None:
    """Every route of the app is one the probe tries (a new route must be added there, and
    so decide whether protected mode covers it)."""
    app = create_app(Settings.from_env({}, static_dir="/nonexistent"))
    paths = {r.path for r in app.routes if isinstance(r, Route | WebSocketRoute)}
    assert paths == {
        "/v1/meetings/{meeting_id}/stream",  # stream
        "/v1/meetings/{meeting_id}/events",  # events
        "/v1/listen",  # listen
        "/v1/realtime",  # realtime
        "/v1/meetings/{meeting_id}/transcript",  # transcript
        "/v1/transcriptions",  # upload
        "/v1/transcriptions/{job_id}",  # job, delete_job
        "/v1/meetings/{meeting_id}/tokens",  # token
        "/v1/speakers",  # speakers (and enrolment, POST)
        "/v1/speakers/{speaker_id}",  # speaker (and DELETE)
        "/healthz",
        "/readyz",
        "/metrics",
    }
    assert len(MEETING_ROUTES) == len(SERVED) == 11 and len(OPEN_ROUTES) == 3


def test_loopback_is_127_8_and_1_and_nothing_else() -> None:
    """127.0.0.0/8, ::1 and IPv4-mapped 127.x are loopback; other addresses, names
    (even `localhost`: a client is judged by its address) and no address are not."""
    for local in ("127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(local), local
    for other in ("10.9.8.7", "0.0.0.0", "::", "::ffff:10.0.0.1", "localhost", "", None):
        assert not is_loopback(other), other


def test_start_line_says_which_of_the_three_states() -> None:
    """Bound beyond loopback the line warns in protected and anonymous mode and names
    the ways past protected mode; on loopback it is a quiet note."""
    level, line = start_line(Access.PROTECTED, "0.0.0.0", 8000)
    assert level == logging.WARNING and "access: protected" in line
    assert "PARLEY_API_KEYS_FILE" in line and "PARLEY_PROTECTED_MODE=off" in line
    level, line = start_line(Access.ANONYMOUS, "0.0.0.0", 8000)
    assert level == logging.WARNING and "access: anonymous" in line
    assert start_line(Access.KEYS, "0.0.0.0", 8000)[1].startswith("access: keys")
    assert start_line(Access.PROTECTED, "127.0.0.1", 8000)[0] == logging.INFO
    assert start_line(Access.PROTECTED, "localhost", 8000)[0] == logging.INFO


def test_trusted_proxies_and_sandbox_settings_are_checked() -> None:
    """TRUSTED_PROXIES takes addresses and CIDRs (empty: none) and refuses anything else,
    `*` included; UPLOAD_SANDBOX takes `off` beside `none`; PROTECTED_MODE is a switch."""
    assert Settings.from_env({"PARLEY_TRUSTED_PROXIES": "10.0.0.0/8, ::1"}).auth.trusted_proxies
    assert Settings.from_env({"PARLEY_TRUSTED_PROXIES": ""}).auth.trusted_proxies == ""
    for bad in ("*", "proxy.internal", "10.0.0.0/33"):
        with pytest.raises(ValueError, match="PARLEY_TRUSTED_PROXIES"):
            Settings.from_env({"PARLEY_TRUSTED_PROXIES": bad})
    assert Settings.from_env({"PARLEY_UPLOAD_SANDBOX": "off"}).uploads.upload_sandbox == "off"
    assert Settings.from_env({"PARLEY_PROTECTED_MODE": "off"}).auth.protected_mode is False


async def test_forwarded_for_is_read_from_trusted_proxies_in_either_address_family() -> None:
    """Through the uvicorn configuration the server runs: a trusted proxy's
    X-Forwarded-For names the client, also when a dual-stack socket shows the proxy as
    ::ffff:127.0.0.1; an untrusted peer's header (127.0.0.1, a spoof) changes nothing."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["client"][0])

    settings = Settings.from_env({}, trusted_proxies="127.0.0.1, 10.1.0.0/16")
    config = uvicorn_config(app, settings)  # type: ignore[arg-type]  # a bare ASGI app
    config.load()
    for peer, forwarded in (
        ("127.0.0.1", "10.9.8.7"),
        ("::ffff:127.0.0.1", "10.9.8.7"),
        ("::ffff:10.1.2.3", "10.9.8.7"),
        ("10.2.0.1", "127.0.0.1"),
        ("::ffff:10.2.0.1", "127.0.0.1"),
    ):
        scope = {
            "type": "http",
            "client": (peer, 4321),
            "headers": [(b"x-forwarded-for", forwarded.encode())],
        }
        await config.loaded_app(scope, None, None)
    assert seen == ["10.9.8.7", "10.9.8.7", "10.9.8.7", "10.2.0.1", "::ffff:10.2.0.1"]
    assert not is_loopback(seen[-1])


async def test_protected_mode_refuses_every_meeting_route_to_a_remote_client() -> None:
    """No key: a client a trusted proxy names as remote is refused on every meeting route
    (403, or 4403 after an `error`, code protected_mode); /healthz, /readyz and /metrics
    answer it. The same routes serve the proxy's own loopback requests."""
    async with serve_app() as app:
        remote = await probe(app.http_url, REMOTE)
        assert not mismatches(remote, refused_everywhere())
        for route in MEETING_ROUTES:  # the two ways past it, in every refusal
            said = str(remote[route].message)
            assert "PARLEY_API_KEYS_FILE" in said, (route, remote[route])
            assert "PARLEY_PROTECTED_MODE=off" in said, (route, remote[route])
        assert all(remote[route].status == 200 for route in OPEN_ROUTES), remote
        local = await probe(app.http_url, {})
        assert not mismatches(local, served_everywhere())
        ready = await app.request("GET", "/readyz")
        assert b'"access":"protected"' in ready[2]


async def test_forwarded_for_counts_only_from_trusted_proxies() -> None:
    """With no proxy trusted, the loopback peer's X-Forwarded-For is ignored: it is
    served as the loopback client it is."""
    async with serve_app(trusted_proxies="") as app:
        assert not mismatches(await probe(app.http_url, REMOTE), served_everywhere())


async def test_keys_and_protected_mode_off_serve_remote_clients() -> None:
    """With a key, or with PARLEY_PROTECTED_MODE=off, the remote client is served (the
    meeting routes answer as to the local client), and /readyz says which."""
    bearer = {**REMOTE, "Authorization": f"Bearer {KEY}"}
    async with serve_app(api_keys=f"acme:{KEY}", upload_sandbox="off") as app:
        assert not mismatches(await probe(app.http_url, bearer), served_everywhere())
        assert b'"access":"keys"' in (await app.request("GET", "/readyz"))[2]
    async with serve_app(protected_mode=False, upload_sandbox="off") as app:
        assert not mismatches(await probe(app.http_url, REMOTE), served_everywhere())
        assert b'"access":"anonymous"' in (await app.request("GET", "/readyz"))[2]


async def test_uploads_without_a_sandbox_are_decoded_for_loopback_clients_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where bubblewrap is missing (a PATH without it), `auto` refuses a remote client's
    upload with 503 sandbox_unavailable, saying how to fix it, and still decodes a
    loopback client's; `off` decodes the remote one too."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    async with serve_app(protected_mode=False) as app:
        remote = await probe(app.http_url, REMOTE)
        assert (remote["upload"].status, remote["upload"].code) == (503, "sandbox_unavailable")
        assert "PARLEY_UPLOAD_SANDBOX=off" in str(remote["upload"].message)
        assert (await probe(app.http_url, {}))["upload"].status == 202
        ready = (await app.request("GET", "/readyz"))[2]
        assert b'"upload_sandbox":"missing"' in ready
    async with serve_app(protected_mode=False, upload_sandbox="off") as app:
        assert (await probe(app.http_url, REMOTE))["upload"].status == 202
