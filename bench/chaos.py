"""`python -m bench.chaos`: streams of real speech through random faults; counts finals
lost and duplicated, and the close codes every connection ended with.

N streams (one meeting each) replay corpus speech through a Parley server on a Redis
store of the bench's own. Meanwhile F faults strike at random moments, each one of:

- **abort**: a client's connection is cut (the transport aborted, no close handshake);
- **half-open**: a client goes silent with its connection open (it stops sending and
  reading, answers no ping, never closes), then resumes on a new connection, as a client
  whose network path died does; the old socket is read at the end for how it was closed;
- **server kill**: the server is SIGKILLed and restarted on the same port;
- **redis restart**: redis-server is SIGKILLed and restarted (append-only file, fsync
  always: it comes back with its data).

Every client keeps its whole audio, resumes with its token and the last `seq` it saw,
re-sends from `send_from` (saying so with `resend`: the audio before `resume_from` is the
next final's left context), retries refusals with backoff, and finally sends `stop`.
At the end each meeting's log (`GET …/transcript`) is compared with the same audio
streamed once without faults (the baseline run, first):

- **lost**: a baseline utterance that no logged final covers, or a logged final its
  client never received;
- **duplicated**: the same utterance id logged twice, or two logged finals of a source
  over the same audio (overlapping by more than 0.2 s);
- **close codes**: every connection's, each documented in docs/protocol.md or caused by
  the fault itself (1006 when the server died or the client cut it).

The server runs with a stand-in engine by default (`bench/fake_server.py`: the model's
time simulated, everything else real), because ten streams are several times what the
real model sustains on a 2-core CPU; `--engine model` runs `python -m server`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import numpy as np
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from bench.corpus import clips
from bench.processes import RedisProcess, ServerProcess, http_get

BYTES_PER_SECOND = 32_000
FRAME_BYTES = 6400  # 0.2 s of 16 kHz s16
GAP_S = 0.6  # silence between clips
DOCUMENTED = {1000, 1008, 1011, 1012, 1013, 4400, 4403, 4404, 4408, 4409, 4413, 4429}
FAULT_KINDS = ("abort", "half-open", "server kill", "redis restart")
FAULT_WEIGHTS = (0.35, 0.3, 0.2, 0.15)
HALF_OPEN_NOTICE_S = (1.0, 3.0)  # how long a client takes to give up on a silent path


def speech(seed: int, seconds: float) -> bytes:
    """Corpus clips in a seeded order, separated by silence, up to `seconds`."""
    pool = [c for c in clips() if c.language == "en"]
    random.Random(seed).shuffle(pool)
    parts: list[np.ndarray[Any, Any]] = []
    total = 0.0
    while total < seconds:
        for clip in pool:
            parts += [clip.audio(), np.zeros(int(GAP_S * 16_000), np.float32)]
            total += clip.duration + GAP_S
            if total >= seconds:
                break
    samples = np.concatenate(parts)[: int(seconds * 16_000)]
    pcm: bytes = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    return pcm


class Endpoint(Protocol):
    """Where streams connect: a server, or a balancer in front of several."""

    @property
    def ws_url(self) -> str: ...


@dataclass
class Socket:
    """One connection of a stream: what it received and how it ended."""

    ws: ClientConnection
    resumed: bool
    started_at: float | None = None  # monotonic time of its `session.started`
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    fate: str = "open"  # open, closed, aborted, half-open
    reader: asyncio.Task[None] | None = None  # the task reading it while it is current


@dataclass
class Stream:
    index: int
    server: Endpoint
    pcm: bytes
    speed: float
    meeting: str = ""
    headers: dict[str, str] | None = None  # e.g. an API key's Authorization
    # True: a live source, whose audio is due at its spoken time from the first connection
    # (a resumed connection sends its backlog at once); False: each connection paces
    # from where it resumes (bench/chaos)
    spoken_pace: bool = False
    began: float = 0.0
    token: str = ""
    last_seq: int = 0
    finals: dict[str, dict[str, Any]] = field(default_factory=dict)  # by utterance id
    sockets: list[Socket] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)
    ended: dict[str, Any] | None = None
    current: Socket | None = None
    arrived: dict[str, float] = field(default_factory=dict)  # final id -> monotonic time
    sent: list[tuple[int, float]] = field(default_factory=list)  # (end byte, monotonic)
    _interrupt: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.meeting = self.meeting or f"chaos-{self.index}"

    @property
    def live(self) -> bool:
        return self.current is not None and self.current.fate == "open"

    def abort(self) -> None:
        assert self.current is not None
        self.current.fate = "aborted"
        self.current.ws.transport.abort()
        self._interrupt.set()

    def go_half_open(self) -> None:
        assert self.current is not None
        self.current.fate = "half-open"
        self.current.ws.transport.pause_reading()  # reads nothing, answers no ping
        self._interrupt.set()

    async def run(self) -> None:
        delay = 0.2
        while self.ended is None:
            try:
                await self._connection()
                delay = 0.2
            except (OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as exc:
                # ConnectionClosed: the socket died between `session.started` and the
                # client's first send (a server killed then): resume again.
                self.refusals[type(exc).__name__] += 1
            if self.ended is None:
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    def _url(self) -> str:
        if not self.token:
            query = urlencode({"participant": f"p{self.index}"})
        else:
            query = urlencode({"resume_token": self.token, "last_seq": self.last_seq})
        return f"{self.server.ws_url}/v1/meetings/{self.meeting}/stream?{query}"

    async def _connection(self) -> None:
        ws = await connect(
            self._url(),
            open_timeout=5,
            close_timeout=2,
            ping_interval=None,
            max_size=None,
            additional_headers=self.headers,
        )
        sock = Socket(ws, resumed=bool(self.token))
        self.sockets.append(sock)
        self.current = sock
        self._interrupt.clear()
        receiver = asyncio.create_task(self.receive(sock))
        sock.reader = receiver
        try:
            started = await self._first(sock, receiver)
            if started is None:
                return
            start = started.get("send_from", started["resume_from"])
            if "send_from" in started:  # re-send the left context's audio too
                await ws.send(orjson.dumps({"type": "resend", "from": start}).decode())
            offset = round(start * 16_000) * 2
            sending = asyncio.create_task(self._send(ws, offset))
            interrupted = asyncio.create_task(self._interrupt.wait())
            await asyncio.wait({sending, receiver, interrupted}, return_when="FIRST_COMPLETED")
            for task in (sending, interrupted):
                task.cancel()
            if sock.fate == "half-open":
                await asyncio.sleep(random.uniform(*HALF_OPEN_NOTICE_S))
                receiver.cancel()  # the old socket stays open; `drain_stale` reads it later
                return
            if sending.done() and not sending.cancelled() and sending.exception() is None:
                await asyncio.wait_for(asyncio.shield(receiver), 60)
        finally:
            if sock.fate != "half-open":
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
                if sock.fate == "open":
                    sock.fate = "closed"
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ws.close(), 2)
            self.current = None

    async def _first(self, sock: Socket, receiver: asyncio.Task[None]) -> dict[str, Any] | None:
        async with asyncio.timeout(10):
            while not sock.messages and not receiver.done():  # noqa: ASYNC110 - a poll
                await asyncio.sleep(0.01)
        if not sock.messages or sock.messages[0]["type"] != "session.started":
            await asyncio.gather(receiver, return_exceptions=True)
            errors = [m.get("code") for m in sock.messages if m["type"] == "error"]
            self.refusals[str(errors[-1] if errors else sock.close_code)] += 1
            return None
        started = sock.messages[0]
        sock.started_at = time.monotonic()
        self.token = self.token or started["resume_token"]
        return started

    async def receive(self, sock: Socket) -> None:
        try:
            async for raw in sock.ws:
                message = orjson.loads(raw)
                sock.messages.append(message)
                if message["type"] == "transcript.final":
                    self.finals.setdefault(message["utterance_id"], message)
                    self.arrived.setdefault(message["utterance_id"], time.monotonic())
                    self.last_seq = max(self.last_seq, message["seq"])
                elif message["type"] == "session.ended" and message["reason"] == "stop":
                    self.ended = message
        except ConnectionClosed:
            pass
        sock.close_code = sock.ws.close_code

    async def _send(self, ws: ClientConnection, offset: int) -> None:
        started = time.monotonic()
        if self.spoken_pace:  # audio comes at the pace it was spoken: a backlog goes at once
            self.began = self.began or started
            started, offset_s = self.began, 0.0
        else:
            offset_s = offset / BYTES_PER_SECOND
        for at in range(offset, len(self.pcm), FRAME_BYTES):
            await ws.send(self.pcm[at : at + FRAME_BYTES])
            self.sent.append((at + FRAME_BYTES, time.monotonic()))
            if self.speed > 0:
                due = (at + FRAME_BYTES) / BYTES_PER_SECOND - offset_s
                wait = started + due / self.speed
                await asyncio.sleep(max(0.0, wait - time.monotonic()))
        await ws.send(orjson.dumps({"type": "stop"}).decode())


async def drain_stale(streams: list[Stream]) -> None:
    """Read what each half-open socket was sent, up to its close. Its own reader is
    stopped first: one that went half-open while its client waited for the last finals
    is still in `recv` (a second reader raises websockets' ConcurrencyError)."""

    async def read(sock: Socket) -> None:
        if sock.reader is not None:
            sock.reader.cancel()
            await asyncio.gather(sock.reader, return_exceptions=True)
        sock.ws.transport.resume_reading()
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            async with asyncio.timeout(10):
                async for raw in sock.ws:
                    sock.messages.append(orjson.loads(raw))
        sock.close_code = sock.ws.close_code
        sock.ws.transport.abort()

    stale = [s for stream in streams for s in stream.sockets if s.fate == "half-open"]
    await asyncio.gather(*(read(s) for s in stale))


def transcript(server: ServerProcess, meeting: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{server.http_url}/v1/meetings/{meeting}/transcript?format=json")
    if status != 200:
        raise RuntimeError(f"transcript of {meeting}: HTTP {status} {body[:200]!r}")
    finals: list[dict[str, Any]] = json.loads(body)["finals"]
    return finals


def overlap(a: dict[str, Any], b: dict[str, Any]) -> float:
    return float(min(a["end"], b["end"]) - max(a["start"], b["start"]))


def audit(
    stream: Stream, logged: list[dict[str, Any]], baseline: list[dict[str, Any]]
) -> dict[str, int]:
    ids = [f["utterance_id"] for f in logged]
    duplicated = len(ids) - len(set(ids))
    ordered = sorted(logged, key=lambda f: f["start"])
    duplicated += sum(overlap(a, b) > 0.2 for a, b in itertools.pairwise(ordered))
    uncovered = sum(
        not any(overlap(u, f) > 0.5 * (u["end"] - u["start"]) for f in logged) for u in baseline
    )
    undelivered = sum(f["utterance_id"] not in stream.finals for f in logged)
    seqs = sorted(f["seq"] for f in logged)
    gaps = sum(b - a - 1 for a, b in itertools.pairwise(seqs))
    return {
        "logged": len(logged),
        "baseline": len(baseline),
        "lost": uncovered + undelivered,
        "not_covered": uncovered,
        "not_delivered": undelivered,
        "duplicated": duplicated,
        "seq_gaps": gaps,
    }


async def faults(
    rng: random.Random,
    count: int,
    window_s: float,
    streams: list[Stream],
    server: ServerProcess,
    redis: RedisProcess,
) -> Counter[str]:
    done: Counter[str] = Counter()
    moments = sorted(rng.uniform(5.0, window_s) for _ in range(count))
    began = time.monotonic()
    for moment in moments:
        await asyncio.sleep(max(0.0, began + moment - time.monotonic()))
        kind = rng.choices(FAULT_KINDS, FAULT_WEIGHTS)[0]
        if kind in ("abort", "half-open"):
            while not (live := [s for s in streams if s.live]):
                if all(s.ended is not None for s in streams):
                    return done
                await asyncio.sleep(0.05)
            target = rng.choice(live)
            target.abort() if kind == "abort" else target.go_half_open()
        elif kind == "server kill":
            server.kill()
            await asyncio.sleep(rng.uniform(0.0, 1.0))
            await asyncio.to_thread(server.start)
        else:
            redis.kill()
            await asyncio.sleep(rng.uniform(0.2, 2.0))
            await asyncio.to_thread(redis.start)
        done[kind] += 1
        print(
            f"  {time.monotonic() - began:6.1f} s  fault {sum(done.values()):3d}: {kind}",
            flush=True,
        )
    return done


async def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="parley-chaos-"))
    redis = RedisProcess(work / "redis")
    redis.start()
    module = "bench.fake_server" if args.engine == "fake" else "server"
    env = {
        "PARLEY_REDIS_URL": redis.url,
        "PARLEY_LOG_LEVEL": "warning",
        "PARLEY_LOG_FORMAT": "text",
        "PARLEY_ADMIT_MAX_QUEUE_WAIT_MS": "0",
        "PARLEY_IDLE_TIMEOUT_S": "5",
        "PARLEY_WS_PING_INTERVAL_S": "3",
        "PARLEY_WS_PING_TIMEOUT_S": "3",
        "PARLEY_PARTIAL_INTERVAL_S": "0.8",
    }
    server = ServerProcess(module, env, work / "server.log")
    print(f"chaos: {args.streams} streams, {args.faults} faults, seed {args.seed}, "
          f"engine {args.engine}; logs in {work}", flush=True)  # fmt: skip
    server.start()
    seconds = args.window * args.speed + 30
    audio = [speech(args.seed * 100 + i, seconds) for i in range(args.streams)]
    try:
        print(f"baseline: {args.streams} streams of {seconds:.0f} s, no faults", flush=True)
        baseline = [
            Stream(i, server, pcm, speed=0.0, meeting=f"baseline-{args.seed}-{i}")
            for i, pcm in enumerate(audio)
        ]
        await asyncio.gather(*(s.run() for s in baseline))
        expected = [transcript(server, s.meeting) for s in baseline]
        print(f"chaos: {args.faults} faults over {args.window:.0f} s", flush=True)
        streams = [
            Stream(i, server, pcm, speed=args.speed, meeting=f"chaos-{args.seed}-{i}")
            for i, pcm in enumerate(audio)
        ]
        running = [asyncio.create_task(s.run()) for s in streams]
        struck = await faults(rng, args.faults, args.window, streams, server, redis)
        await asyncio.wait_for(asyncio.gather(*running), args.window * 4 + 300)
        await drain_stale(streams)
        audits = [
            audit(s, transcript(server, s.meeting), e)
            for s, e in zip(streams, expected, strict=True)
        ]
    finally:
        server.stop()
        redis.stop()
    return report(args, struck, streams, audits, work)


def report(
    args: argparse.Namespace,
    struck: Counter[str],
    streams: list[Stream],
    audits: list[dict[str, int]],
    work: Path,
) -> int:
    totals: Counter[str] = Counter()
    for item in audits:
        totals.update(item)
    closes: Counter[str] = Counter()
    for stream in streams:
        for sock in stream.sockets:
            if sock.fate == "aborted":
                closes["aborted by the client"] += 1
            else:
                closes[str(sock.close_code)] += 1
    undocumented = {
        code: n
        for code, n in closes.items()
        if code.isdigit() and int(code) not in DOCUMENTED and code != "1006"
    }
    ended = sum(s.ended is not None and s.sockets[-1].close_code == 1000 for s in streams)
    refusals: Counter[str] = Counter()
    for stream in streams:
        refusals.update(stream.refusals)
    summary = {
        "streams": args.streams,
        "faults": dict(struck),
        "finals_logged": totals["logged"],
        "baseline_utterances": totals["baseline"],
        "finals_lost": totals["lost"],
        "not_covered": totals["not_covered"],
        "not_delivered": totals["not_delivered"],
        "finals_duplicated": totals["duplicated"],
        "seq_gaps": totals["seq_gaps"],
        "connections": sum(len(s.sockets) for s in streams),
        "close_codes": dict(closes),
        "undocumented_close_codes": undocumented,
        "refused_connects": dict(refusals),
        "streams_ended_with_session_ended_and_1000": ended,
    }
    print(json.dumps(summary, indent=2))
    (work / "chaos.json").write_text(json.dumps(summary, indent=2))
    failed = (
        totals["lost"] or totals["duplicated"] or totals["seq_gaps"] or undocumented
        or ended != args.streams
    )  # fmt: skip
    print("FAIL" if failed else "PASS", f"(details in {work})")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--window", type=float, default=150.0, help="seconds faults strike in")
    parser.add_argument("--speed", type=float, default=2.0, help="x real time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine", choices=["fake", "model"], default="fake")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
