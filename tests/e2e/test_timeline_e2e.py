"""One meeting timeline with real speech: two recordings of one meeting, uploaded one
after the other with the times they started at, overlap in time; the meeting's
transcript and a listener's replay interleave them as they were said, `seq` in the order
they were logged."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from loadgen.wer import error_rate
from tests.support.corpus import clip
from tests.support.httpclient import get, upload
from tests.support.servers import ServerProcess
from tests.support.wsclient import StreamResult, receive_all

pytestmark = pytest.mark.slow

ANA, BO = clip("en_jfk"), clip("en_ls_2412-153948-0000")  # 11 s and 11.7 s, several phrases


async def test_uploads_with_started_at_interleave_in_meeting_time(
    parley_server: ServerProcess,
) -> None:
    base, meeting = parley_server.http_url, f"timeline-{time.monotonic_ns()}"
    t0 = float(int(time.time()) - 60)  # bo's recording started a minute ago, ana's 2 s later
    ana_at = datetime.datetime.fromtimestamp(t0 + 2, datetime.UTC).isoformat()
    bad = await upload(base, ANA.path.read_bytes(), params={"started_at": "yesterday"})
    assert bad.status == 400 and bad.json()["error"]["code"] == "bad_config"
    # ana's file is uploaded (and logged) first, though bo started speaking before her
    uploads: dict[str, dict[str, Any]] = {}
    for recording, name, started_at in ((ANA, "ana", ana_at), (BO, "bo", str(t0))):
        response = await upload(
            base,
            recording.path.read_bytes(),
            "meeting.wav",
            params={"wait": "true"},
            fields={"meeting_id": meeting, "participant": name, "started_at": started_at},
        )
        assert response.status == 200, response.body
        uploads[name] = response.json()
    assert uploads["ana"]["options"]["started_at"] == t0 + 2

    finals = (await get(f"{base}/v1/meetings/{meeting}/transcript")).json()
    assert finals["origin"] == t0
    logged = finals["finals"]
    assert sorted(f["seq"] for f in logged) == list(range(1, len(logged) + 1))
    origins = {"ana": t0 + 2, "bo": t0}
    for f in logged:
        assert f["wall_time"]["start"] == round(origins[f["participant"]] + f["start"], 3)
    when = [(origins[f["participant"]] + f["start"], f["seq"]) for f in logged]
    assert when == sorted(when)  # meeting time, then seq
    who = [f["participant"] for f in logged]
    assert who[0] == "bo" and who.index("ana") < len(who) - 1 - who[::-1].index("bo"), who
    assert [f["seq"] for f in logged] != sorted(f["seq"] for f in logged)
    for name, reference in (("ana", ANA.reference), ("bo", BO.reference)):
        text = " ".join(f["text"] for f in logged if f["participant"] == name)
        assert error_rate(reference, text) <= 0.2, (name, text)

    txt = (await get(f"{base}/v1/meetings/{meeting}/transcript?format=txt")).body.decode()
    lines = txt.splitlines()
    assert [line.split("] ", 1)[1].split(":", 1)[0] for line in lines] == who
    first = logged[0]
    assert lines[0].startswith(f"[00:00:{first['start']:06.3f}] bo: ")

    replay = StreamResult()
    async with connect(parley_server.ws_url + f"/v1/meetings/{meeting}/events") as listener:
        receiving = asyncio.create_task(receive_all(listener, replay))
        await asyncio.wait_for(replay.wait_for(lambda r: len(r.finals) == len(logged)), 10)
        receiving.cancel()
    assert [f["seq"] for f in replay.finals] == [f["seq"] for f in logged]
    assert orjson.dumps(replay.finals) == orjson.dumps(logged)
