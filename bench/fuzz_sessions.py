"""Fuzzing of live sessions: seeded mutations of whole sessions against a running server.

    python -m bench.fuzz_sessions --inputs 100000 --seed 1     # bench.fake_server, in-process store
    python -m bench.fuzz_sessions --inputs 2000 --engine model --store redis
    python -m bench.fuzz_sessions --only 4711                  # replay one input

tests/e2e/test_fuzz.py fuzzes the shapes of single messages; this one mutates whole live
sessions. Each input is one session scenario drawn from `random.Random(SEED)` (SEED =
`--seed` + i): a protocol v1 stream of corpus speech into which control messages are
injected at wrong moments (resend twice or before audio, finalize during a resume,
configure/finalize/stop before audio, stop twice, text after stop), text and binary
interleaved, frames truncated (odd byte counts, empty); a resume of such a stream with a
mutated token, `last_seq` and `resend`; listeners with mutated `after_seq` opened and
closed at odd moments while a stream runs; and the compat sessions (Deepgram `/v1/listen`,
Flux `/v2/listen`, OpenAI `/v1/realtime`) with their control messages at wrong moments
and bad query parameters. `--concurrency` inputs run at once. Traffic goes to loopback only.

Checked for every input: no HTTP 5xx at a handshake, no close 1011 (nor an `internal`
error), every close code one docs/protocol.md documents, no traceback in the server's log,
and every socket closed within `--close-deadline-s` of the client's last act (the whole
input within `--input-deadline-s`). Every `--check-every` inputs, and at the end (after
the meetings' TTL, idle), the server's RSS, `parley_event_loop_tasks`, open streams and
listeners are compared with their idle start: streams and listeners must be back to 0,
tasks within `--task-tolerance`, the anonymous RSS within `--rss-tolerance-mib` of the
first checkpoint's (the first inputs warm the allocator and the code paths up).

Printed: a progress line every `--progress-every` inputs; written to
`REPORT_DIR/fuzz_sessions.json`: counts by scenario and by close code, the checkpoints,
and each failure with its seed, replayable with `--only SEED`. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from bench.processes import RedisProcess, ServerProcess
from loadgen.corpus import decode_clips, default_corpus_dir, load_manifest, select_clips

# Close codes the server may send (docs/protocol.md, Close codes and error codes; 1001 is
# the echo of a client's own going-away close).
DOCUMENTED_CLOSES = frozenset(
    {1000, 1001, 1003, 1007, 1008, 1009, 1012, 1013}
    | {4400, 4401, 4403, 4404, 4408, 4409, 4413, 4429}
)
CLIENT_CLOSE_CODES = (1000, 1001, 3000, 4000, 4999)
RATE = 16000
# Server messages counted per scenario: how far the mutated sessions got.
REACHED = frozenset(
    {"session.started", "transcript.final", "session.ended", "Results", "Metadata",
     "TurnInfo", "conversation.item.input_audio_transcription.completed", "ConfigureSuccess"}
)  # fmt: skip
SCENARIOS = ("stream", "resume", "listener", "deepgram", "flux", "openai")
WEIGHTS = (30, 25, 15, 12, 8, 10)
JUNK_TEXTS = (
    "",
    "null",
    "[]",
    "{}",
    '{"type": 1}',
    '{"type": "STOP"}',
    '{"type": "dance"}',
    '{"type": "stop"',
    "\x00",
    '{"type": "resend", "from": NaN}',
    '{"type": "resend", "from": 1e999}',
    '{"type": "resend", "from": 100000000000000000000000000000000}',
    '{"type": "resend", "from": -0}',
)


@dataclass
class Outcome:
    seed: int
    scenario: str
    closes: list[str] = field(default_factory=list)  # per socket: a close code or "refused NNN"
    failures: list[str] = field(default_factory=list)
    reached: list[str] = field(default_factory=list)  # what the server got to (counted)
    seconds: float = 0.0


@dataclass
class Context:
    """What every scenario shares: where the server is and the speech to send."""

    ws_url: str
    speech: list[bytes]  # 16 kHz mono s16le clips
    close_deadline_s: float
    connect_timeout_s: float = 10.0


class Socket:
    """One client connection: its reader collects the server's messages until the close;
    the checks are on what it saw and how it ended."""

    def __init__(self, ws: ClientConnection, name: str, outcome: Outcome) -> None:
        self.ws = ws
        self.name = name
        self.outcome = outcome
        self.messages: list[dict[str, Any]] = []
        self.client_closed = False  # the client started the close (or dropped the socket)
        self.aborted = False
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                if isinstance(raw, str):
                    try:
                        message = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        self.outcome.failures.append(f"{self.name}: a text frame not JSON")
                        continue
                    if isinstance(message, dict):
                        self.messages.append(message)
                        self._check_message(message)

    def _check_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind in REACHED and (kind != "session.started" or message.get("resumed")):
            self.outcome.reached.append("resumed" if kind == "session.started" else str(kind))
        code = message.get("code")
        error = message.get("error")
        if isinstance(error, dict):
            code = error.get("code")
        if message.get("type") in ("error", "Error") and message.get("variant"):
            code = message.get("variant")
        if code == "internal":
            self.outcome.failures.append(f"{self.name}: error internal: {str(message)[:300]}")

    @property
    def closed(self) -> bool:
        return self.reader.done()

    def first(self, kind: str) -> dict[str, Any] | None:
        return next((m for m in self.messages if m.get("type") == kind), None)

    async def wait_for(self, kind: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.closed:
            if (found := self.first(kind)) is not None:
                return found
            await asyncio.sleep(0.01)
        return self.first(kind)

    async def send(self, data: str | bytes) -> bool:
        """Send one frame; False once the connection is closing (the server ended it)."""
        try:
            await self.ws.send(data)
        except ConnectionClosed:
            return False
        return True

    async def close(self, code: int = 1000) -> None:
        self.client_closed = True
        with contextlib.suppress(ConnectionClosed, OSError):
            await asyncio.wait_for(self.ws.close(code), timeout=30)

    def abort(self) -> None:
        """Drop the TCP connection without a close frame (a laptop lid, a dead Wi-Fi)."""
        self.client_closed = self.aborted = True
        if self.ws.transport is not None:
            self.ws.transport.abort()

    async def finish(self, deadline_s: float) -> None:
        """Wait for the close within `deadline_s` (the server must end every session it
        was told to end), then check how it ended."""
        try:
            await asyncio.wait_for(asyncio.shield(self.reader), deadline_s)
        except TimeoutError:
            types = [m.get("type") for m in self.messages[-5:]]
            self.outcome.failures.append(
                f"{self.name}: not closed {deadline_s:g} s after the client's last act "
                f"(last messages {types})"
            )
            self.abort()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.reader, 5)
            return
        code = self.ws.close_code
        if self.aborted:
            self.outcome.closes.append("dropped")
            return
        self.outcome.closes.append(str(code))
        if code == 1011:
            self.outcome.failures.append(f"{self.name}: close 1011 {self.ws.close_reason!r}")
        elif code is None or code == 1006:
            self.outcome.failures.append(f"{self.name}: closed without a close frame")
        elif code not in DOCUMENTED_CLOSES and not self.client_closed:
            self.outcome.failures.append(f"{self.name}: undocumented close {code}")


async def open_socket(
    ctx: Context,
    outcome: Outcome,
    name: str,
    path: str,
    query: str = "",
    *,
    subprotocols: list[str] | None = None,
    headers: dict[str, str] | None = None,
) -> Socket | None:
    """Connect; None when the handshake is refused (a 5xx is a failure, a 4xx is not)."""
    url = f"{ctx.ws_url}{path}" + (f"?{query}" if query else "")
    try:
        ws = await connect(
            url,
            subprotocols=subprotocols,  # type: ignore[arg-type]
            additional_headers=headers,
            open_timeout=ctx.connect_timeout_s,
            ping_interval=None,
            max_size=None,
            compression=None,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        outcome.closes.append(f"refused {status}")
        if status >= 500:
            body = exc.response.body or b""
            outcome.failures.append(f"{name}: HTTP {status} at the handshake: {body[:200]!r}")
        return None
    except (InvalidHandshake, OSError, TimeoutError) as exc:
        outcome.failures.append(f"{name}: handshake failed: {type(exc).__name__} {exc}")
        return None
    return Socket(ws, name, outcome)


# -- what a scenario sends


def speech(rng: random.Random, ctx: Context, min_s: float = 0.3, max_s: float = 3.0) -> bytes:
    """A slice of a corpus clip, whole samples."""
    clip = rng.choice(ctx.speech)
    seconds = rng.uniform(min_s, max_s)
    length = min(len(clip), int(seconds * RATE) * 2)
    start = rng.randrange(0, max(1, len(clip) - length)) // 2 * 2
    return clip[start : start + length]


def frames(rng: random.Random, audio: bytes, mutate: float = 0.0) -> list[bytes]:
    """`audio` cut into frames of 10-200 ms; with probability `mutate` a frame is
    truncated (an odd byte count) or empty."""
    out: list[bytes] = []
    at = 0
    while at < len(audio):
        size = rng.randrange(160, 3200) * 2
        chunk = audio[at : at + size]
        at += size
        roll = rng.random()
        if roll < mutate / 2:
            chunk = chunk[: max(0, len(chunk) - 1 - 2 * rng.randrange(0, 4))] or b"\x00"
        elif roll < mutate:
            out.append(b"")
        out.append(chunk)
    return out


def control(rng: random.Random, kinds: tuple[str, ...]) -> str:
    """One protocol v1 text frame of a kind in `kinds`, its fields sometimes wrong."""
    kind = rng.choice(kinds)
    if kind == "junk":
        return rng.choice(JUNK_TEXTS)
    if kind == "configure_ok":
        terms: Any = rng.choice([[], ["Anya Petrova", "OAuth"], ["Kubernetes"]])
        return orjson.dumps({"type": "configure", "keyterms": terms}).decode()
    if kind == "configure":
        terms = rng.choice(
            [[], ["Anya Petrova", "OAuth"], ["x" * 101], [" "], "OAuth", None, [1, 2], ["k"] * 101]
        )
        return orjson.dumps({"type": "configure", "keyterms": terms}).decode()
    if kind == "resend":
        start: Any = rng.choice([0.0, 0.5, -1.0, 1e308, -1e308, "1", None, 3.0, 1e-9, 1e30])
        return orjson.dumps({"type": "resend", "from": start}).decode()
    if kind == "auth":
        return orjson.dumps(
            {"type": "auth", "token": rng.choice(["", "pmt_x", "x" * 300])}
        ).decode()
    return orjson.dumps({"type": kind}).decode()


# A rough input (ROUGH of them) also sends what ends a session early: junk, bad fields,
# bad parameters, truncated frames; the others send only well-formed messages, at wrong
# moments, so most of them get to the end of their session.
ROUGH = 0.35
V1_CONTROLS = ("finalize", "keepalive", "configure", "resend", "auth", "stop", "junk")
V1_MIDSTREAM = ("finalize", "finalize", "keepalive", "keepalive", "configure", "resend", "auth")
V1_GENTLE_FIRST = ("finalize", "keepalive", "configure_ok", "auth", "finalize", "stop")
V1_GENTLE = ("finalize", "finalize", "keepalive", "keepalive", "configure_ok")


async def play(
    rng: random.Random,
    sock: Socket,
    audio: list[bytes],
    texts: tuple[str, ...],
    text_of: Callable[[random.Random, tuple[str, ...]], str],
    *,
    text_rate: float,
    pace_s: float = 0.0,
) -> bool:
    """Send the frames, a text frame of `texts` between them now and then; False once
    the server closed."""
    for chunk in audio:
        if rng.random() < text_rate and not await sock.send(text_of(rng, texts)):
            return False
        if not await sock.send(chunk):
            return False
        if pace_s and rng.random() < 0.3:
            await asyncio.sleep(rng.uniform(0, pace_s))
    return True


async def end_v1(rng: random.Random, ctx: Context, sock: Socket) -> None:
    """The client's last act on a protocol v1 stream, then the wait for its close."""
    ending = rng.choices(
        [
            "stop",
            "stop_twice",
            "text_after_stop",
            "audio_after_stop",
            "close",
            "abort",
            "stop_close",
        ],
        weights=[40, 10, 10, 8, 15, 10, 7],
    )[0]
    stop = orjson.dumps({"type": "stop"}).decode()
    if ending == "abort":
        sock.abort()
    elif ending == "close":
        await sock.close(rng.choice(CLIENT_CLOSE_CODES))
    else:
        await sock.send(stop)
        if ending == "stop_twice":
            await sock.send(stop)
        elif ending == "text_after_stop":
            await sock.send(control(rng, V1_CONTROLS))
        elif ending == "audio_after_stop":
            await sock.send(b"\x00\x01" * rng.randrange(1, 800))
        elif ending == "stop_close":
            await asyncio.sleep(rng.uniform(0, 0.05))
            await sock.close(rng.choice(CLIENT_CLOSE_CODES))
    await sock.finish(ctx.close_deadline_s)


def stream_query(rng: random.Random, participant: str, rough: bool) -> str:
    """A stream's query string: valid, or (rough) now and then a bad or unusual parameter."""
    params: list[tuple[str, str]] = [("participant", participant)]
    if rng.random() < 0.3:
        params.append(("interim_results", rng.choice(["true", "false"] + ["maybe"] * rough)))
    if rough and rng.random() < 0.4:
        params.append(
            rng.choice(
                [
                    ("sample_rate", rng.choice(["16000", "8000", "48000", "7999", "abc", "-1"])),
                    ("encoding", rng.choice(["pcm_s16le", "pcm_f32le", "mulaw", ""])),
                    ("language", rng.choice(["en", "auto", "xx", "de", "EN"])),
                    ("channels", rng.choice(["1", "2", "0", "9"])),
                    ("keyterm", rng.choice(["OAuth", " ", "x" * 101])),
                    ("redact", rng.choice(["pci", "pii", "numbers"])),
                    ("turn_events", rng.choice(["true", "false"])),
                    ("turn_eager", rng.choice(["0.5", "2", "nan"])),
                    ("numerals", "true"),
                    ("participant", "bad id!"),
                ]
            )
        )
    return urlencode(params)


# -- the scenarios


async def scenario_stream(rng: random.Random, ctx: Context, outcome: Outcome) -> None:
    """A stream with controls before its audio and between its frames, frames truncated."""
    meeting = f"fz-{outcome.seed}"
    rough = rng.random() < ROUGH
    query = stream_query(rng, "ana", rough)
    sock = await open_socket(ctx, outcome, "stream", f"/v1/meetings/{meeting}/stream", query)
    if sock is None:
        return
    await sock.wait_for("session.started", ctx.connect_timeout_s)
    for _ in range(rng.choice([0, 0, 1, 2])):  # configure/finalize/stop/resend before audio
        if not await sock.send(control(rng, V1_CONTROLS if rough else V1_GENTLE_FIRST)):
            break
    mutate = rng.choice([0.0, 0.02, 0.1]) if rough else 0.0
    audio = frames(rng, speech(rng, ctx), mutate=mutate)
    kinds = V1_MIDSTREAM + ("junk",) * (rng.random() < 0.2) if rough else V1_GENTLE
    rate = rng.choice([0.0, 0.05, 0.3])
    await play(rng, sock, audio, kinds, control, text_rate=rate, pace_s=0.02)
    await end_v1(rng, ctx, sock)


def mutate_token(rng: random.Random, token: str, rough: bool) -> str:
    if not rough or rng.random() < 0.3 or not token:
        return token
    choices = [
        token[:-1],
        token + "x",
        token[::-1],
        "",
        "x" * rng.choice([1, 64, 5000]),
        token[:5] + ("A" if token[5:6] != "A" else "B") + token[6:],
        token.upper(),
        "%00" + token,
        "ünï",
    ]
    return rng.choice(choices)


def mutate_last_seq(rng: random.Random, last_seq: int, rough: bool) -> str | None:
    valid = [None, str(last_seq), "0", str(last_seq + 1), str(max(0, last_seq - 1)), "999999999999"]
    return rng.choice(valid + ["-1", "1e308", "abc", "1.5", ""] * rough)


async def scenario_resume(rng: random.Random, ctx: Context, outcome: Outcome) -> None:
    """A stream, then a resume of its source with a mutated token, `last_seq` and
    `resend` (twice, before the token's `send_from`, after audio, with a finalize
    inside the re-sent lead), sometimes while the first connection is still open."""
    meeting = f"fz-{outcome.seed}"
    first = await open_socket(
        ctx, outcome, "first", f"/v1/meetings/{meeting}/stream", "participant=ana"
    )
    if first is None:
        return
    started = await first.wait_for("session.started", ctx.connect_timeout_s)
    lead = speech(rng, ctx, 1.0, 4.0)
    await play(rng, first, frames(rng, lead), ("finalize",), control, text_rate=0.05)
    how = rng.choice(["stop", "abort", "open", "finalize_open"])
    if how == "stop":
        await end_v1(random.Random(0), ctx, first)  # a plain stop
    elif how == "abort":
        first.abort()
        await first.finish(ctx.close_deadline_s)
    elif how == "finalize_open":
        await first.send(control(rng, ("finalize",)))
        await first.wait_for("transcript.final", 2.0)
    token = str((started or {}).get("resume_token", ""))
    last_seq = max([int(m.get("seq", 0)) for m in first.messages if "seq" in m] + [0])
    rough = rng.random() < ROUGH
    params: list[tuple[str, str]] = [("resume_token", mutate_token(rng, token, rough))]
    if (seq := mutate_last_seq(rng, last_seq, rough)) is not None:
        params.append(("last_seq", seq))
    if rng.random() < 0.2:
        params.append(("participant", rng.choice(["ana", "bo"] if rough else ["ana"])))
    target = meeting if not rough or rng.random() < 0.7 else f"fz-{outcome.seed}-other"
    second = await open_socket(
        ctx, outcome, "resume", f"/v1/meetings/{target}/stream", urlencode(params)
    )
    if second is not None:
        resumed = await second.wait_for("session.started", ctx.connect_timeout_s) or {}
        send_from = float(resumed.get("send_from", resumed.get("resume_from", 0.0)) or 0.0)
        resume_from = float(resumed.get("resume_from", 0.0) or 0.0)
        plans = ["resend", "resend_twice", "no_resend", "resend_bad", "resend_after_audio",
                 "finalize_in_resend", "controls_first"]  # fmt: skip
        plan = rng.choice(plans)
        good = orjson.dumps(
            {"type": "resend", "from": rng.uniform(send_from, resume_from)}
        ).decode()
        tail = speech(rng, ctx, 0.5, 3.0)
        if plan in ("resend", "resend_twice", "finalize_in_resend"):
            await second.send(good)
            if plan == "resend_twice":
                await second.send(good)
        elif plan == "resend_bad":
            await second.send(control(rng, ("resend",)) if rough else good)
        elif plan == "controls_first":
            for _ in range(rng.randrange(1, 4)):
                await second.send(control(rng, V1_CONTROLS if rough else V1_GENTLE_FIRST))
        lead_again = lead[: int(max(0.0, resume_from - send_from) * RATE) * 2]
        audio = frames(rng, lead_again + tail, 0.02 if rough else 0.0)
        for index, chunk in enumerate(audio):
            if plan == "finalize_in_resend" and index == len(audio) // 3:
                await second.send(control(rng, ("finalize",)))
            if plan == "resend_after_audio" and index == 1:
                await second.send(good)
            if not await second.send(chunk):
                break
        await end_v1(rng, ctx, second)
    if not first.closed:  # still open: a resume took it over (4409), or the token was bad
        await end_v1(rng, ctx, first)
    else:
        await first.finish(ctx.close_deadline_s)


async def scenario_listener(rng: random.Random, ctx: Context, outcome: Outcome) -> None:
    """A stream with listeners (mutated `after_seq`) opened before, during and after it
    and closed at odd moments, some of them sending what a listener must not."""
    meeting = f"fz-{outcome.seed}"
    rough = rng.random() < ROUGH
    listeners: list[Socket] = []

    async def listen(name: str) -> None:
        valid = ["0", "0", "1", "2", "999999999"]
        after = rng.choice(valid + ["-1", "1e308", "abc", "", "nan"] * rough)
        query = "" if rng.random() < 0.2 else urlencode({"after_seq": after})
        sock = await open_socket(ctx, outcome, name, f"/v1/meetings/{meeting}/events", query)
        if sock is not None:
            listeners.append(sock)
            if rough and rng.random() < 0.3:
                wrong: list[str | bytes] = [b"\x00\x00", b"", '{"type":"keepalive"}', "junk"]
                await sock.send(rng.choice(wrong))

    async def close_one() -> None:
        open_ones = [s for s in listeners if not s.client_closed]
        if open_ones:
            sock = rng.choice(open_ones)
            if rng.random() < 0.3:
                sock.abort()
            else:
                await sock.close(rng.choice(CLIENT_CLOSE_CODES))

    for index in range(rng.randrange(0, 3)):
        await listen(f"listener-before-{index}")
    stream = await open_socket(
        ctx, outcome, "stream", f"/v1/meetings/{meeting}/stream", "participant=ana"
    )
    if stream is not None:
        await stream.wait_for("session.started", ctx.connect_timeout_s)
        audio = frames(rng, speech(rng, ctx, 1.0, 4.0))
        for index, chunk in enumerate(audio):
            roll = rng.random()
            if roll < 0.05:
                await listen(f"listener-during-{index}")
            elif roll < 0.08:
                await close_one()
            elif roll < 0.12:
                await stream.send(control(rng, ("finalize",)))
            if not await stream.send(chunk):
                break
        await end_v1(rng, ctx, stream)
    for index in range(rng.randrange(0, 2)):
        await listen(f"listener-after-{index}")
    await asyncio.sleep(rng.uniform(0, 0.1))
    for sock in listeners:
        if not sock.client_closed and not sock.closed:
            if rng.random() < 0.3:
                sock.abort()
            else:
                await sock.close(rng.choice(CLIENT_CLOSE_CODES))
        await sock.finish(ctx.close_deadline_s)


DEEPGRAM_PARAMS = (
    ("encoding", ("linear16", "mulaw", "opus", "")),
    ("sample_rate", ("16000", "8000", "48000", "7999", "abc")),
    ("channels", ("1", "2", "0", "21")),
    ("multichannel", ("true", "false")),
    ("interim_results", ("true", "false", "yes")),
    ("punctuate", ("true", "false")),
    ("smart_format", ("true",)),
    ("redact", ("pci", "pii", "false", "aggressive_numbers")),
    ("language", ("en", "en-US", "multi", "xx", "")),
    ("vad_events", ("true",)),
    ("utterance_end_ms", ("1000", "0", "-5", "60001", "abc")),
    ("endpointing", ("false", "300", "abc")),
    ("keyterm", ("OAuth", " ", "x" * 101)),
    ("keywords", ("OAuth:2", "OAuth:-5", "OAuth:x")),
    ("callback", ("http://127.0.0.1:1/",)),
    ("diarize", ("false",)),
    ("meeting_id", ("bad id!",)),
)


def deepgram_control(rng: random.Random, kinds: tuple[str, ...]) -> str:
    kind = rng.choice(kinds)
    if kind == "Configure_ok":
        terms: Any = rng.choice([[], ["OAuth"], None])
        return orjson.dumps({"type": "Configure", "keyterms": terms}).decode()
    if kind == "Configure":
        terms = rng.choice([[], ["OAuth"], ["x" * 101], "OAuth", None, [1], ["k"] * 101])
        return orjson.dumps({"type": "Configure", "keyterms": terms}).decode()
    if kind == "junk":
        return rng.choice((*JUNK_TEXTS, '{"type": "Finalize", "x": 1}'))
    return orjson.dumps({"type": kind}).decode()


async def scenario_deepgram(rng: random.Random, ctx: Context, outcome: Outcome) -> None:
    """Deepgram `/v1/listen`: Finalize, KeepAlive, Configure, CloseStream at wrong moments
    (before audio, twice, text after CloseStream), bad query parameters, empty frames."""
    params = [("meeting_id", f"fz-{outcome.seed}")]
    rough = rng.random() < ROUGH
    for name, values in rng.sample(DEEPGRAM_PARAMS, rng.choice([1, 1, 2, 3]) if rough else 0):
        params.append((name, rng.choice(values)))
    if not rough and rng.random() < 0.5:
        params.append(("interim_results", "true"))
    sock = await open_socket(ctx, outcome, "deepgram", "/v1/listen", urlencode(params))
    if sock is None:
        return
    configure = "Configure" if rough else "Configure_ok"
    kinds = ("Finalize", "KeepAlive", configure, "Finalize", "KeepAlive") + ("junk",) * (
        rough and rng.random() < 0.15
    )
    for _ in range(rng.choice([0, 0, 1, 2])):
        await sock.send(deepgram_control(rng, kinds + ("CloseStream",) * (rng.random() < 0.2)))
    audio = frames(rng, speech(rng, ctx), mutate=rng.choice([0.0, 0.05]) if rough else 0.0)
    await play(rng, sock, audio, kinds, deepgram_control, text_rate=rng.choice([0.0, 0.1, 0.3]))
    endings = ["close_stream", "close_stream_twice", "empty_frame", "text_after", "close", "abort"]
    await end_deepgram(rng, ctx, sock, kinds, endings)


async def scenario_flux(rng: random.Random, ctx: Context, outcome: Outcome) -> None:
    """Deepgram Flux `/v2/listen`: ForceEndTurn, Configure, CloseStream at wrong moments."""
    params = [("meeting_id", f"fz-{outcome.seed}")]
    if rng.random() < 0.9:
        params.append(
            ("model", rng.choice(["flux-general-en", "flux-general-en", "flux-general-multi", ""]))
        )
    extra = [
        ("eot_threshold", ("0.7", "0.2", "abc")),
        ("eager_eot_threshold", ("0.4", "0.95", "nan")),
        ("eot_timeout_ms", ("1000", "100", "99999")),
        ("encoding", ("linear16", "mulaw")),
        ("sample_rate", ("16000", "7999")),
        ("keyterm", ("OAuth", "x" * 101)),
    ]
    rough = rng.random() < ROUGH
    for name, values in rng.sample(extra, rng.choice([1, 1, 2]) if rough else 0):
        params.append((name, rng.choice(values)))
    sock = await open_socket(ctx, outcome, "flux", "/v2/listen", urlencode(params))
    if sock is None:
        return
    kinds = ("ForceEndTurn", "Configure", "KeepAlive", "ForceEndTurn") + ("junk",) * (
        rough and rng.random() < 0.2
    )
    for _ in range(rng.choice([0, 0, 1, 2])):
        await sock.send(deepgram_control(rng, kinds))
    audio = frames(rng, speech(rng, ctx), mutate=rng.choice([0.0, 0.05]) if rough else 0.0)
    await play(rng, sock, audio, kinds, deepgram_control, text_rate=rng.choice([0.0, 0.1, 0.3]))
    endings = ["close_stream", "close_stream_twice", "text_after", "close", "abort"]
    await end_deepgram(rng, ctx, sock, kinds, endings)


async def end_deepgram(
    rng: random.Random, ctx: Context, sock: Socket, kinds: tuple[str, ...], endings: list[str]
) -> None:
    """End a Deepgram-protocol socket (`/v1/listen`, Flux) one of `endings`' ways, then wait
    for its close."""
    ending = rng.choice(endings)
    if ending == "abort":
        sock.abort()
    elif ending == "close":
        await sock.close(rng.choice(CLIENT_CLOSE_CODES))
    elif ending == "empty_frame":
        await sock.send(b"")
    else:
        await sock.send('{"type": "CloseStream"}')
        if ending == "close_stream_twice":
            await sock.send('{"type": "CloseStream"}')
        elif ending == "text_after":
            await sock.send(deepgram_control(rng, kinds))
    await sock.finish(ctx.close_deadline_s)


def to_24k(audio: bytes) -> bytes:
    samples = np.frombuffer(audio, dtype="<i2").astype(np.float32)
    if samples.size < 2:
        return audio
    t = np.arange(0, samples.size, 16000 / 24000)
    resampled: bytes = np.interp(t, np.arange(samples.size), samples).astype("<i2").tobytes()
    return resampled


OPENAI_INPUTS: tuple[Any, ...] = (
    {},
    {"format": {"type": "audio/pcm", "rate": 24000}},
    {"format": {"type": "audio/pcm", "rate": 16000}},
    {"format": {"type": "audio/pcmu"}},
    {"format": "pcm16"},
    {"transcription": {"language": "en", "prompt": "OAuth, Kubernetes"}},
    {"transcription": {"language": "xx"}},
    {"transcription": {"language": ["en"], "model": 5}},
    {"transcription": {"prompt": ",".join(["k"] * 200)}},
    {"transcription": "en"},
    {"turn_detection": None},
    {"turn_detection": {"type": "semantic_vad", "eagerness": "wild"}},
    {"turn_detection": {"type": "semantic_vad", "eagerness": ["low"]}},
    {"turn_detection": {"type": "server_vad", "silence_duration_ms": -1}},
    {"turn_detection": "x"},
    "x",
    ["input"],
)
OPENAI_SESSIONS: tuple[Any, ...] = (
    {"type": "transcription"},
    {"type": "realtime"},
    {"audio": "x"},
    {"audio": ["x"]},
    {"input_audio_format": "g711_ulaw"},
    {"input_audio_format": ["pcm16"], "input_audio_transcription": "x"},
    {"input_audio_transcription": {"language": "en"}, "turn_detection": 5},
    "x",
    None,
    [],
)


def openai_event(rng: random.Random, kinds: tuple[str, ...]) -> str:
    kind = rng.choice(kinds)
    if kind == "session.update_ok":
        audio_in = rng.choice(OPENAI_INPUTS[:2] + OPENAI_INPUTS[5:6] + OPENAI_INPUTS[10:11])
        session = {"type": "transcription", "audio": {"input": audio_in}}
        return orjson.dumps({"type": "session.update", "session": session}).decode()
    if kind == "session.update":
        session = {"type": "transcription", "audio": {"input": rng.choice(OPENAI_INPUTS)}}
        if rng.random() < 0.15:
            session = rng.choice(OPENAI_SESSIONS)
        return orjson.dumps({"type": "session.update", "session": session}).decode()
    if kind == "append_bad":
        audio = rng.choice(["!!!not base64!!!", "AAA", "", "A" * 3, "====", "AAAA" * 3 + "A"])
        return orjson.dumps({"type": "input_audio_buffer.append", "audio": audio}).decode()
    if kind == "append_none":
        return orjson.dumps({"type": "input_audio_buffer.append"}).decode()
    if kind == "junk":
        return rng.choice((*JUNK_TEXTS, '{"type": "response.create"}'))
    return orjson.dumps({"type": kind}).decode()


async def scenario_openai(rng: random.Random, ctx: Context, outcome: Outcome) -> None:
    """OpenAI `/v1/realtime`: session.update before and after audio, appends with bad
    base64, commit and clear at wrong moments (before audio, twice), binary frames."""
    rough = rng.random() < ROUGH
    intent = "conversation" if rough and rng.random() < 0.1 else "transcription"
    params = [("intent", intent), ("meeting_id", f"fz-{outcome.seed}")]
    headers = {"OpenAI-Beta": "realtime=v1"} if rng.random() < 0.3 else None
    sock = await open_socket(
        ctx, outcome, "openai", "/v1/realtime", urlencode(params), headers=headers
    )
    if sock is None:
        return
    kinds: tuple[str, ...] = (
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "session.update",
        "transcription_session.update",
        "input_audio_buffer.commit",
    )
    bad: tuple[str, ...] = ("append_bad", "append_none", "junk")
    if not rough:
        kinds = ("input_audio_buffer.commit", "input_audio_buffer.clear", "session.update_ok")
        bad = ()
    for _ in range(rng.choice([0, 1, 2])):
        await sock.send(openai_event(rng, kinds + bad * (rng.random() < 0.2)))
    audio = to_24k(speech(rng, ctx))
    at, text_rate = 0, rng.choice([0.0, 0.1, 0.3])
    while at < len(audio):
        size = rng.randrange(240, 4800) * 2
        chunk = audio[at : at + size]
        at += size
        if rng.random() < text_rate:
            extra = openai_event(rng, kinds + bad * (rng.random() < 0.1))
            if not await sock.send(extra):
                break
        if rough and rng.random() < 0.03:
            payload: str | bytes = chunk  # a binary frame: not how OpenAI's protocol sends audio
        else:
            encoded = base64.b64encode(chunk).decode()
            payload = orjson.dumps({"type": "input_audio_buffer.append", "audio": encoded}).decode()
        if not await sock.send(payload):
            break
    if rng.random() < 0.5:
        await sock.send(openai_event(rng, ("input_audio_buffer.commit",)))
        await sock.wait_for("conversation.item.input_audio_transcription.completed", 1.0)
    if rng.random() < 0.25:
        sock.abort()
    else:
        await sock.close(rng.choice(CLIENT_CLOSE_CODES))
    await sock.finish(ctx.close_deadline_s)


RUNNERS: dict[str, Callable[[random.Random, Context, Outcome], Awaitable[None]]] = {
    "stream": scenario_stream,
    "resume": scenario_resume,
    "listener": scenario_listener,
    "deepgram": scenario_deepgram,
    "flux": scenario_flux,
    "openai": scenario_openai,
}


def draw_scenario(rng: random.Random) -> str:
    """An input's scenario: the first draw of its `random.Random(seed)`."""
    return rng.choices(SCENARIOS, weights=WEIGHTS)[0]


async def run_input(seed: int, ctx: Context, input_deadline_s: float) -> Outcome:
    rng = random.Random(seed)
    scenario = draw_scenario(rng)
    outcome = Outcome(seed, scenario)
    started = time.monotonic()
    try:
        async with asyncio.timeout(input_deadline_s):
            await RUNNERS[scenario](rng, ctx, outcome)
    except TimeoutError:
        outcome.failures.append(f"the input did not end within {input_deadline_s:g} s")
    outcome.seconds = round(time.monotonic() - started, 3)
    return outcome


# -- the server and what is checked of it


@dataclass
class Checkpoint:
    inputs: int
    rss_mib: float
    anon_mib: float
    tasks: int
    sessions: int
    listeners: int


def checkpoint(server: ServerProcess, inputs: int) -> Checkpoint:
    metrics = server.metrics()
    return Checkpoint(
        inputs=inputs,
        rss_mib=round(server.rss_bytes() / 2**20, 2),
        anon_mib=round(server.rss_anon_bytes() / 2**20, 2),
        tasks=int(metrics.get("parley_event_loop_tasks", -1)),
        sessions=int(metrics.get("parley_active_sessions", -1)),
        listeners=int(metrics.get("parley_listeners", -1)),
    )


async def settle(server: ServerProcess, timeout: float = 30.0) -> Checkpoint:
    """The checkpoint once no stream or listener is open (or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while True:
        point = await asyncio.to_thread(checkpoint, server, 0)
        if (point.sessions == 0 and point.listeners == 0) or time.monotonic() > deadline:
            return point
        await asyncio.sleep(0.2)


class LogWatch:
    """The server log's new lines since the last look: tracebacks are failures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def tracebacks(self) -> list[str]:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            new = log.read()
        self.offset += len(new)
        found = []
        for line in new.decode(errors="replace").splitlines():
            if line.startswith("Traceback (most recent call last)"):
                found.append(line)
            elif '"traceback"' in line:
                try:
                    entry = json.loads(line)
                    found.append(f"{entry['message']}: ...{entry['traceback'][-1500:]}")
                except (ValueError, KeyError, TypeError):
                    found.append(line[-2000:])
        return found


def resource_failures(idle: Checkpoint, warm: Checkpoint | None, now: Checkpoint,
                      args: argparse.Namespace) -> list[str]:  # fmt: skip
    failures = []
    if now.sessions != 0 or now.listeners != 0:
        failures.append(f"{now.sessions} streams and {now.listeners} listeners still open")
    if now.tasks > idle.tasks + args.task_tolerance:
        failures.append(f"{now.tasks} asyncio tasks, {idle.tasks} at the idle start")
    if warm is not None and now.anon_mib > warm.anon_mib + args.rss_tolerance_mib:
        failures.append(
            f"anonymous RSS {now.anon_mib} MiB, {warm.anon_mib} MiB at the first checkpoint "
            f"(tolerance {args.rss_tolerance_mib} MiB)"
        )
    return failures


async def fuzz(args: argparse.Namespace, server: ServerProcess, ctx: Context) -> dict[str, Any]:
    seeds = list(args.only) if args.only else [args.seed + i for i in range(args.inputs)]
    log = LogWatch(server.log_path)
    idle = await asyncio.to_thread(checkpoint, server, 0)
    points: list[Checkpoint] = []
    failures: list[dict[str, Any]] = []
    by_scenario: Counter[str] = Counter()
    by_close: Counter[str] = Counter()
    by_scenario_close: dict[str, Counter[str]] = {}
    by_scenario_reached: dict[str, Counter[str]] = {}
    done = 0
    started = time.monotonic()
    stop_at = started + args.max_minutes * 60 if args.max_minutes else float("inf")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for seed in seeds:
        queue.put_nowait(seed)
    in_flight: set[int] = set()
    recent: list[int] = []

    def record(outcome: Outcome) -> None:
        by_scenario[outcome.scenario] += 1
        by_close.update(outcome.closes)
        by_scenario_close.setdefault(outcome.scenario, Counter()).update(outcome.closes)
        reached = by_scenario_reached.setdefault(outcome.scenario, Counter())
        reached.update(set(outcome.reached))  # inputs that got there
        if outcome.failures:
            failures.append(asdict(outcome))
            print(f"FAIL seed {outcome.seed} ({outcome.scenario}): {outcome.failures}", flush=True)

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            try:
                seed = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            in_flight.add(seed)
            outcome = await run_input(seed, ctx, args.input_deadline_s)
            in_flight.discard(seed)
            record(outcome)
            recent.append(seed)
            done += 1
            if tracebacks := log.tracebacks():
                suspects = sorted(set(recent[-args.concurrency :]) | in_flight)
                failures.append({"seed": None, "suspects": suspects, "tracebacks": tracebacks[:5]})
                print(f"FAIL traceback in the server log; seeds {suspects}: {tracebacks[0][:500]}",
                      flush=True)  # fmt: skip
            del recent[: -args.concurrency]
            if done % args.progress_every == 0:
                rate = done / (time.monotonic() - started)
                print(f"{done}/{len(seeds)} inputs, {rate:.1f}/s, {len(failures)} failures, "
                      f"closes {dict(by_close.most_common(8))}", flush=True)  # fmt: skip

    async def checker() -> None:
        next_at = args.check_every
        while True:
            await asyncio.sleep(0.5)
            if done >= next_at:
                next_at += args.check_every
                point = await asyncio.to_thread(checkpoint, server, done)
                points.append(point)
                print(f"checkpoint {asdict(point)}", flush=True)

    check_task = asyncio.create_task(checker())
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    check_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await check_task
    elapsed = time.monotonic() - started
    # Idle again: every session closed, the meetings past their TTL (one last tiny input
    # touches the store so the in-process store sweeps them), then the final figures.
    await asyncio.sleep(args.ttl_s + 2 if not args.only else 0)
    await run_input(args.seed, ctx, args.input_deadline_s)
    end = await settle(server)
    end.inputs = done
    warm = points[0] if points else None
    leaks = resource_failures(idle, warm, end, args)
    if tracebacks := log.tracebacks():
        failures.append({"seed": None, "suspects": [], "tracebacks": tracebacks[:5]})
    return {
        "inputs": done,
        "seconds": round(elapsed, 1),
        "per_second": round(done / elapsed, 2) if elapsed else 0.0,
        "by_scenario": dict(by_scenario),
        "by_close": dict(by_close.most_common()),
        "by_scenario_close": {k: dict(v.most_common()) for k, v in by_scenario_close.items()},
        "by_scenario_reached": {k: dict(v.most_common()) for k, v in by_scenario_reached.items()},
        "idle_start": asdict(idle),
        "checkpoints": [asdict(p) for p in points],
        "idle_end": asdict(end),
        "resource_failures": leaks,
        "failures": failures,
    }


def load_speech(corpus: Path, clips: int) -> list[bytes]:
    chosen = select_clips(load_manifest(corpus), "en", 20.0)[:clips]
    return [samples.astype("<i2").tobytes() for samples in decode_clips(chosen).values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", type=int, action="append", help="replay this input seed")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--engine", choices=["fake", "model"], default="fake")
    parser.add_argument("--store", choices=["memory", "redis"], default="memory")
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--close-deadline-s", type=float, default=15.0)
    parser.add_argument("--input-deadline-s", type=float, default=60.0)
    parser.add_argument("--check-every", type=int, default=5000)
    parser.add_argument("--progress-every", type=int, default=500)
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="stop drawing inputs after this long (0: never)",
    )
    parser.add_argument("--ttl-s", type=float, default=20.0, help="the server's meeting TTL")
    parser.add_argument("--rss-tolerance-mib", type=float, default=48.0)
    parser.add_argument("--task-tolerance", type=int, default=4)
    parser.add_argument("--report-dir", type=Path, default=Path("reports/fuzz_sessions"))
    args = parser.parse_args(argv)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    speech_clips = load_speech(args.corpus or default_corpus_dir(), 8)
    with tempfile.TemporaryDirectory(prefix="parley-fuzz-") as tmp:
        redis: RedisProcess | None = None
        env = {"PARLEY_MEETING_TTL_S": str(args.ttl_s), "PARLEY_LOG_FORMAT": "json"}
        if args.store == "redis":
            redis = RedisProcess(Path(tmp) / "redis", persistent=False)
            redis.start()
            env["PARLEY_REDIS_URL"] = redis.url
        server = ServerProcess(
            "server" if args.engine == "model" else "bench.fake_server",
            env,
            args.report_dir / "server.log",
        )
        server.log_path.unlink(missing_ok=True)
        try:
            server.start()
            ctx = Context(server.ws_url, speech_clips, args.close_deadline_s)
            report = asyncio.run(fuzz(args, server, ctx))
        finally:
            server.stop()
            if redis is not None:
                redis.stop()
    report |= {"seed": args.seed, "engine": args.engine, "store": args.store,
               "concurrency": args.concurrency}  # fmt: skip
    (args.report_dir / "fuzz_sessions.json").write_text(json.dumps(report, indent=1))
    summary = {
        k: report[k]
        for k in ("inputs", "seconds", "per_second", "by_scenario", "idle_start", "idle_end")
    }
    print(json.dumps(summary))
    print(f"by close: {report['by_close']}")
    for leak in report["resource_failures"]:
        print(f"FAIL {leak}")
    report_path = args.report_dir / "fuzz_sessions.json"
    print(f"{len(report['failures'])} failing inputs; report: {report_path}")
    return 1 if report["failures"] or report["resource_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
