"""What a web page can do against a server on the developer's machine (protected mode, no
key): the page's browser is a loopback client, so the address alone lets it in. The one
request rule (server/auth/access.py `admit`) keeps it out of every meeting route: a page of
another origin sends nothing that changes state (its `Origin` is refused, as on the
sockets), and a page reached by DNS rebinding reads nothing (its `Host` is refused)."""

from __future__ import annotations

from typing import Any

import pytest

from server.auth.access import OriginPolicy
from tests.support.appserver import serve_app
from tests.support.audiofiles import wav_header
from tests.support.corpus import clip
from tests.support.httpclient import HttpResponse, multipart, request

ATTACKER_ORIGIN = {"Origin": "http://attacker.example"}
ATTACKER_HOST = {"Host": "attacker.example"}


def jfk_wav() -> bytes:
    pcm = clip("en_jfk").pcm16()
    return wav_header(16_000, len(pcm)) + pcm


def refused(response: HttpResponse, code: str) -> bool:
    return response.status == 403 and response.json()["error"]["code"] == code


async def test_a_page_of_another_origin_or_a_rebound_name_is_refused() -> None:
    """From loopback, with no key: a WAV POSTed to /v1/transcriptions and /v1/speakers
    with `Origin: http://attacker.example` is refused 403 `forbidden`, and so is a DELETE;
    a transcript (and the speaker list) read with `Host: attacker.example` is refused 403
    `host_not_allowed`. The same requests without those headers are served, and the
    server's own page (its own origin) may POST."""
    async with serve_app() as app:
        base = app.http_url

        async def post(path: str, headers: dict[str, str], **fields: str) -> HttpResponse:
            content_type, pieces = multipart(jfk_wav(), "voice.wav", **fields)
            return await request(
                "POST", base + path, body=pieces, headers={"Content-Type": content_type, **headers}
            )

        upload = "/v1/transcriptions?meeting_id=web&wait=true"
        assert refused(await post(upload, ATTACKER_ORIGIN), "forbidden")
        assert refused(await post("/v1/speakers", ATTACKER_ORIGIN, name="Eve"), "forbidden")
        message = (await post(upload, ATTACKER_ORIGIN)).json()["error"]["message"]
        assert "PARLEY_ALLOWED_ORIGINS" in message
        done = await post(upload, {})
        assert done.status == 200, done.body
        own_page = {"Origin": base}
        enrolled = await post("/v1/speakers", own_page, name="Jack")
        assert enrolled.status == 201, enrolled.body

        transcript = f"{base}/v1/meetings/web/transcript?format=txt"
        stolen = await request("GET", transcript, headers=ATTACKER_HOST)
        assert refused(stolen, "host_not_allowed"), stolen.body
        assert "PARLEY_ALLOWED_HOSTS" in stolen.json()["error"]["message"]
        assert refused(
            await request("GET", f"{base}/v1/speakers", headers=ATTACKER_HOST), "host_not_allowed"
        )
        read = await request("GET", transcript)
        assert read.status == 200 and "n=" in read.text, read.body
        for host in ("localhost", "127.0.0.1", f"127.0.0.1:{app.port}", "[::1]:80"):
            assert (await request("GET", transcript, headers={"Host": host})).status == 200

        speaker = enrolled.json()["speaker_id"]
        gone = await request("DELETE", f"{base}/v1/speakers/{speaker}", headers=ATTACKER_ORIGIN)
        assert refused(gone, "forbidden")
        assert (await request("DELETE", f"{base}/v1/speakers/{speaker}")).status == 204
        assert (await request("GET", f"{base}/healthz", headers=ATTACKER_HOST)).status == 200


@pytest.mark.parametrize(
    ("settings", "served"),
    [
        ({"allowed_hosts": "devbox"}, {"Host": "devbox:8000"}),
        ({"allowed_hosts": "*"}, ATTACKER_HOST),
        ({"protected_mode": False, "upload_sandbox": "off"}, ATTACKER_HOST),
    ],
)
async def test_the_host_rule_is_protected_modes_and_takes_allowed_hosts(
    settings: dict[str, Any], served: dict[str, str]
) -> None:
    """PARLEY_ALLOWED_HOSTS names more hosts a protected server answers (`*`: any), and
    the Host rule is protected mode's: a server serving anyone on purpose answers any."""
    async with serve_app(**settings) as app:
        answer = await request("GET", f"{app.http_url}/v1/speakers", headers=served)
        assert answer.status == 200, answer.body


def test_allowed_hosts_are_loopback_names_and_the_listed_ones() -> None:
    """Loopback names and addresses (any port, bracketed IPv6, a trailing dot) pass; other
    names, LAN addresses and look-alikes do not, unless listed; no Host (no browser)
    passes. The own origin by a listed name passes the Origin rule too."""
    policy = OriginPolicy.from_setting(None, auth_enabled=False, hosts="DevBox, lab.internal")
    for host in ("localhost", "LOCALHOST:8000", "localhost.", "app.localhost:5173",
                 "127.0.0.1", "127.3.2.1:80", "[::1]:8000", "[::ffff:127.0.0.1]",
                 "devbox:8000", "lab.internal", None):  # fmt: skip
        assert policy.allows_host(host), host
    for host in ("attacker.example", "127.0.0.1.attacker.example", "localhost.attacker.example",
                 "192.168.1.5:8000", "[::]:80", "", "[::1"):  # fmt: skip
        assert not policy.allows_host(host), host
    assert policy.allows("http://devbox:8000", "devbox:8000")
    assert not policy.allows("http://attacker.example:8000", "attacker.example:8000")
