"""Silero VAD through onnxruntime, with each stream's recurrent state held by the stream.

The model ships inside the `silero-vad` package; it is loaded from the package's files
without importing the package (importing `silero_vad` calls torch.set_num_threads(1)
for the whole process). Because the state is explicit, one call can score windows of
many streams at once: `SileroVad.score` takes a batch of windows and their states.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime

from engine.api import SAMPLE_RATE

WINDOW = 512  # samples per VAD window at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees before each window
STATE_SHAPE = (2, 1, 128)

FloatArray = npt.NDArray[np.float32]


def silero_model_path(name: str = "silero_vad.onnx") -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the silero-vad package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    if not path.is_file():
        raise RuntimeError(f"silero-vad model file missing: {path}")
    return path


TRAIL = 48  # windows whose states a stream keeps (1.5 s: an utterance's end is behind)


@dataclass(slots=True)
class VadState:
    """One stream's recurrent state and the tail of its previous window; with a `trail`,
    also the (state, context) after each of its last windows, oldest first."""

    state: FloatArray = field(default_factory=lambda: np.zeros(STATE_SHAPE, np.float32))
    context: FloatArray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))
    trail: deque[tuple[FloatArray, FloatArray]] | None = None


def pack_state(state: FloatArray, context: FloatArray) -> str:
    """A VAD state as text for the store (base64 of float32: 1,280 bytes, 1,708 chars)."""
    raw = np.concatenate([state.ravel(), context]).astype("<f4").tobytes()
    return base64.b64encode(raw).decode("ascii")


def unpack_state(text: str) -> VadState:
    """The state `pack_state` wrote; ValueError if `text` is not one."""
    raw = np.frombuffer(base64.b64decode(text, validate=True), "<f4")
    size = int(np.prod(STATE_SHAPE))
    if len(raw) != size + CONTEXT:
        raise ValueError(f"a packed VAD state holds {size + CONTEXT} floats, not {len(raw)}")
    state = raw[:size].reshape(STATE_SHAPE).astype(np.float32)
    return VadState(state, raw[size:].astype(np.float32))


class SileroVad:
    """The shared VAD model. Stateless itself: states travel with the calls."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = threads
        self._session = onnxruntime.InferenceSession(
            str(path or silero_model_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def score(self, windows: FloatArray, states: list[VadState]) -> FloatArray:
        """Speech probability of each window (shape [B, 512]); updates `states` in place."""
        batch = len(states)
        if windows.shape != (batch, WINDOW):
            raise ValueError(f"expected windows of shape ({batch}, {WINDOW}), got {windows.shape}")
        contexts = np.stack([s.context for s in states])
        model_input = np.concatenate([contexts, windows], axis=1)
        state = np.concatenate([s.state for s in states], axis=1)
        out, new_state = self._session.run(
            None, {"input": model_input, "state": state, "sr": self._sr}
        )
        for i, s in enumerate(states):
            s.state = np.ascontiguousarray(new_state[:, i : i + 1, :])
            s.context = windows[i, -CONTEXT:].copy()
            if s.trail is not None:
                s.trail.append((s.state, s.context))
        probabilities: FloatArray = out[:, 0].astype(np.float32)
        return probabilities


class VadScorer(Protocol):
    """Scores consecutive windows of one stream, advancing that stream's state; counts its
    model `calls` and the `windows` they scored (windows / calls: the mean batch)."""

    calls: int
    windows: int

    async def score(self, state: VadState, windows: FloatArray) -> FloatArray: ...


class DirectScorer:
    """One model call per window: the simple path, and the reference for the batcher."""

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self.calls = 0
        self.windows = 0

    async def score(self, state: VadState, windows: FloatArray) -> FloatArray:
        self.calls += len(windows)
        self.windows += len(windows)
        return np.array(
            [self._model.score(w[None, :], [state])[0] for w in windows], dtype=np.float32
        )


@dataclass(slots=True)
class _Pending:
    state: VadState
    windows: FloatArray
    future: asyncio.Future[FloatArray]


class VadBatcher:
    """Scores the windows of every stream in one model call per event-loop turn.

    Requests made during one turn of the loop (every reader woken by the same poll of
    the sockets) are scored together at the start of the next turn, or once
    `max_streams` have come. With `max_delay` > 0 a batch waits up to that long for more
    streams' frames instead (real-time streams send a frame every 20-100 ms, so a turn
    rarely holds more than one; docs/performance.md#endpoint-and-vad), except when a
    request's stream was in the last batch: it is back before any other stream was
    scored (a replay faster than real time, a burst after a stall, a lone stream), and
    waiting would only cap it at one frame per `max_delay`, so the batch goes at the
    next turn. Step t of a batch scores the t-th window of every request that has one,
    so each stream's recurrent state still advances in order. Runs on the event loop:
    one batched call costs far less than one call per stream (0.21 ms for one window,
    0.35 ms for four, 1.0 ms for sixteen).
    """

    def __init__(self, model: SileroVad, *, max_delay: float = 0.0, max_streams: int = 64) -> None:
        self._model = model
        self._max_delay = max_delay
        self._max_streams = max_streams
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._last: set[int] = set()  # id() of the states the last batch scored
        self.calls = 0  # model calls made (parley_vad_calls_total)
        self.windows = 0  # windows scored (parley_vad_windows_total)

    async def score(self, state: VadState, windows: FloatArray) -> FloatArray:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[FloatArray] = loop.create_future()
        self._pending.append(_Pending(state, windows, future))
        if len(self._pending) >= self._max_streams:
            self._flush()
        elif self._max_delay == 0 or id(state) in self._last:
            self._flush_next_turn(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self._max_delay, self._flush)
        return await future

    def _flush_next_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        """Score what is pending at the loop's next turn (a longer wait set is cut short)."""
        if isinstance(self._timer, asyncio.TimerHandle):
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer = loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = [p for p in self._pending if not p.future.done()]
        self._pending = []
        self._last = {id(p.state) for p in pending}
        if not pending:
            return
        results = [np.zeros(len(p.windows), np.float32) for p in pending]
        try:
            for step in range(max(len(p.windows) for p in pending)):
                rows = [i for i, p in enumerate(pending) if len(p.windows) > step]
                probabilities = self._model.score(
                    np.stack([pending[i].windows[step] for i in rows]),
                    [pending[i].state for i in rows],
                )
                self.calls += 1
                self.windows += len(rows)
                for row, i in enumerate(rows):
                    results[i][step] = probabilities[row]
        except Exception as exc:  # fail exactly the requests of this tick
            for p in pending:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, result in zip(pending, results, strict=True):
            if not p.future.done():
                p.future.set_result(result)


class VadStream:
    """Cuts one stream's samples into 512-sample windows and scores each one.

    `start` is the state to go on from (a resumed stream's, as stored with its last final;
    None: a zero state). The stream keeps its state after each of its last TRAIL windows:
    `state_at(sample)` packs the one a window ending at `sample` left (for the store)."""

    def __init__(self, scorer: VadScorer, start: VadState | None = None) -> None:
        self._scorer = scorer
        self._state = start or VadState()
        self._state.trail = deque(maxlen=TRAIL)
        self._pending = np.zeros(0, np.float32)
        self._scored = 0  # samples scored (whole windows)

    def state_at(self, scored: int) -> str | None:
        """The packed state after the window that ends `scored` samples into the stream;
        None if that is not a window's end, or too far back (or not reached)."""
        trail = self._state.trail
        back, rest = divmod(self._scored - scored, WINDOW)
        if trail is None or rest or not 0 <= back < len(trail):
            return None
        state, context = trail[len(trail) - 1 - back]
        return pack_state(state, context)

    async def process(self, samples: FloatArray) -> list[tuple[FloatArray, float]]:
        """Score every whole window now available; keep the remainder for next time."""
        buffer = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        count = len(buffer) // WINDOW
        self._pending = buffer[count * WINDOW :].copy()
        if count == 0:
            return []
        windows = buffer[: count * WINDOW].reshape(count, WINDOW).astype(np.float32, copy=False)
        probabilities = await self._scorer.score(self._state, windows)
        self._scored += count * WINDOW
        return [(w, float(p)) for w, p in zip(windows, probabilities, strict=True)]
