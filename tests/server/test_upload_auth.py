"""Uploads under authentication: an API key is required, and a job is its tenant's alone."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import start_server
from tests.corpus import clip
from tests.httpclient import multipart, request

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
