"""Uploads under authentication: an API key is required, and a job is its tenant's alone."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.corpus import clip
from tests.support.httpclient import multipart, request
from tests.support.servers import start_server

pytestmark = pytest.mark.slow

KEY_A, KEY_B = "upload-key-a-0123456789abcdef", "upload-key-b-0123456789abcdef"


async def test_upload_needs_a_key_and_jobs_stay_with_their_tenant() -> None:
    """No key → 401; tenant A's job is 404 for tenant B and readable by A; A cannot attach
    a file to B's meeting."""
    server = await asyncio.to_thread(start_server, {"PARLEY_API_KEYS": f"a:{KEY_A},b:{KEY_B}"})
    try:
        wav = clip("en_ls_61-70968-0000").path.read_bytes()
        base = server.http_url

        async def post(key: str | None, **params: str) -> tuple[int, dict[str, str], bytes]:
            content_type, pieces = multipart(wav, "speech.wav")
            headers = {"Content-Type": content_type}
            if key:
                headers["Authorization"] = f"Bearer {key}"
            response = await request(
                "POST", f"{base}/v1/transcriptions", body=pieces, headers=headers, params=params
            )
            return response.status, response.headers, response.body

        status, _, _ = await post(None)
        assert status == 401
        status, headers, _ = await post(KEY_A)
        assert status == 202
        location = headers["location"]
        other = await request("GET", base + location, headers={"Authorization": f"Bearer {KEY_B}"})
        assert other.status == 404
        mine = await request("GET", base + location, headers={"Authorization": f"Bearer {KEY_A}"})
        assert mine.status == 200 and mine.json()["id"] in location
        # B's meeting: created by B's upload, then A may not attach to it.
        status, _, _ = await post(KEY_B, meeting_id="b-meeting", wait="true")
        assert status == 200
        status, _, body = await post(KEY_A, meeting_id="b-meeting")
        assert status == 403, body
    finally:
        server.stop()


async def test_an_upload_without_a_key_hears_its_401_whatever_the_body() -> None:
    """A keyless upload of a body bigger than the socket buffers still reads its 401: the
    server drains the body before refusing, so closing does not reset the connection
    under the answer (CI once lost the 401 to a broken pipe)."""
    server = await asyncio.to_thread(start_server, {"PARLEY_API_KEYS": f"a:{KEY_A}"})
    try:
        content_type, pieces = multipart(bytes(900 << 10), "silence.wav")
        for _ in range(8):
            response = await request(
                "POST",
                f"{server.http_url}/v1/transcriptions",
                body=pieces,
                headers={"Content-Type": content_type},
            )
            assert response.status == 401, response.body
            assert response.json()["error"]["code"] == "unauthorized"
    finally:
        server.stop()
