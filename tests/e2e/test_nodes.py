"""Several nodes, one service: real `python -m server` processes on one Redis (a prefix
of their own), API keys on, one stream per tenant. An upload accepted by one node is
read, rendered and cancelled through another; the tenant's stream quota counts across
nodes; a resume on one node closes the old connection on the other at once; a node
killed mid-upload leaves its job failed (`node_lost`) and its quota slot free within
its lease; `/readyz` says 503 at capacity and while draining."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from loadgen.wer import error_rate
from tests.support.audiofiles import wav_header
from tests.support.corpus import clip
from tests.support.httpclient import HttpResponse, multipart, request
from tests.support.redis_support import delete_keys
from tests.support.servers import ServerProcess, start_server
from tests.support.timeouts import START_TIMEOUT, S
from tests.support.wsclient import BYTES_PER_SECOND, StreamResult, receive_all, stream_url

pytestmark = pytest.mark.slow

KEY = "key-of-tenant-n-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
LEASE_S = 2.0  # PARLEY_NODE_LEASE_S: a dead node's slots and jobs settle this fast
SETTLE_S = 60 * S  # what a test waits at most for something the nodes do by themselves
JFK = clip("en_jfk")


def _env(redis_url: str, prefix: str, keys: Path, **extra: str) -> dict[str, str]:
    return {
        "PARLEY_REDIS_URL": redis_url,
        "PARLEY_STORE_PREFIX": prefix,
        "PARLEY_API_KEYS_FILE": str(keys),
        "PARLEY_MAX_STREAMS_PER_KEY": "1",
        "PARLEY_MAX_SESSIONS": "1",
        "PARLEY_NODE_LEASE_S": str(LEASE_S),
        "PARLEY_JOB_SYNC_S": "0.2",
        "PARLEY_IDLE_TIMEOUT_S": "600",  # a silent stream stays open until the test ends it
        "PARLEY_UPLOAD_SANDBOX": "none",  # not under test here; bubblewrap is slow to start
        **extra,
    }


class Nodes:
    def __init__(self, redis_url: str, prefix: str, keys: Path) -> None:
        self.redis_url, self.prefix, self.keys = redis_url, prefix, keys
        self.started: list[ServerProcess] = []

    def start(self, count: int, **extra: str) -> list[ServerProcess]:
        env = _env(self.redis_url, self.prefix, self.keys, **extra)
        nodes = [start_server(env, wait=False) for _ in range(count)]
        self.started += nodes
        for node in nodes:
            node.wait_ready(START_TIMEOUT)
        return nodes


@pytest.fixture(scope="module")
def nodes(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"tenant-n:{KEY}\n")
    prefix = f"parley-test:{uuid.uuid4().hex[:12]}:"
    pool = Nodes(redis_url, prefix, keys)
    try:
        yield pool
    finally:
        for node in pool.started:
            if node.process.poll() is None:
                node.process.kill()
                node.process.wait()
        asyncio.run(delete_keys(redis_url, prefix))


@pytest.fixture(scope="module")
def trio(nodes: Nodes) -> tuple[ServerProcess, ServerProcess, ServerProcess]:
    """Three nodes, started together (their models load side by side). C is killed in
    one test, A drains in the last: none is stopped gently (the drain grace is long)."""
    a, b, c = nodes.start(3, PARLEY_DRAIN_GRACE_S="60")
    return a, b, c


def _wav(seconds: float) -> bytes:
    pcm = JFK.pcm16() + bytes(BYTES_PER_SECOND)
    pcm = (pcm * (int(seconds * BYTES_PER_SECOND) // len(pcm) + 1))[: int(seconds * 16_000) * 2]
    return wav_header(16_000, len(pcm)) + pcm


async def _upload(node: ServerProcess, data: bytes) -> str:
    content_type, pieces = multipart(data, "meeting.wav")
    response = await request(
        "POST",
        node.http_url + "/v1/transcriptions?wait=false",
        body=pieces,
        headers={**AUTH, "Content-Type": content_type},
    )
    assert response.status == 202, response.body
    job_id: str = response.json()["id"]
    return job_id


async def _job(node: ServerProcess, job_id: str, fmt: str = "json") -> HttpResponse:
    url = f"{node.http_url}/v1/transcriptions/{job_id}?format={fmt}"
    return await request("GET", url, headers=AUTH)


async def _until_job(node: ServerProcess, job_id: str, *statuses: str) -> dict[str, Any]:
    """The job as `node` reads it, once its status is one of `statuses`."""
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while True:
        response = await _job(node, job_id)
        assert response.status == 200, response.body
        body: dict[str, Any] = response.json()
        if body["status"] in statuses:
            return body
        assert asyncio.get_running_loop().time() < deadline, body
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _stream(
    node: ServerProcess, meeting: str, **params: Any
) -> AsyncIterator[tuple[ClientConnection, StreamResult]]:
    """A stream (authenticated as the tenant) and what it receives."""
    result = StreamResult()
    url = stream_url(node.ws_url, meeting, participant="ana", **params)
    async with connect(url, additional_headers=AUTH) as ws:
        receiver = asyncio.create_task(receive_all(ws, result))
        try:
            yield ws, result
        finally:
            with contextlib.suppress(Exception):
                await ws.send(orjson.dumps({"type": "stop"}).decode())
            await asyncio.wait_for(receiver, SETTLE_S)


async def _started(result: StreamResult) -> dict[str, Any]:
    await asyncio.wait_for(
        result.wait_for(lambda r: bool(r.of_type("session.started")) or r.close_code is not None),
        SETTLE_S,
    )
    assert result.of_type("session.started"), (result.close_code, result.messages)
    return result.of_type("session.started")[0]


async def _closed(result: StreamResult) -> int | None:
    await asyncio.wait_for(result.wait_for(lambda r: r.close_code is not None), SETTLE_S)
    return result.close_code


def _readyz(node: ServerProcess) -> tuple[int, dict[str, Any]]:
    status, body = node.get("/readyz")
    return status, orjson.loads(body)


async def test_an_upload_to_one_node_is_read_and_cancelled_through_another(
    trio: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    """A accepts two uploads. B reports the first's status, then its text (JSON and
    TXT) once done; B cancels the second: gone at once for B, and A stops and forgets
    it (its own GET says 404)."""
    a, b, _ = trio
    short = await _upload(a, _wav(JFK.duration))
    done = await _until_job(b, short, "done", "failed")
    assert done["status"] == "done", done
    assert error_rate(JFK.reference, done["result"]["text"]) < 0.2, done["result"]
    txt = await _job(b, short, "txt")
    assert txt.status == 200 and "fellow Americans" in txt.body.decode(), txt.body

    long = await _upload(a, _wav(90))
    await _until_job(b, long, "queued", "running")
    cancelled = await request("DELETE", f"{b.http_url}/v1/transcriptions/{long}", headers=AUTH)
    assert cancelled.status == 204, cancelled.body
    assert (await _job(b, long)).status == 404
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while (await _job(a, long)).status != 404:  # A cancels it at its next job sync
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)
    assert "cancelled through another node" in a.log()


async def test_the_tenants_stream_quota_counts_across_nodes_and_readyz_says_full(
    trio: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    """With the tenant's one stream open on A, a second stream on B is closed 4429; A,
    at its one session, answers /readyz 503 at capacity; both settle once it ends."""
    a, b, _ = trio
    async with _stream(a, "quota-first") as (_, first):
        await _started(first)
        status, body = _readyz(a)
        assert status == 503 and body["checks"]["sessions"] == "full", body
        assert any(r.startswith("at capacity") for r in body["reasons"]), body
        async with _stream(b, "quota-second") as (_, second):
            assert await _closed(second) == 4429
            assert second.of_type("error")[0]["code"] == "quota_exceeded"
    assert await _closed(first) == 1000
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while _readyz(a)[0] != 200:
        assert asyncio.get_running_loop().time() < deadline, _readyz(a)
        await asyncio.sleep(0.05)


async def test_a_resume_on_another_node_closes_the_old_connection_at_once(
    trio: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    """A stream opens on A and goes silent (no audio queued, no final to come); its
    resume on B takes the source over (within the tenant's one-stream quota) and A's
    connection gets `conflict` and 4409: only the announcement can have closed it."""
    a, b, _ = trio
    async with _stream(a, "takeover") as (_, old):
        token = (await _started(old))["resume_token"]
        async with _stream(b, "takeover", resume_token=token, last_seq=0) as (_, new):
            await _started(new)
            assert await _closed(old) == 4409
            assert old.of_type("error")[-1]["code"] == "conflict"
            assert new.close_code is None  # the new connection goes on
        assert new.close_code == 1000


async def test_a_killed_node_leaves_its_job_failed_and_its_slot_free(
    trio: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    """C runs an upload and holds the tenant's stream; C is SIGKILLed. Through B the job
    reads failed `node_lost` and the tenant's stream is admitted again, each within a
    few lease times (the test waits on them, not on a clock)."""
    _, b, c = trio
    job = await _upload(c, _wav(90))
    await _until_job(b, job, "running")
    async with _stream(c, "doomed") as (_, doomed):
        await _started(doomed)
        os.kill(c.process.pid, signal.SIGKILL)
        c.process.wait()
    failed = await _until_job(b, job, "failed")
    assert failed["error"]["code"] == "node_lost", failed
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while True:  # the slot C held is refused (4429) until its lease expires
        async with _stream(b, "survivor") as (_, survivor):
            await asyncio.wait_for(
                survivor.wait_for(
                    lambda r: bool(r.of_type("session.started")) or r.close_code is not None
                ),
                SETTLE_S,
            )
            if survivor.of_type("session.started"):
                break
        assert survivor.close_code == 4429, survivor.messages
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.2)


async def test_a_draining_node_says_so_on_readyz(
    trio: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    """SIGTERM with a drain grace: /readyz answers 503 `draining` while the node still
    listens, so a balancer's health check takes it out before it stops."""
    d, _, _ = trio
    assert _readyz(d)[0] == 200
    d.process.send_signal(signal.SIGTERM)
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while (reply := _readyz(d))[0] != 503:
        assert asyncio.get_running_loop().time() < deadline, reply
        await asyncio.sleep(0.05)
    _, body = reply
    assert body["checks"]["draining"] == "true", body
    assert any(r.startswith("draining") for r in body["reasons"]), body
    d.process.kill()
    d.process.wait()
