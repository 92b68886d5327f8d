"""Silero VAD through onnxruntime, with each stream's recurrent state held by the stream.

The model ships inside the `silero-vad` package; it is loaded from the package's files
without importing the package (importing `silero_vad` calls torch.set_num_threads(1)
for the whole process). Because the state is explicit, one call can score windows of
many streams at once: `SileroVad.score` takes a batch of windows and their states.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime

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


@dataclass(slots=True)
class VadState:
    """One stream's recurrent state and the tail of its previous window."""

    state: FloatArray = field(default_factory=lambda: np.zeros(STATE_SHAPE, np.float32))
    context: FloatArray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))


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
        self._sr = np.array(16_000, dtype=np.int64)

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
        probabilities: FloatArray = out[:, 0].astype(np.float32)
        return probabilities


class VadStream:
    """Cuts one stream's samples into 512-sample windows and scores each one."""

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self._state = VadState()
        self._pending = np.zeros(0, np.float32)

    def process(self, samples: FloatArray) -> list[tuple[FloatArray, float]]:
        """Score every whole window now available; keep the remainder for next time."""
        buffer = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        count = len(buffer) // WINDOW
        self._pending = buffer[count * WINDOW :].copy()
        if count == 0:
            return []
        windows = buffer[: count * WINDOW].reshape(count, WINDOW).astype(np.float32, copy=False)
        results: list[tuple[FloatArray, float]] = []
        for window in windows:  # one recurrent step per window
            probability = float(self._model.score(window[None, :], [self._state])[0])
            results.append((window, probability))
        return results

    def pending_samples(self) -> FloatArray:
        """Samples received but not yet a whole window (flushed with the utterance)."""
        return self._pending
