"""Upload jobs seen from two nodes (two apps, one real Redis): a delete through one node
is a delete on every node, and its tombstone keeps a late write from bringing it back."""

from __future__ import annotations

from pathlib import Path

from tests.support.appserver import serve_app
from tests.support.audiofiles import wav_header
from tests.support.corpus import clip
from tests.support.httpclient import request, upload


async def test_a_finished_job_deleted_through_b_is_gone_on_a(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    """A transcribes an upload; B reads it from the store and deletes it (204); A, which
    holds the finished job in memory, answers 404 from then on, as B does."""
    settings = {"redis_url": redis_url, "store_prefix": redis_prefix, "upload_sandbox": "none"}
    async with (
        serve_app(upload_dir=str(tmp_path / "a"), **settings) as a,
        serve_app(upload_dir=str(tmp_path / "b"), **settings) as b,
    ):
        pcm = clip("en_jfk").pcm16()
        done = await upload(
            a.http_url, wav_header(16_000, len(pcm)) + pcm, "jfk.wav", params={"wait": "true"}
        )
        assert done.status == 200, done.body
        job_id = done.json()["id"]
        path = f"/v1/transcriptions/{job_id}"
        assert (await request("GET", a.http_url + path)).status == 200
        assert (await request("GET", b.http_url + path)).status == 200
        assert (await request("DELETE", b.http_url + path)).status == 204
        for node in (a, b):
            gone = await request("GET", node.http_url + path)
            assert gone.status == 404, (node.port, gone.body)
        assert a.state.jobs.get(job_id) is None  # A forgot it, files and all
