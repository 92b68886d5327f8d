"""Speaker embeddings: Resemblyzer's d-vector model, without Resemblyzer's dependencies.

The `resemblyzer` wheel (0.1.4, Apache-2.0) ships `pretrained.pt`: a 3-layer LSTM (40 →
256) and a linear layer trained on 1.6 s windows of a 40-band mel power spectrogram
(25 ms Hann window, 10 ms hop, 16 kHz). Its own code imports librosa and webrtcvad for
that spectrogram and its preprocessing, so this module reads the weights file with
`torch.load(weights_only=True)` and computes the spectrogram itself (librosa's
`melspectrogram`: centred frames, periodic Hann, Slaney mel scale and norm). Nothing is
downloaded; the package is installed `--no-deps` (see pyproject.toml).

`SpeakerEncoder.embed` is blocking and batched: windows of many sources go through the
LSTM in one call. `SpeakerEmbedder` is its asyncio front: requests made during one turn
of the event loop go to one worker thread as one batch, so the loop never waits on the
model and rooms share each call.

An utterance is embedded window by window (`WINDOW_S`, not overlapping: every audio
frame passes through the LSTM once, which is what keeps a room's cost near 1 % of a
core). Each window's embedding is L2-normalised and non-negative, as the model was
trained; cosine similarity of two is their dot product.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from engine.api import SAMPLE_RATE, EmbedderFull, SpeakerWindows

logger = logging.getLogger(__name__)

N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
HIDDEN = 256
LAYERS = 3
EMBEDDING_SIZE = 256
WINDOW_S = 1.6  # the model's training window (160 frames)
MIN_WINDOW_S = 0.5  # a shorter tail is folded into the window before it
TARGET_DBFS = -30.0  # Resemblyzer's volume normalisation (raise quiet audio only)

FloatArray = npt.NDArray[np.float32]


def weights_path() -> Path:
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the resemblyzer package is not installed (pip install --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.is_file():
        raise RuntimeError(f"resemblyzer's weights are missing: {path}")
    return path


# ---------------------------------------------------------------- spectrogram


def _hz_to_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above (librosa, htk=False)."""
    mel = hz / (200.0 / 3)
    log = hz >= 1000.0
    mel[log] = 15.0 + np.log(hz[log] / 1000.0) / (np.log(6.4) / 27.0)
    return mel


def _mel_to_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    hz = mel * (200.0 / 3)
    log = mel >= 15.0
    hz[log] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[log] - 15.0))
    return hz


def mel_filterbank() -> FloatArray:
    """[N_MELS, N_FFT // 2 + 1] triangular filters, Slaney-normalised (librosa.filters.mel)."""
    fft_hz = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(np.array([SAMPLE_RATE / 2]))[0], N_MELS + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.astype(np.float32)


_MEL = mel_filterbank()
_HANN = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def mel_frames(audio: FloatArray) -> FloatArray:
    """[frames, N_MELS] mel power spectrogram, one frame per HOP samples (centred frames,
    zero-padded at both ends: librosa ≥ 0.10's `melspectrogram` defaults)."""
    padded = np.pad(audio.astype(np.float32, copy=False), N_FFT // 2)
    count = 1 + (len(padded) - N_FFT) // HOP
    frames = np.lib.stride_tricks.as_strided(
        padded, (count, N_FFT), (padded.strides[0] * HOP, padded.strides[0]), writeable=False
    )
    power = np.abs(np.fft.rfft(frames * _HANN, axis=1)) ** 2
    mel: FloatArray = (power.astype(np.float32) @ _MEL.T).astype(np.float32)
    return mel


def normalise_volume(audio: FloatArray) -> FloatArray:
    """Raise quiet audio to TARGET_DBFS (never lower it), as Resemblyzer's preprocessing."""
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if len(audio) else 0.0
    if rms <= 1e-6:
        return audio
    gain = 10 ** ((TARGET_DBFS - 20 * np.log10(rms)) / 20)
    return audio if gain <= 1.0 else (audio * gain).astype(np.float32)


# ---------------------------------------------------------------- windows


def unit(vector: FloatArray) -> FloatArray:
    norm = float(np.linalg.norm(vector))
    return (vector / norm).astype(np.float32) if norm > 0 else vector


def window_bounds(samples: int, window_s: float = WINDOW_S) -> list[tuple[int, int]]:
    """Cut `samples` into back-to-back windows; a tail under MIN_WINDOW_S joins the last."""
    size = round(window_s * SAMPLE_RATE)
    minimum = round(MIN_WINDOW_S * SAMPLE_RATE)
    if samples < minimum:
        return [(0, samples)] if samples >= HOP * 4 else []
    bounds = [(start, min(start + size, samples)) for start in range(0, samples, size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < minimum:
        bounds[-2:] = [(bounds[-2][0], samples)]
    return bounds


# ---------------------------------------------------------------- model


class SpeakerEncoder(torch.nn.Module):
    """Resemblyzer's d-vector network with its shipped weights. Blocking; CPU."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(N_MELS, HIDDEN, LAYERS, batch_first=True)
        self.linear = torch.nn.Linear(HIDDEN, EMBEDDING_SIZE)
        checkpoint = torch.load(path or weights_path(), map_location="cpu", weights_only=True)
        state = {
            k: v for k, v in checkpoint["model_state"].items() if k.startswith(("lstm.", "linear."))
        }
        self.load_state_dict(state, strict=True)
        self.eval()

    def forward(self, mels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[B, T, N_MELS] spectrograms (each padded to T; `lengths` frames are real) →
        [B, EMBEDDING_SIZE] unit embeddings."""
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            mels, lengths, batch_first=True, enforce_sorted=False
        )
        _, (hidden, _) = self.lstm(packed)
        raw: torch.Tensor = torch.relu(self.linear(hidden[-1]))
        norm: torch.Tensor = torch.linalg.vector_norm(raw, dim=1, keepdim=True)
        return raw / norm.clamp_min(1e-8)

    def embed(self, utterances: Sequence[FloatArray]) -> list[SpeakerWindows]:
        """Embed each utterance's windows; one LSTM call for all of them."""
        spectrograms: list[FloatArray] = []
        counts: list[int] = []
        all_bounds: list[list[tuple[int, int]]] = []
        for audio in utterances:
            bounds = window_bounds(len(audio))
            loud = normalise_volume(audio)
            spectrograms.extend(mel_frames(loud[start:end]) for start, end in bounds)
            counts.append(len(bounds))
            all_bounds.append(bounds)
        if spectrograms:
            longest = max(len(s) for s in spectrograms)
            batch = np.zeros((len(spectrograms), longest, N_MELS), np.float32)
            for i, spectrogram in enumerate(spectrograms):
                batch[i, : len(spectrogram)] = spectrogram
            lengths = torch.tensor([len(s) for s in spectrograms])
            with torch.inference_mode():
                embeddings = self(torch.from_numpy(batch), lengths).numpy()
        else:
            embeddings = np.zeros((0, EMBEDDING_SIZE), np.float32)
        out: list[SpeakerWindows] = []
        offset = 0
        for count, bounds in zip(counts, all_bounds, strict=True):
            out.append(SpeakerWindows(tuple(bounds), embeddings[offset : offset + count].copy()))
            offset += count
        return out


# ---------------------------------------------------------------- asyncio front


@dataclass
class EmbedderStats:
    """Counters for metrics and the benchmark. Only the embedder writes them."""

    batches: int = 0
    utterances: int = 0
    windows: int = 0
    audio_seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the worker thread spent in batches
    rejected: int = 0


@dataclass(slots=True)
class _Request:
    audio: FloatArray
    future: asyncio.Future[SpeakerWindows]


class SpeakerEmbedder:
    """Batches embedding requests from every diarized source onto one worker thread.

    Requests made during one event-loop turn (or within `max_wait`) run as one batch of
    at most `max_batch_windows` windows; a request never waits behind more than
    `max_pending_windows` windows (it fails with EmbedderFull instead: a final is not
    held back for a label). Call `close()` at shutdown.
    """

    def __init__(
        self,
        encoder: SpeakerEncoder,
        *,
        max_wait: float = 0.0,
        max_batch_windows: int = 32,
        max_pending_windows: int = 512,
    ) -> None:
        self._encoder = encoder
        self._max_wait = max_wait
        self._max_batch_windows = max_batch_windows
        self._max_pending_windows = max_pending_windows
        self._queue: list[_Request] = []
        self._pending_windows = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parley-speakers")
        self._runner: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self.stats = EmbedderStats()

    async def embed(self, audio: FloatArray) -> SpeakerWindows:
        """The embeddings of one utterance's windows (empty if it is too short)."""
        windows = len(window_bounds(len(audio)))
        if self._pending_windows + windows > self._max_pending_windows:
            self.stats.rejected += 1
            raise EmbedderFull(f"{self._pending_windows} speaker windows already waiting")
        loop = asyncio.get_running_loop()
        request = _Request(audio, loop.create_future())
        self._queue.append(request)
        self._pending_windows += windows
        if self._runner is None or self._runner.done():
            self._wakeup = asyncio.Event()
            self._runner = asyncio.create_task(self._run(), name="speaker-embedder")
        assert self._wakeup is not None
        self._wakeup.set()
        return await request.future

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        for request in self._queue:
            if not request.future.done():
                request.future.cancel()
        self._queue.clear()
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self._max_wait > 0:
                await asyncio.sleep(self._max_wait)
            else:
                await asyncio.sleep(0)  # let this turn's other requests join the batch
            while self._queue:
                batch = self._take()
                audio = [r.audio for r in batch]
                try:
                    results = await loop.run_in_executor(self._executor, self._timed, audio)
                except Exception as exc:
                    logger.exception("speaker embedding batch of %d failed", len(batch))
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(exc)
                    continue
                for request, result in zip(batch, results, strict=True):
                    if not request.future.done():
                        request.future.set_result(result)

    def _take(self) -> list[_Request]:
        batch: list[_Request] = []
        windows = 0
        while self._queue:
            size = max(1, len(window_bounds(len(self._queue[0].audio))))
            if batch and windows + size > self._max_batch_windows:
                break
            request = self._queue.pop(0)
            windows += size
            self._pending_windows -= len(window_bounds(len(request.audio)))
            if not request.future.done():  # its session went away: skip it
                batch.append(request)
        return batch

    def _timed(self, audio: list[FloatArray]) -> list[SpeakerWindows]:
        started = time.thread_time()
        results = self._encoder.embed(audio)
        self.stats.cpu_seconds += time.thread_time() - started
        self.stats.batches += 1
        self.stats.utterances += len(audio)
        self.stats.windows += sum(len(r.bounds) for r in results)
        self.stats.audio_seconds += sum(len(a) for a in audio) / SAMPLE_RATE
        return results
