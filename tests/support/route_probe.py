"""Every route of a Parley server tried once, as one client: what each one answered.

Used in-process (tests/server/test_protected.py) and, as `python -m tests.support.route_probe`,
from inside a network namespace, where it prints the answers as JSON (the test runs it
there with `ip netns exec`, since a namespace is a process's, not a coroutine's):

    python -m tests.support.route_probe http://10.0.0.1:8000 [--header 'Name: value']...
    python -m tests.support.route_probe http://127.0.0.1:8000 --stream-jfk

An answer is `{"status", "code", "close", "first"}`: the HTTP status (101 for a socket
that was upgraded), the error code the server gave (its JSON body, or its `error`
message on a socket), the socket's close code, and the type of its first message.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.audiofiles import wav_header
from tests.support.httpclient import multipart, request
from tests.support.timeouts import START_TIMEOUT, S

MEETING = "probe-meeting"
READY_TIMEOUT_S = START_TIMEOUT
ANSWER_TIMEOUT_S = 30 * S
# The routes that reach meetings (protected mode refuses them), and those open to all.
MEETING_ROUTES = (
    "stream",
    "events",
    "listen",
    "flux",
    "realtime",
    "transcript",
    "upload",
    "job",
    "delete_job",
    "token",
    "speakers",
    "speaker",
)
OPEN_ROUTES = ("healthz", "readyz", "metrics")


@dataclass
class Answer:
    status: int
    code: str | None = None
    close: int | None = None
    first: str | None = None
    message: str | None = None  # the error's message


# What each meeting route answers a client it serves.
SERVED: dict[str, dict[str, Any]] = {
    "stream": {"status": 101, "first": "session.started", "close": 1000},
    "events": {"status": 101, "code": "unsupported_data", "close": 1003},  # audio refused
    "listen": {"status": 101},
    "flux": {"status": 101},
    "realtime": {"status": 101, "first": "session.created"},
    "transcript": {"status": 404, "code": "not_found"},  # the stream above logged no final
    "upload": {"status": 202},
    "job": {"status": 200},
    "delete_job": {"status": 204},
    "token": {"status": 201},
    "speakers": {"status": 200},  # the tenant's enrolled speakers (none)
    "speaker": {"status": 404, "code": "not_found"},  # one of them, by id
}
REFUSED_SOCKET = {"status": 101, "code": "protected_mode", "close": 4403}
REFUSED_HTTP = {"status": 403, "code": "protected_mode"}  # the compat sockets' too


def mismatches(answers: dict[str, Answer], expected: dict[str, dict[str, Any]]) -> list[str]:
    """Routes whose answer differs from `expected` in a field it names."""
    return [
        f"{route}: {answers[route]} (expected {want})"
        for route, want in expected.items()
        if any(getattr(answers[route], key) != value for key, value in want.items())
    ]


def refused_everywhere() -> dict[str, dict[str, Any]]:
    return {
        route: REFUSED_SOCKET if route in ("stream", "events") else REFUSED_HTTP
        for route in MEETING_ROUTES
    }


def served_everywhere(**changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {**SERVED, **changes}


def _refusal(status: int, body: bytes) -> Answer:
    """An HTTP answer, with the error of its JSON body in any of the three formats the
    server speaks (Parley's and OpenAI's `{"error": {"code", "message"}}`, Deepgram's
    `{"err_code", "err_msg"}`)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Answer(status)
    if not isinstance(data, dict):
        return Answer(status)
    error = data.get("error")
    if isinstance(error, dict):
        return Answer(status, code=str(error.get("code")), message=str(error.get("message")))
    if "err_code" in data:
        return Answer(status, code=str(data["err_code"]), message=str(data.get("err_msg")))
    return Answer(status)


async def _http(
    method: str, url: str, headers: dict[str, str], pieces: list[bytes] | None = None
) -> tuple[Answer, Any]:
    response = await request(
        method, url, body=pieces or (), headers=headers, timeout=ANSWER_TIMEOUT_S
    )
    body: Any = None
    if response.headers.get("content-type", "").startswith("application/json"):
        body = response.json()
    return _refusal(response.status, response.body), body


async def _socket(url: str, headers: dict[str, str], then: str) -> Answer:
    """Open a socket, then, as `then` says: `stop` (a stream: read its first message, send
    `stop`), `audio` (a listener: send it an audio frame, which it refuses), `first` (read
    one message), `none` (nothing). Then read until the server closes (not after `first`
    or `none`: a served compat session would wait for audio)."""
    try:
        async with connect(url, additional_headers=headers, open_timeout=ANSWER_TIMEOUT_S) as ws:
            return await asyncio.wait_for(_converse(ws, then), ANSWER_TIMEOUT_S)
    except InvalidStatus as refused:
        response = refused.response
        return _refusal(response.status_code, bytes(response.body or b""))


async def _converse(ws: ClientConnection, then: str) -> Answer:
    messages: list[dict[str, Any]] = []
    try:
        if then in ("stop", "first"):
            messages.append(orjson.loads(await ws.recv()))
        if then == "stop":
            await ws.send(orjson.dumps({"type": "stop"}).decode())
        elif then == "audio":
            await ws.send(b"\0\0")
    except ConnectionClosed:  # refused: what it said is still queued
        pass
    if then in ("stop", "audio"):
        try:
            async for raw in ws:
                messages.append(orjson.loads(raw))
        except ConnectionClosed:
            pass
    errors = [m for m in messages if m.get("type") == "error"]
    return Answer(
        101,
        code=str(errors[0]["code"]) if errors else None,
        close=ws.close_code,
        first=str(messages[0].get("type")) if messages else None,
        message=str(errors[0]["message"]) if errors else None,
    )


def silence_wav(seconds: float = 0.5) -> bytes:
    data = bytes(int(16_000 * seconds) * 2)
    return wav_header(16_000, len(data)) + data


async def probe(base: str, headers: dict[str, str]) -> dict[str, Answer]:
    """Try every route once with `headers` on each request; the answers by route."""
    ws = "ws" + base.removeprefix("http")
    meeting = f"{base}/v1/meetings/{MEETING}"
    answers: dict[str, Answer] = {}
    answers["stream"] = await _socket(f"{ws}/v1/meetings/{MEETING}/stream", headers, "stop")
    answers["events"] = await _socket(f"{ws}/v1/meetings/{MEETING}/events", headers, "audio")
    answers["listen"] = await _socket(f"{ws}/v1/listen?meeting_id={MEETING}-dg", headers, "none")
    flux = f"{ws}/v2/listen?model=flux-general-en&meeting_id={MEETING}-fx"
    answers["flux"] = await _socket(flux, headers, "none")
    answers["realtime"] = await _socket(
        f"{ws}/v1/realtime?intent=transcription&meeting_id={MEETING}-oa", headers, "first"
    )
    answers["transcript"], _ = await _http("GET", f"{meeting}/transcript", headers)
    content_type, pieces = multipart(silence_wav(), "silence.wav")
    answers["upload"], job = await _http(
        "POST", f"{base}/v1/transcriptions", {**headers, "Content-Type": content_type}, pieces
    )
    job_url = f"{base}/v1/transcriptions/" + (
        job["id"] if answers["upload"].status == 202 else "no-such-job"
    )
    answers["job"], _ = await _http("GET", job_url, headers)
    answers["delete_job"], _ = await _http("DELETE", job_url, headers)
    answers["token"], _ = await _http("POST", f"{meeting}/tokens", headers)
    answers["speakers"], _ = await _http("GET", f"{base}/v1/speakers", headers)
    answers["speaker"], _ = await _http("GET", f"{base}/v1/speakers/no-such-speaker", headers)
    for name in OPEN_ROUTES:
        answers[name], _ = await _http("GET", f"{base}/{name}", headers)
    return answers


async def wait_ready(base: str, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Poll /readyz (bounded, backing off) until it answers 200; its body."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = await request("GET", f"{base}/readyz", timeout=10)
            if response.status == 200:
                ready: dict[str, Any] = response.json()
                return ready
            last = response.text
        except OSError as exc:
            last = repr(exc)
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise TimeoutError(f"{base} not ready after {timeout} s: {last}")


async def stream_jfk(base: str) -> dict[str, Any]:
    """Stream the corpus's JFK clip (fast replay) and return its finals' text."""
    from tests.support.corpus import clip  # the corpus only where a stream is asked for
    from tests.support.wsclient import stream_pcm

    ws = "ws" + base.removeprefix("http")
    result = await stream_pcm(ws, "probe-jfk", clip("en_jfk").pcm16(), speed=0)
    return {"close": result.close_code, "text": result.text}


async def _main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m tests.support.route_probe")
    parser.add_argument("base", help="http://HOST:PORT of the server")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("--stream-jfk", action="store_true")
    args = parser.parse_args(argv)
    headers = dict(
        (name.strip(), value.strip()) for name, _, value in (h.partition(":") for h in args.header)
    )
    ready = await wait_ready(args.base)
    if args.stream_jfk:
        return {"readyz": ready, "jfk": await stream_jfk(args.base)}
    answers = await probe(args.base, headers)
    return {"readyz": ready, "answers": {name: asdict(a) for name, a in answers.items()}}


if __name__ == "__main__":
    sys.stdout.write(orjson.dumps(asyncio.run(_main(sys.argv[1:]))).decode() + "\n")
