"""End of turn by a model: smart-turn v3.2 decides whether a speaker has finished.

The segmenter asks at a short silence (`TurnCheck`, session/segmenter.py); the pipeline
awaits the answer and hands it back (`Segmenter.decide`): a complete turn ends its
utterance at once, an incomplete one waits longer. The model is pipecat's smart-turn v3.2
(BSD-2-Clause, Daily): a Whisper-tiny encoder with a one-logit head over the last 8 s of
the turn's audio (session/turn_features.py), 8.7 MB of ONNX that ships inside the
`pipecat-ai` wheel. Only the file is read: the package is installed without its
dependencies and never imported (the Makefile; pyproject.toml says why).

`TurnBatcher` runs the model on one executor thread, off the event loop: the requests that
come while a batch runs go together in the next one (a batch costs about what its rows do
one by one on a CPU: the encoder is compute-bound, as Whisper's is, so batching buys no
speed; it keeps the loop to one executor job at a time). A request that finds
`max_pending` waiting is not scored (None): the segmenter then applies its fixed rule, as
it does when the model fails.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime

from session.turn_features import SAMPLES, log_mel

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]

DISTRIBUTION = "pipecat-ai"
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
INSTALL_HINT = "pip install --no-deps pipecat-ai==1.14.0 (the turn model's weights)"


def smart_turn_path() -> Path:
    """The model file inside the installed pipecat-ai wheel (read, never imported)."""
    try:
        located = importlib.metadata.distribution(DISTRIBUTION).locate_file(MODEL_FILE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"the turn model is not installed: {INSTALL_HINT}") from None
    path = Path(str(located))
    if not path.is_file():
        raise RuntimeError(f"turn model file missing: {path} ({INSTALL_HINT})")
    return path


class SmartTurn:
    """The shared turn model; stateless: each call scores whole turns."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = threads
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self._session = onnxruntime.InferenceSession(
            str(path or smart_turn_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )

    def warmup(self) -> None:
        """One call, so the first turn does not pay for onnxruntime's first run."""
        self.probabilities([np.zeros(SAMPLES // 8, np.float32)])

    def probabilities(self, turns: list[FloatArray]) -> FloatArray:
        """The probability that each turn (16 kHz audio up to now) is complete."""
        features = np.stack([log_mel(audio) for audio in turns])
        (out,) = self._session.run(None, {"input_features": features})
        probabilities: FloatArray = np.asarray(out, np.float32).reshape(len(turns))
        if len(probabilities) != len(turns):  # pragma: no cover - the model's contract
            raise RuntimeError(f"{len(turns)} turns gave {len(probabilities)} scores")
        return probabilities


class TurnScorer(Protocol):
    """Scores turns for every stream; counts its model `calls` and the `turns` they scored."""

    calls: int
    turns: int

    async def probability(self, audio: FloatArray) -> float | None: ...


@dataclass(slots=True)
class _Pending:
    audio: FloatArray
    future: asyncio.Future[float]


class TurnBatcher:
    """Every stream's turn questions, scored on one executor thread in batches."""

    def __init__(self, model: SmartTurn, *, max_batch: int = 8, max_pending: int = 64) -> None:
        if max_batch < 1 or max_pending < max_batch:
            raise ValueError("need 1 <= max_batch <= max_pending")
        self._model = model
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="turn-model")
        self._pending: list[_Pending] = []
        self._running = False
        self.calls = 0  # model calls made
        self.turns = 0  # turns scored
        self.shed = 0  # questions not scored: too many waiting, or the model failed

    async def probability(self, audio: FloatArray) -> float | None:
        """The probability that the turn ending `audio` is complete; None: not scored."""
        if len(self._pending) >= self._max_pending:
            self.shed += 1
            return None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        self._pending.append(_Pending(audio, future))
        if not self._running:
            self._run(loop)
        try:
            return await future
        except asyncio.CancelledError:
            raise
        except Exception:
            self.shed += 1
            logger.exception("the turn model failed; the fixed silence rule applies")
            return None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = [p for p in self._pending[: self._max_batch] if not p.future.done()]
        self._pending = self._pending[self._max_batch :]
        if not batch:
            if self._pending:
                self._run(loop)
            return
        self._running = True
        job = loop.run_in_executor(
            self._executor, self._model.probabilities, [p.audio for p in batch]
        )
        job.add_done_callback(lambda done: self._settle(loop, batch, done))

    def _settle(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[_Pending],
        done: asyncio.Future[FloatArray],
    ) -> None:
        self._running = False
        self.calls += 1
        self.turns += len(batch)
        if done.cancelled():
            error: BaseException | None = RuntimeError("the turn model was stopped")
        else:
            error = done.exception()
        for i, pending in enumerate(batch):
            if pending.future.done():
                continue
            if error is not None:
                pending.future.set_exception(error)
            else:
                pending.future.set_result(float(done.result()[i]))
        if self._pending and not loop.is_closed():
            self._run(loop)
