"""Fuzzing with hypothesis against running servers: generated client message sequences
(binary frames of any length, odd byte counts, NaN/Inf floats, oversize frames, invalid
UTF-8, invalid or huge or deep JSON, unknown types, controls in the wrong state, floods,
bad query strings, bad credentials). Every case must end in its documented close code
(predicted by a model of the protocol) or continue correctly; the server never fails
(1011, a traceback) and a healthy room streaming alongside keeps a correct transcript."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, get_args, get_type_hints
from urllib.parse import urlencode

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.wer import error_rate
from tests.support.appserver import AppServer, serve_app
from tests.support.corpus import clip
from tests.support.hardclient import RawText, bearer, exchange
from tests.support.servers import ServerProcess
from tests.support.wsclient import StreamResult, stream_pcm
from wire.messages import ServerMessage

# The clients and servers beside the generator (a real-time room on another thread, the
# in-process app) send WebSocket keepalive pings whose payload websockets and uvicorn draw
# from the global `random` module. When a ping lands while hypothesis draws an example,
# hypothesis takes it for a strategy using `random` and warns (an error under
# filterwarnings=error). The strategies here use no global randomness.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies"
    ":hypothesis.errors.HypothesisDeprecationWarning"
)

MAX_FRAME = 1 << 20  # PARLEY_MAX_FRAME_BYTES default (the session server's)
CASES_PER_EXAMPLE = 4  # run concurrently, each on its own connection
EXAMPLES = int(os.environ.get("PARLEY_FUZZ_EXAMPLES", "500"))  # x4 cases: about a minute
CONTROL_TYPES = ["finalize", "keepalive", "stop", "auth"]
# Every server message type the protocol module declares (its TypedDicts' `type`).
SERVER_TYPES = {get_args(get_type_hints(message)["type"])[0] for message in get_args(ServerMessage)}
DEEP = "[" * 5000 + "]" * 5000
HUGE_JSON = orjson.dumps({"type": "keepalive", "pad": "x" * 900_000}).decode()
ODD_TEXTS = [
    DEEP,
    HUGE_JSON,
    "",
    " ",
    "null",
    "[]",
    '"stop"',
    "NaN",
    "1e999",
    '{"type": 1}',
    '{"type": null}',
    '{"type": ["stop"]}',
    '{"type": "STOP"}',
    '{"type": "stop"',
    '{"type": "stop", "x": NaN}',
    '{"type": "finalize", "type": "dance"}',
    '{"type": "\\u0000"}',
    "\x00\x01\x02",
    "\ud7ff\ue000 é ☃ 𝄞",
]


@dataclass
class Tally:
    cases: int = 0
    messages: int = 0
    outcomes: dict[int, int] = field(default_factory=dict)
    slowest: list[tuple[float, str]] = field(default_factory=list)

    def add(self, close_code: int | None, sent: int, took: float = 0.0, what: str = "") -> None:
        self.cases += 1
        self.messages += sent
        key = -1 if close_code is None else close_code
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.slowest = sorted([*self.slowest, (took, what)], reverse=True)[:5]


# ---------------------------------------------------------------- strategies

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)
controls = st.builds(
    lambda kind, extra: orjson.dumps({"type": kind, **extra}).decode(),
    st.sampled_from(CONTROL_TYPES),
    st.dictionaries(st.sampled_from(["token", "x", "type2"]), json_values, max_size=2),
)
odd_texts = st.one_of(
    st.builds(lambda v: orjson.dumps(v).decode(), json_values),
    st.builds(lambda t: orjson.dumps({"type": t}).decode(), st.text(max_size=30)),
    st.text(max_size=64),
    st.integers(0, len(ODD_TEXTS) - 1).map(lambda i: ODD_TEXTS[i]),
)
texts = st.integers(0, 9).flatmap(lambda i: controls if i < 6 else odd_texts)
audio_action = st.tuples(
    st.just("audio"),
    st.integers(0, 3).flatmap(
        lambda i: st.integers(0, 9600) if i == 0 else st.integers(0, 2400).map(lambda n: 4 * n)
    ),
    st.sampled_from(["zero", "zero", "quiet", "quiet", "quiet", "loud", "speech"]),
    st.integers(0, 2**31),
)
ACTION_KINDS = [
    (1, st.tuples(st.just("oversize"), st.sampled_from(["binary", "text"]))),
    (1, st.tuples(st.just("protocol"), st.sampled_from(["bad_utf8"] * 3 + ["binary_4mib"]))),
    (2, st.tuples(st.just("flood"), st.integers(20, 300), st.sampled_from(["keepalive", "audio"]))),
    (8, audio_action),
    (8, st.tuples(st.just("text"), texts)),
]
# Weighted: oversize and protocol-level breakage end a case at once, so they stay rare.
actions = st.integers(0, sum(w for w, _ in ACTION_KINDS) - 1).flatmap(
    lambda i: next(s for s, edge in _edges(ACTION_KINDS) if i < edge)
)


def _edges(kinds: list[tuple[int, Any]]) -> Iterator[tuple[Any, int]]:
    edge = 0
    for weight, strategy in kinds:
        edge += weight
        yield strategy, edge


good_params = st.fixed_dictionaries(
    {},
    optional={
        "participant": st.sampled_from(["ana", "bot-1", "x" * 128, "A.b_c-9"]),
        "sample_rate": st.sampled_from([8000, 16000, 22050, 44100, 48000]),
        "encoding": st.sampled_from(["pcm_s16le", "pcm_f32le"]),
        "language": st.sampled_from(["en", "auto"]),
        "interim_results": st.sampled_from(["true", "false", "0", "yes"]),
    },
)
bad_params = st.one_of(
    st.fixed_dictionaries({"participant": st.sampled_from(["", "bad id", "x" * 129, "é", "-x"])}),
    st.fixed_dictionaries({"sample_rate": st.sampled_from(["abc", "4000", "96000", "1.5e4", ""])}),
    st.fixed_dictionaries({"encoding": st.sampled_from(["opus", "PCM_S16LE", ""])}),
    st.fixed_dictionaries({"language": st.sampled_from(["english", "EN", "e1", ""])}),
    st.fixed_dictionaries({"interim_results": st.sampled_from(["maybe", ""])}),
    st.fixed_dictionaries({"resume_token": st.text(max_size=40), "last_seq": st.just("0")}),
    st.fixed_dictionaries(
        {"resume_token": st.just("A" * 43), "last_seq": st.sampled_from(["-1", "x", "9" * 30])}
    ),
)
cases = st.tuples(
    st.integers(0, 7).flatmap(lambda i: bad_params if i == 0 else good_params),  # 1 in 8 bad
    st.lists(actions, max_size=8),
    st.booleans(),  # a few benign frames after `stop`
)


# ---------------------------------------------------------------- the model


@dataclass
class Expected:
    close: int
    error: str | None  # the `error.code` before the close, if the app sends one


def _query_outcome(params: dict[str, Any]) -> Expected | None:
    """Mirror of the query checks: None if the stream opens."""
    if "resume_token" in params:
        last_seq = str(params.get("last_seq", "0"))
        if not last_seq.isdigit() or len(last_seq) > 18:
            return Expected(4400, "bad_config")
        return Expected(4404, "not_found")
    bad = [
        "participant" in params
        and params["participant"] not in {"ana", "bot-1", "x" * 128, "A.b_c-9"},
        "sample_rate" in params and params["sample_rate"] not in {8000, 16000, 22050, 44100, 48000},
        "encoding" in params and params["encoding"] not in {"pcm_s16le", "pcm_f32le"},
        "language" in params and params["language"] not in {"en", "auto"},
        "interim_results" in params
        and params["interim_results"] not in {"true", "false", "0", "yes"},
    ]
    return Expected(4400, "bad_config") if any(bad) else None


def _text_outcome(text: str) -> Expected | None:
    if len(text) > MAX_FRAME:
        return Expected(1009, "frame_too_large")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return Expected(1007, "invalid_message")
    if not isinstance(data, dict) or data.get("type") not in CONTROL_TYPES:
        return Expected(1007, "invalid_message")
    if data["type"] == "stop":
        return Expected(1000, None)
    return None


def _audio_outcome(frame: bytes, encoding: str) -> Expected | None:
    if len(frame) > MAX_FRAME:
        return Expected(1009, "frame_too_large")
    width = 4 if encoding == "pcm_f32le" else 2
    if len(frame) % width:
        return Expected(1007, "invalid_audio")
    if width == 4 and not np.isfinite(np.frombuffer(frame, "<f4")).all():
        return Expected(1007, "invalid_audio")
    return None


SPEECH = clip("en_jfk").pcm16()


def _audio(size: int, pattern: str, seed: int, encoding: str) -> bytes:
    rng = random.Random(seed)
    if pattern == "loud":
        return rng.randbytes(size)
    width = 4 if encoding == "pcm_f32le" else 2
    count = size // width
    if pattern == "zero":
        samples = np.zeros(count)
    elif pattern == "quiet":
        samples = np.random.default_rng(seed).standard_normal(count) * 0.001
    else:
        start = rng.randrange(0, len(SPEECH) // 2 - count - 1) if count else 0
        samples = np.frombuffer(SPEECH, "<i2")[start : start + count] / 32768.0
    frame = (
        samples.astype("<f4").tobytes() if width == 4 else (samples * 32767).astype("<i2").tobytes()
    )
    if width == 4 and count and rng.random() < 0.3:  # NaN or ±Inf somewhere
        values = np.frombuffer(frame, "<f4").copy()
        values[rng.randrange(count)] = rng.choice([np.nan, np.inf, -np.inf])
        frame = values.tobytes()
    return frame + rng.randbytes(size - len(frame))  # odd tails stay odd


def plan(
    case: tuple[dict[str, Any], list[tuple[Any, ...]], bool],
) -> tuple[str, list[Any], Expected]:
    """The query, the frames to send, and the outcome the protocol promises."""
    params, steps, after_stop = case
    query = urlencode(params)
    expected = _query_outcome(params)
    if expected is not None:
        return query, [], expected
    encoding = params.get("encoding", "pcm_s16le")
    frames: list[Any] = []
    for step in steps:
        kind = step[0]
        outcome: Expected | None = None
        if kind == "audio":
            frame = _audio(step[1], step[2], step[3], encoding)
            frames.append(frame)
            outcome = _audio_outcome(frame, encoding)
        elif kind == "text":
            frames.append(step[1])
            outcome = _text_outcome(step[1])
        elif kind == "flood":
            width = 4 if encoding == "pcm_f32le" else 2
            one = '{"type":"keepalive"}' if step[2] == "keepalive" else bytes(160 * width)
            frames += [one] * step[1]
        elif kind == "oversize":
            frames.append(bytes(MAX_FRAME + 2) if step[1] == "binary" else "k" * (MAX_FRAME + 1))
            outcome = Expected(1009, "frame_too_large")
        elif step[1] == "bad_utf8":
            frames.append(RawText(b'{"type": "\xff\xfe"}'))
            outcome = Expected(1007, None)  # refused by the WebSocket layer
        else:
            frames.append(bytes(4 * MAX_FRAME + 8))  # over uvicorn's --ws-max-size
            outcome = Expected(1009, None)
        if outcome is not None:
            if outcome.close == 1000 and after_stop:  # wrong state: data after `stop`
                frames += [bytes(640), '{"type": "finalize"}', '{"type": "dance"}']
            return query, frames, outcome
    frames.append('{"type": "stop"}')
    return query, frames, Expected(1000, None)


async def run_case(base: str, meeting: str, case: Any, tally: Tally) -> None:
    query, frames, expected = plan(case)
    url = f"{base}/v1/meetings/{meeting}/stream" + (f"?{query}" if query else "")
    started = time.monotonic()
    result = await exchange(url, frames, timeout=60)
    took = time.monotonic() - started
    tally.add(
        result.close_code, len(frames), took, f"{query} {[_describe(f) for f in frames]}"[:400]
    )
    check(result, expected, (query, [_describe(f) for f in frames]))


def _describe(frame: Any) -> str:
    if isinstance(frame, RawText):
        return f"text bytes {frame.data!r}"
    kind = "bin" if isinstance(frame, bytes) else "text"
    return f"{kind}[{len(frame)}] {frame[:40]!r}"


def check(result: StreamResult, expected: Expected, context: Any) -> None:
    assert result.close_code != 1011, context
    assert result.close_code == expected.close, (
        result.close_code,
        expected,
        result.messages[-3:],
        context,
    )
    kinds = [m.get("type") for m in result.messages]
    assert set(kinds) <= SERVER_TYPES, (kinds, context)
    if expected.error is not None:
        assert kinds[-1] == "error" and result.messages[-1]["code"] == expected.error, (
            result.messages[-3:],
            context,
        )
    if expected.close == 1000:
        assert kinds[0] == "session.started" and kinds[-1] == "session.ended", (kinds, context)
        ended = result.messages[-1]
        assert ended["reason"] == "stop" and ended["finals"] == kinds.count("transcript.final")
    for message in result.messages:
        if message["type"] == "transcript.final":
            assert message["end"] >= message["start"] >= 0 and isinstance(message["text"], str)


# ---------------------------------------------------------------- the healthy room


@dataclass
class HealthyRoom:
    """JFK at real time, over and over on its own thread and loop, while fuzzing runs."""

    base: str
    runs: list[StreamResult] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._loop()), daemon=True)

    async def _loop(self) -> None:
        while not self.stop.is_set() or not self.runs:
            self.runs.append(
                await stream_pcm(self.base, "fuzz-healthy", SPEECH, speed=1.0, trailing_silence=0.5)
            )

    def __enter__(self) -> HealthyRoom:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)

    def assert_correct(self) -> None:
        reference = clip("en_jfk").reference
        assert self.runs and not self.thread.is_alive()
        for run in self.runs:
            kinds = [m["type"] for m in run.messages]
            assert run.close_code == 1000 and kinds[-1] == "session.ended", kinds[-3:]
            assert error_rate(reference, run.text) <= 0.2, run.text


@pytest.fixture(scope="module")
def tally() -> Iterator[Tally]:
    counts = Tally()
    yield counts
    print(
        f"\nfuzz: {counts.cases} cases, {counts.messages} client messages, closes {counts.outcomes}"
    )
    for took, what in counts.slowest:
        print(f"  slowest: {took:.2f} s  {what}")


@pytest.mark.slow
def test_fuzzed_streams_end_in_documented_codes(parley_server: ServerProcess, tally: Tally) -> None:
    """~2000 generated sequences on the stream socket (four at a time) each end in the
    close code the protocol promises, or continue and stop cleanly; a real-time room
    alongside gets a correct transcript, and the server log shows no failure."""
    log_start = len(parley_server.log())
    base = parley_server.ws_url
    counter = iter(range(10**9))

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(cases, min_size=CASES_PER_EXAMPLE, max_size=CASES_PER_EXAMPLE))
    def fuzz(batch: list[Any]) -> None:
        async def run() -> None:
            await asyncio.gather(
                *(run_case(base, f"fuzz-{next(counter)}", case, tally) for case in batch)
            )

        asyncio.run(run())

    started = time.monotonic()
    with HealthyRoom(base) as room:
        fuzz()
    room.assert_correct()
    print(f"\nfuzz: {time.monotonic() - started:.1f} s, healthy room ran {len(room.runs)} times")
    assert tally.cases >= 0.9 * CASES_PER_EXAMPLE * EXAMPLES
    assert parley_server.process.poll() is None
    assert parley_server.get("/healthz")[0] == 200
    log = parley_server.log()[log_start:]
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


# ---------------------------------------------------------------- listeners

listener_actions = st.lists(
    st.one_of(
        st.tuples(st.just("text"), texts),
        st.tuples(st.just("flood"), st.integers(20, 200)),
        st.tuples(st.just("audio"), st.integers(0, 4096)),
    ),
    max_size=6,
)
listener_cases = st.tuples(
    st.sampled_from(["0", "3", "", "-1", "x", "9" * 19]),
    st.lists(st.sampled_from(["parley.v1", "chat", "parley.token.x"]), max_size=2, unique=True),
    listener_actions,
)


async def run_listener_case(base: str, case: Any, tally: Tally) -> None:
    after_seq, subprotocols, steps = case
    frames: list[Any] = []
    expected: Expected | None = None
    if not after_seq.isdigit() or len(after_seq) > 18:
        expected = Expected(4400, "bad_config")
    for step in steps:
        if expected is not None:
            break
        if step[0] == "text":
            frames.append(step[1])
        elif step[0] == "flood":
            frames += ['{"type":"keepalive"}'] * step[1]
        else:
            frames.append(bytes(step[1]))
            expected = Expected(1003, "unsupported_data")
    url = f"{base}/v1/meetings/fuzz-healthy/events?after_seq={after_seq}"
    result = await exchange(
        url, frames, subprotocols=subprotocols, linger=None if expected else 0.05, timeout=30
    )
    tally.add(result.close_code, len(frames))
    kinds = {m["type"] for m in result.messages}
    if expected is None:
        assert result.close_code == 1000, (result.close_code, result.messages[-2:], case)
        assert kinds <= {"transcript.final", "transcript.partial"}, (kinds, case)
    else:
        assert result.close_code == expected.close, (result.close_code, result.messages[-2:], case)
        assert result.messages[-1]["code"] == expected.error


@pytest.mark.slow
def test_fuzzed_listeners_end_in_documented_codes(
    parley_server: ServerProcess, tally: Tally
) -> None:
    """Listener sockets with generated messages: text is ignored, audio is refused 1003,
    a bad after_seq 4400, any subprotocol offer is answered; the server keeps serving."""
    base = parley_server.ws_url

    @settings(max_examples=EXAMPLES // 5, deadline=None, database=None)
    @given(st.lists(listener_cases, min_size=CASES_PER_EXAMPLE, max_size=CASES_PER_EXAMPLE))
    def fuzz(batch: list[Any]) -> None:
        async def run() -> None:
            await asyncio.gather(*(run_listener_case(base, case, tally) for case in batch))

        asyncio.run(run())

    fuzz()
    assert parley_server.get("/healthz")[0] == 200


# ---------------------------------------------------------------- credentials

AUTH_KEYS = {"t0": "fuzz-key-of-t0-0123456789", "t1": "fuzz-key-of-t1-0123456789"}
credentials = st.one_of(
    st.tuples(st.just("header"), st.sampled_from(["Bearer {t0}", "bearer  {t0} ", "Bearer {t1}"])),
    st.tuples(
        st.just("header"),
        st.one_of(
            st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40),
            st.sampled_from(["Bearer", "Bearer ", "Basic {t0}", "Bearer {t0}x", "Bearer pmt_x"]),
        ),
    ),
    st.tuples(st.just("query"), st.sampled_from(["{t0}", "pmt_", "pmt_" + "A" * 43, ""])),
    st.tuples(st.just("subprotocol"), st.sampled_from(["parley.token.{t0}", "parley.token.pmt_x"])),
    st.tuples(st.just("message"), texts),
    st.tuples(st.just("message"), st.sampled_from(['{"type": "auth", "token": "{t0}"}'])),
    st.tuples(st.just("nothing"), st.just("")),
)


def _auth_expected(kind: str, value: str) -> int:
    """1000: authenticated (then `stop`); else the refusal's close code."""
    if kind == "header":
        scheme, _, credential = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            return 4401
        credential = credential.strip()
        if credential == AUTH_KEYS["t0"]:
            return 1000
        return 4403 if credential == AUTH_KEYS["t1"] else 4401
    if kind == "message":
        try:
            data = orjson.loads(value)
        except orjson.JSONDecodeError:
            return 4401
        ok = isinstance(data, dict) and data.get("type") == "auth"
        return 1000 if ok and data.get("token") == AUTH_KEYS["t0"] else 4401
    return 4401  # query, subprotocol: meeting tokens only (none valid here); nothing: deadline


@pytest.fixture(scope="module")
async def auth_server() -> AsyncIterator[AppServer]:
    async with serve_app(
        api_keys=",".join(f"{t}:{k}" for t, k in AUTH_KEYS.items()), auth_timeout_s=0.3
    ) as server:
        owned = await exchange(
            f"{server.ws_url}/v1/meetings/owned/stream",
            ['{"type": "stop"}'],
            headers=bearer(AUTH_KEYS["t0"]),
        )
        assert owned.close_code == 1000
        yield server


async def test_fuzzed_credentials_are_refused_or_accepted_as_documented(
    auth_server: AppServer, tally: Tally
) -> None:
    """Generated credentials (headers, tokens in the query or a subprotocol, first
    messages, nothing at all): the right key is served, another tenant's is 4403,
    everything else 4401 within the auth deadline."""
    base = f"{auth_server.ws_url}/v1/meetings/owned/stream"
    rng = random.Random(5)
    seen: list[tuple[str, str]] = []

    @settings(max_examples=EXAMPLES // 2, deadline=None, database=None)
    @given(st.lists(credentials, min_size=1, max_size=1))
    def collect(batch: list[tuple[str, str]]) -> None:
        seen.extend(batch)

    collect()
    rng.shuffle(seen)

    async def attempt(kind: str, raw: str) -> None:
        value = raw.replace("{t0}", AUTH_KEYS["t0"]).replace("{t1}", AUTH_KEYS["t1"])
        expected = _auth_expected(kind, value)
        headers = {"Authorization": value} if kind == "header" else None
        url = f"{base}?{urlencode({'access_token': value})}" if kind == "query" else base
        subprotocols = ["parley.v1", value] if kind == "subprotocol" else None
        frames = [value] if kind == "message" else []
        result = await exchange(
            url, [*frames, '{"type": "stop"}'], headers=headers, subprotocols=subprotocols
        )
        tally.add(result.close_code, len(frames) + 1)
        assert result.close_code == expected, (kind, value, result.messages)
        if expected != 1000:
            assert [m["type"] for m in result.messages] == ["error"], result.messages

    for start in range(0, len(seen), 8):
        await asyncio.gather(*(attempt(k, v) for k, v in seen[start : start + 8]))
