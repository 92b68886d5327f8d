"""Protected mode and the upload sandbox's reach, on the real app (fake engine): with no
API key only loopback clients reach meetings, and a client is remote when a trusted proxy
says so. Here the proxy is the loopback peer itself (trusted by default) naming a remote
client in `X-Forwarded-For`; tests/server/test_protected_netns.py has a real remote host."""

from __future__ import annotations

import asyncio
import http.client
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route, WebSocketRoute

from server.__main__ import uvicorn_config
from server.app import create_app
from server.auth.access import (
    FORWARDED,
    Access,
    ProxyHeaders,
    is_loopback,
    start_line,
    trusted_proxies,
)
from server.settings import Settings
from server.uploads.decode_worker import Refusal
from server.uploads.jobs import JobRegistry
from server.uploads.sandbox import Sandbox
from store.memory_cluster import MemoryJobs
from tests.support.appserver import serve_app
from tests.support.audiofiles import wav_header
from tests.support.corpus import clip
from tests.support.httpclient import multipart, request
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


def jfk_wav() -> bytes:
    pcm = clip("en_jfk").pcm16()
    return wav_header(16_000, len(pcm)) + pcm


def test_the_probe_tries_every_route_of_the_app() -> None:
    """Every route of the app is one the probe tries (a new route must be added there, and
    so decide whether protected mode covers it)."""
    app = create_app(Settings.from_env({}, static_dir="/nonexistent"))
    paths = {r.path for r in app.routes if isinstance(r, Route | WebSocketRoute)}
    assert paths == {
        "/v1/meetings/{meeting_id}/stream",  # stream
        "/v1/meetings/{meeting_id}/events",  # events
        "/v1/listen",  # listen
        "/v2/listen",  # flux
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
    assert len(MEETING_ROUTES) == len(SERVED) == 12 and len(OPEN_ROUTES) == 3


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
    """Through the middleware the app runs (uvicorn's own rewrite is off): a trusted
    proxy's X-Forwarded-For names the client, and the scope says it was forwarded, also
    when a dual-stack socket shows the proxy as ::ffff:127.0.0.1; an untrusted peer's
    header (127.0.0.1, a spoof) changes nothing and forwards nothing."""
    seen: list[tuple[str, bool]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["client"][0], scope[FORWARDED]))

    settings = Settings.from_env({}, trusted_proxies="127.0.0.1, 10.1.0.0/16")
    assert not uvicorn_config(app, settings).proxy_headers  # type: ignore[arg-type]
    served = create_app(settings)
    assert [m.cls for m in served.user_middleware] == [ProxyHeaders]  # type: ignore[comparison-overlap]
    middleware = ProxyHeaders(app, trusted_proxies(settings.auth.trusted_proxies))
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
        await middleware(scope, None, None)  # type: ignore[arg-type]
    assert seen == [
        ("10.9.8.7", True),
        ("10.9.8.7", True),
        ("10.9.8.7", True),
        ("10.2.0.1", False),
        ("::ffff:10.2.0.1", False),
    ]
    assert not is_loopback(seen[-1][0])


async def test_a_forwarded_address_is_never_loopback() -> None:
    """A trusted proxy (here the loopback peer itself) that names 127.0.0.1 in
    X-Forwarded-For does not make its client loopback: every meeting route refuses it 403
    / 4403 protected_mode, where the same peer without the header is served."""
    async with serve_app() as app:
        forwarded = await probe(app.http_url, {"X-Forwarded-For": "127.0.0.1"})
        assert not mismatches(forwarded, refused_everywhere())
        assert not mismatches(await probe(app.http_url, {}), served_everywhere())


def _get_from(address: str, port: int, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=10, source_address=(address, 0)
    )
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


async def test_a_proxy_anywhere_on_loopback_is_trusted_by_default() -> None:
    """The default trusted proxies are 127.0.0.0/8 and ::1: a same-host proxy on 127.0.0.2
    that forwards a remote client is read (that client is refused 403 protected_mode),
    not taken for the loopback client it would be if its header were ignored."""
    async with serve_app() as app:
        status, body = await asyncio.to_thread(
            _get_from, "127.0.0.2", app.port, "/v1/speakers", REMOTE
        )
        assert status == 403 and b"protected_mode" in body, body
        status, body = await asyncio.to_thread(_get_from, "127.0.0.2", app.port, "/v1/speakers", {})
        assert status == 200, body
    assert Settings().auth.trusted_proxies == "127.0.0.0/8,::1"


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


async def test_enrollment_without_a_sandbox_is_decoded_for_loopback_clients_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload's sandbox rule holds for enrollment too: where bubblewrap is missing, a
    remote client's `POST /v1/speakers` is refused 503 sandbox_unavailable before its file
    is decoded (nothing is enrolled), while a loopback client's recording is enrolled."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    content_type, pieces = multipart(jfk_wav(), "voice.wav", name="Jack")
    headers = {"Content-Type": content_type}
    async with serve_app(protected_mode=False) as app:
        url = f"{app.http_url}/v1/speakers"
        remote = await request("POST", url, body=pieces, headers={**headers, **REMOTE})
        assert remote.status == 503, remote.body
        assert remote.json()["error"]["code"] == "sandbox_unavailable"
        assert "PARLEY_UPLOAD_SANDBOX=off" in remote.json()["error"]["message"]
        assert (await request("GET", url)).json() == {"speakers": []}
        local = await request("POST", url, body=pieces, headers=headers)
        assert local.status == 201, local.body


async def test_every_decode_goes_through_the_sandbox_rule(tmp_path: Path) -> None:
    """The registry's decodes refuse a remote caller's file where the sandbox is missing,
    whichever route calls them (the rule is the decoder's, not only the routes')."""
    registry = JobRegistry(
        Settings.from_env({}).uploads, MemoryJobs("n1"), sandbox=Sandbox(missing="no bwrap")
    )
    src = tmp_path / "voice.wav"
    src.write_bytes(jfk_wav())
    with pytest.raises(Refusal) as refused:
        await registry.decode_other(src, tmp_path / "out.s16", 30.0, remote=True)
    assert (refused.value.status, refused.value.code) == (503, "sandbox_unavailable")
    decoded = await registry.decode_other(src, tmp_path / "out.s16", 30.0, remote=False)
    assert decoded.seconds > 5
