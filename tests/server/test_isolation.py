"""Tenancy: three keys, three meetings each. Every cross attempt (join, listen, resume,
transcript read, token mint, token use elsewhere, token reuse, expired token) is refused
with its documented code, and no transcript byte crosses. Every test runs on both stores:
in process memory, and on Redis (meetings and meeting tokens there)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from server.auth.ownership import OWNER_FIELD
from store.records import SourceState
from tests.support import audiofiles
from tests.support.appserver import AppServer, serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP, bearer, error_of, exchange
from tests.support.httpclient import multipart, request
from tests.support.redis_support import delete_keys
from tests.support.wsclient import StreamResult

KEYS = {f"t{i}": f"key-of-tenant-{i}-0123456789abcdef" for i in range(3)}
CLIPS = ["en_jfk", "en_ls_1089-134686-0001", "en_ls_1221-135766-0002"]
APP_ORIGIN = "https://app.example"


@dataclass
class Meeting:
    tenant: str
    meeting_id: str
    participant: str
    stream: StreamResult = field(default_factory=StreamResult)

    @property
    def secrets(self) -> list[str]:
        """Strings that only this meeting's data contains."""
        started = self.stream.messages[0]
        finals = self.stream.finals
        return [
            self.participant,
            started["session_id"],
            started["resume_token"],
            *(f["utterance_id"] for f in finals),
        ]


@pytest.fixture(scope="module", params=["memory", "redis"])
async def tenancy(
    request: pytest.FixtureRequest, redis_url: str
) -> AsyncIterator[tuple[AppServer, list[Meeting]]]:
    """An authenticated server (in-memory or Redis store); each tenant has streamed speech
    into three meetings."""
    prefix = f"parley-test:{uuid.uuid4().hex[:12]}:"
    store = {"redis_url": redis_url, "store_prefix": prefix} if request.param == "redis" else {}
    async with serve_app(
        api_keys=",".join(f"{t}:{k}" for t, k in KEYS.items()),
        fast_replay_tenants="*",
        allowed_origins=APP_ORIGIN,
        auth_timeout_s=0.5,
        **store,
    ) as server:
        meetings = [
            Meeting(tenant, f"{tenant}-meeting-{i}", f"{tenant}-speaker-{i}")
            for tenant in KEYS
            for i in range(3)
        ]

        async def fill(meeting: Meeting, clip_id: str) -> None:
            pcm = clip(clip_id).pcm16()
            frames: list[bytes | str] = [pcm[o : o + 6400] for o in range(0, len(pcm), 6400)]
            url = f"{server.ws_url}/v1/meetings/{meeting.meeting_id}/stream"
            meeting.stream = await exchange(
                f"{url}?participant={meeting.participant}",
                [*frames, STOP],
                headers=bearer(KEYS[meeting.tenant]),
            )

        await asyncio.gather(*(fill(m, CLIPS[i % 3]) for i, m in enumerate(meetings)))
        for meeting in meetings:
            assert meeting.stream.close_code == 1000, meeting.stream.messages[-2:]
            assert meeting.stream.finals, meeting
        yield server, meetings
    if store:
        await delete_keys(redis_url, prefix)


def _leaks(payload: str, victims: list[Meeting]) -> list[str]:
    return [s for m in victims for s in m.secrets if s in payload]


async def test_owners_see_their_own_meetings(tenancy: tuple[AppServer, list[Meeting]]) -> None:
    """Each tenant reads and listens to its own meetings: every final, in seq order, and
    nothing of any other meeting."""
    server, meetings = tenancy

    async def check(meeting: Meeting) -> None:
        key = bearer(KEYS[meeting.tenant])
        path = f"/v1/meetings/{meeting.meeting_id}"
        status, _, body = await server.request("GET", f"{path}/transcript", headers=key)
        assert status == 200
        ids = [f["utterance_id"] for f in orjson.loads(body)["finals"]]
        assert ids == [f["utterance_id"] for f in meeting.stream.finals]
        listener = await exchange(
            f"{server.ws_url}{path}/events",
            headers=key,
            until=lambda r: len(r.finals) >= len(ids),
            linger=0.5,
        )
        assert [m["utterance_id"] for m in listener.finals] == ids
        received = body.decode() + orjson.dumps(listener.messages).decode()
        assert not _leaks(received, [m for m in meetings if m is not meeting])

    await asyncio.gather(*(check(m) for m in meetings))


async def test_every_cross_tenant_attempt_is_refused(
    tenancy: tuple[AppServer, list[Meeting]],
) -> None:
    """For every tenant and every meeting of another tenant: join, listen, resume, read,
    mint and spend a token elsewhere are refused 4403 / HTTP 403; no secret leaks."""
    server, meetings = tenancy
    ws = server.ws_url
    attempts: list[tuple[str, Meeting, Any]] = []
    for tenant, key in KEYS.items():
        own = next(m for m in meetings if m.tenant == tenant)
        for victim in (m for m in meetings if m.tenant != tenant):
            path = f"/v1/meetings/{victim.meeting_id}"
            token = victim.stream.messages[0]["resume_token"]  # stolen resume token
            _, _, minted = await server.request(
                "POST", f"/v1/meetings/{own.meeting_id}/tokens", headers=bearer(key)
            )
            own_token = orjson.loads(minted)["token"]
            attempts += [
                (
                    "join",
                    victim,
                    exchange(
                        f"{ws}{path}/stream?participant=x", [b"\0" * 640], headers=bearer(key)
                    ),
                ),
                ("listen", victim, exchange(f"{ws}{path}/events", headers=bearer(key))),
                (
                    "resume",
                    victim,
                    exchange(f"{ws}{path}/stream?resume_token={token}", headers=bearer(key)),
                ),
                ("own token", victim, exchange(f"{ws}{path}/events?access_token={own_token}")),
                ("read", victim, server.request("GET", f"{path}/transcript", headers=bearer(key))),
                ("mint", victim, server.request("POST", f"{path}/tokens", headers=bearer(key))),
            ]
    outcomes = await asyncio.gather(*(call for _, _, call in attempts))
    assert len(outcomes) == 3 * 6 * 6
    for (kind, victim, _), outcome in zip(attempts, outcomes, strict=True):
        if isinstance(outcome, StreamResult):
            error = error_of(outcome)
            assert outcome.close_code == 4403, (kind, victim.meeting_id, outcome.messages)
            assert error is not None and error["code"] == "forbidden"
            assert not any(m["type"].startswith("transcript.") for m in outcome.messages)
            payload = orjson.dumps(outcome.messages).decode()
        else:
            status, _, body = outcome
            assert status == 403, (kind, victim.meeting_id, body)
            assert orjson.loads(body)["error"]["code"] == "forbidden"
            payload = body.decode()
        assert not _leaks(payload, meetings), (kind, victim.meeting_id)
    for meeting in meetings:  # the stolen resume tokens did not take any source over
        assert (await _transcript_ids(server, meeting)) == [
            f["utterance_id"] for f in meeting.stream.finals
        ]


async def _transcript_ids(server: AppServer, meeting: Meeting) -> list[str]:
    _, _, body = await server.request(
        "GET",
        f"/v1/meetings/{meeting.meeting_id}/transcript",
        headers=bearer(KEYS[meeting.tenant]),
    )
    return [f["utterance_id"] for f in orjson.loads(body)["finals"]]


async def test_meeting_tokens_open_one_connection(
    tenancy: tuple[AppServer, list[Meeting]],
) -> None:
    """A token works once (subprotocol, query or auth message); reused or expired it is
    refused 4401; scoped or participant-bound it opens nothing else (4403)."""
    server, meetings = tenancy
    meeting = meetings[0]
    key = bearer(KEYS[meeting.tenant])
    base = f"/v1/meetings/{meeting.meeting_id}"
    ids = [f["utterance_id"] for f in meeting.stream.finals]

    async def mint(**body: Any) -> str:
        status, headers, raw = await server.request(
            "POST", f"{base}/tokens", headers=key, body=body
        )
        assert status == 201 and headers.get("cache-control") == "no-store", raw
        token: str = orjson.loads(raw)["token"]
        return token

    events = f"{server.ws_url}{base}/events"
    token = await mint(scope="events")

    def heard_all(r: StreamResult) -> bool:
        return len(r.finals) >= len(ids)

    via_subprotocol = await exchange(
        events, subprotocols=["parley.v1", f"parley.token.{token}"], until=heard_all, linger=0.5
    )
    assert [f["utterance_id"] for f in via_subprotocol.finals] == ids
    reused = await exchange(f"{events}?access_token={token}")
    assert reused.close_code == 4401 and error_of(reused)["code"] == "unauthorized"  # type: ignore[index]

    via_message = await exchange(
        events,
        [orjson.dumps({"type": "auth", "token": await mint()}).decode()],
        until=heard_all,
        linger=0.5,
    )
    assert [f["utterance_id"] for f in via_message.finals] == ids

    expired = await mint(ttl_s=0.05)
    await asyncio.sleep(0.1)
    late = await exchange(f"{events}?access_token={expired}")
    assert late.close_code == 4401

    wrong_scope = await exchange(f"{events}?access_token={await mint(scope='stream')}")
    assert wrong_scope.close_code == 4403
    stream = f"{server.ws_url}{base}/stream"
    bound = await mint(scope="stream", participant="ana")
    impostor = await exchange(f"{stream}?participant=bob&access_token={bound}", [STOP])
    assert impostor.close_code == 4403
    as_ana = await exchange(f"{stream}?access_token={await mint(participant='ana')}", [STOP])
    assert as_ana.messages[0]["participant"] == "ana" and as_ana.close_code == 1000

    status, _, body = await server.request(
        "GET", f"{base}/transcript?access_token={await mint(scope='transcript')}"
    )
    assert status == 200 and meeting.participant in body.decode()
    status, _, _ = await server.request(
        "POST", f"{base}/tokens", body={"scope": "nope"}, headers=key
    )
    assert status == 400


async def test_missing_bad_or_misplaced_credentials(
    tenancy: tuple[AppServer, list[Meeting]],
) -> None:
    """No credentials (past the auth deadline), an unknown key, a token minting call with a
    token, and an API key in the URL are refused 4401 / HTTP 401 with WWW-Authenticate."""
    server, meetings = tenancy
    base = f"/v1/meetings/{meetings[0].meeting_id}"
    stream = f"{server.ws_url}{base}/stream"
    silent = await exchange(stream, timeout=5)
    assert silent.close_code == 4401 and "within 0.5 s" in error_of(silent)["message"]  # type: ignore[index]
    audio_first = await exchange(stream, [b"\0" * 640])
    assert audio_first.close_code == 4401
    unknown = await exchange(stream, headers=bearer("not-a-key-0123456789abcdef"))
    assert unknown.close_code == 4401
    key_in_url = await exchange(f"{stream}?access_token={KEYS['t0']}")
    assert key_in_url.close_code == 4401
    basic = await exchange(stream, headers={"Authorization": "Basic dTpw"})
    assert basic.close_code == 4401
    status, headers, _ = await server.request("GET", f"{base}/transcript")
    assert status == 401 and headers.get("www-authenticate", "").startswith("Bearer")
    _, _, raw = await server.request("POST", f"{base}/tokens", headers=bearer(KEYS["t0"]))
    token = orjson.loads(raw)["token"]
    status, _, _ = await server.request("POST", f"{base}/tokens", headers=bearer(token))
    assert status == 401


async def test_origin_allowlist(tenancy: tuple[AppServer, list[Meeting]]) -> None:
    """A browser page from an origin not allowed is refused 4403 even with a valid key;
    the allowed origin and the server's own origin pass."""
    server, meetings = tenancy
    key = bearer(KEYS["t0"])
    events = f"{server.ws_url}/v1/meetings/{meetings[0].meeting_id}/events"
    evil = await exchange(events, headers=key, origin="https://evil.example")
    assert evil.close_code == 4403 and "Origin" in error_of(evil)["message"]  # type: ignore[index]
    for origin in (APP_ORIGIN, server.http_url):
        ok = await exchange(
            events, headers=key, origin=origin, until=lambda r: bool(r.finals), linger=0.5
        )
        assert ok.finals, origin


async def test_listener_waiting_for_a_meeting_another_tenant_creates(
    tenancy: tuple[AppServer, list[Meeting]],
) -> None:
    """A listener may wait on a meeting that does not exist yet; when another tenant creates
    it and speaks, the listener is closed 4403 before any transcript event."""
    server, _ = tenancy
    url = f"{server.ws_url}/v1/meetings/not-yet/events"
    waiting = asyncio.create_task(exchange(url, headers=bearer(KEYS["t0"])))
    async with asyncio.timeout(10):  # the listener is in, waiting (not refused as it joins)
        while server.state.listener_slots.held("not-yet") == 0:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    pcm = clip("en_jfk").pcm16()
    stream = await exchange(
        f"{server.ws_url}/v1/meetings/not-yet/stream?participant=other",
        [pcm[o : o + 6400] for o in range(0, len(pcm), 6400)] + [STOP],
        headers=bearer(KEYS["t1"]),
    )
    assert stream.finals
    listener = await asyncio.wait_for(waiting, 10)
    assert listener.close_code == 4403
    assert [m["type"] for m in listener.messages] == ["error"]


async def test_an_upload_never_joins_a_meeting_another_tenant_created_meanwhile(
    tenancy: tuple[AppServer, list[Meeting]],
) -> None:
    """Tenant t0 uploads a file into meeting `raced`, which does not exist when its owner
    is checked; t1 creates it before t0's source is (the race, forced here by the store):
    the upload is refused 403, as a stream would be, and t1's meeting logs none of t0's
    audio."""
    server, _ = tenancy
    store = server.state.store
    create_source = store.create_source

    async def t1_wins_the_race(
        meeting_id: str,
        participant: str,
        config: Mapping[str, Any] | None = None,
        *,
        origin: float | None = None,
    ) -> tuple[SourceState, str]:
        if meeting_id == "raced" and (config or {}).get(OWNER_FIELD) == "t0":
            await create_source(meeting_id, "t1-speaker", {OWNER_FIELD: "t1"})
        return await create_source(meeting_id, participant, config, origin=origin)

    content_type, pieces = multipart(audiofiles.encode(clip("en_jfk").samples(), "wav"), "a.wav")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "create_source", t1_wins_the_race)
        response = await request(
            "POST",
            f"{server.http_url}/v1/transcriptions?meeting_id=raced&wait=true",
            body=pieces,
            headers={"Content-Type": content_type, **bearer(KEYS["t0"])},
        )
    assert response.status == 403, response.body
    assert response.json()["error"]["code"] == "forbidden"
    assert await store.finals("raced") == []
