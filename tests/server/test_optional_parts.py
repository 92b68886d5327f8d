"""A missing optional part switches its feature off with a warning; it never stops
transcription. The real server, with a broken `resemblyzer` (no weights) first on its path."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.corpus import clip
from tests.support.httpclient import upload
from tests.support.servers import ServerProcess, start_server
from tests.support.wsclient import StreamResult, receive_all, stream_pcm, stream_url

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_without_speakers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose `resemblyzer` package has no `pretrained.pt` (a broken or partial
    install, as a plain `pip install .` without the Makefile's extra step leaves one)."""
    shadow = tmp_path_factory.mktemp("shadow")
    package = shadow / "resemblyzer"
    package.mkdir()
    (package / "__init__.py").write_text('"""No weights here."""\n')
    server = start_server({"PYTHONPATH": str(shadow)})
    yield server
    server.stop()


def test_the_server_becomes_ready_and_says_why_diarization_is_off(
    server_without_speakers: ServerProcess,
) -> None:
    """/readyz answers 200 (the start fixture waited for it) and the log warns once, naming
    the missing weights and that transcription goes on."""
    status, _ = server_without_speakers.get("/readyz")
    assert status == 200
    warnings = [
        line
        for line in server_without_speakers.log().splitlines()
        if "diarization is unavailable" in line
    ]
    assert len(warnings) == 1, warnings
    assert "pretrained.pt" in warnings[0] and "transcription goes on" in warnings[0]


async def test_a_stream_still_transcribes_and_diarize_is_refused_with_the_reason(
    server_without_speakers: ServerProcess,
) -> None:
    """A plain stream gets its finals; `diarize=true` is closed 4400 `bad_config` with the
    reason; an upload with `diarize=true` gets 400 with the same reason."""
    base = server_without_speakers.ws_url
    pcm = clip("en_jfk").pcm16()
    plain = await stream_pcm(base, "optional-plain", pcm, speed=0)
    finals = [m for m in plain.messages if m["type"] == "transcript.final"]
    assert "fellow americans" in " ".join(f["text"] for f in finals).lower()
    assert plain.close_code == 1000
    refused = StreamResult()
    url = stream_url(base, "optional-diarize", participant="speaker", diarize="true")
    async with connect(url) as ws:  # refused before any audio: send none, just listen
        await asyncio.wait_for(receive_all(ws, refused), 60)
    errors = [m for m in refused.messages if m["type"] == "error"]
    assert errors and errors[0]["code"] == "bad_config", refused.messages
    assert "pretrained.pt" in errors[0]["message"]
    assert refused.close_code == 4400
    response = await upload(
        server_without_speakers.http_url,
        clip("en_jfk").path.read_bytes(),
        "jfk.wav",
        params={"diarize": "true", "wait": "true"},
    )
    assert response.status == 400
    body = orjson.loads(response.body)
    assert "pretrained.pt" in str(body), body
