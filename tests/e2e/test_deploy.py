"""The deployment of `python -m deploy.local`, started whole: Redis with Sentinel, three
real `python -m server` nodes with API keys, and HAProxy in front (leastconn, health
checks on /readyz, X-Forwarded-For). A stream goes through the balancer; the node
serving it is SIGKILLed; the client resumes through the balancer on a survivor, and the
transcript holds every final it received, once each, gap-free."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import signal
import time
from collections.abc import Iterator

import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from deploy.local import Deployment, Node
from loadgen.wer import error_rate
from tests.support.corpus import clip
from tests.support.servers import DRAIN_GRACE_S
from tests.support.timeouts import START_TIMEOUT, S
from tests.support.wsclient import ResumableStream

pytestmark = pytest.mark.slow

LONG = "en_ls_1221-135766-0001"  # 16.7 s, several utterances
CLIENT_IP = "127.0.0.2"  # a loopback address of its own, so the nodes can tell it apart


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    workdir = tmp_path_factory.mktemp("deploy")
    deployed = Deployment(
        workdir, nodes=3, env={"PARLEY_UPLOAD_SANDBOX": "none"}, drain_grace_s=DRAIN_GRACE_S
    )
    try:
        deployed.start(START_TIMEOUT)
        yield deployed
    finally:
        deployed.stop()


def _get(deployment: Deployment, path: str) -> tuple[int, bytes]:
    """GET through the balancer, from CLIENT_IP, with the API key."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", deployment.port, timeout=10, source_address=(CLIENT_IP, 0)
    )
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {deployment.key}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_balancer_checks_readyz_and_forwards_the_client_address(deployment: Deployment) -> None:
    status, body = _get(deployment, "/readyz")
    assert status == 200 and orjson.loads(body)["access"] == "keys", body
    # the node logs the client's address (X-Forwarded-For from a trusted proxy), not HAProxy's
    assert any(f"{CLIENT_IP}:" in node.log_path.read_text() for node in deployment.nodes)


async def _serving(deployment: Deployment) -> Node:
    """The node with the open stream, once it has one."""
    deadline = time.monotonic() + 60 * S
    while True:
        counts = await asyncio.gather(
            *(asyncio.to_thread(n.active_sessions) for n in deployment.nodes if n.alive)
        )
        alive = [n for n in deployment.nodes if n.alive]
        serving = [n for n, count in zip(alive, counts, strict=True) if count]
        if serving:
            assert len(serving) == 1, counts
            return serving[0]
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def test_node_killed_mid_stream_resumes_through_the_balancer(
    deployment: Deployment,
) -> None:
    speech = clip(LONG)
    auth = {"Authorization": f"Bearer {deployment.key}"}
    stream = ResumableStream(deployment.ws_url, "deployed", speech.pcm16(), speed=1.5, headers=auth)

    async def kill_after_first_final() -> Node:
        await stream.connected.wait()
        await stream.connections[0].wait_for(lambda r: len(r.finals) >= 1)
        node = await _serving(deployment)
        node.end(signal.SIGKILL)
        return node

    killer = asyncio.create_task(kill_after_first_final())
    with contextlib.suppress(ConnectionClosed):  # sending may or may not notice first
        await stream.run()
    killed = await killer
    first = stream.connections[0]
    assert not first.of_type("session.ended")  # cut, not ended
    await stream.run(resume=True)  # through the balancer again: a survivor takes it
    assert not killed.alive
    resumed = stream.connections[-1]
    assert resumed.messages[0]["type"] == "session.started"
    assert resumed.messages[-1]["type"] == "session.ended"

    status, body = _get(deployment, "/v1/meetings/deployed/transcript")
    assert status == 200, body
    logged = orjson.loads(body)["finals"]
    received = [f["utterance_id"] for f in stream.finals]
    assert len(received) == len(set(received))
    assert [f["utterance_id"] for f in logged] == received
    assert [f["seq"] for f in logged] == list(range(1, len(logged) + 1))
    assert error_rate(speech.reference, " ".join(f["text"] for f in logged)) <= 0.2
