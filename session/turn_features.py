"""The turn model's input: Whisper's log-mel features of the last 8 s of a turn.

smart-turn v3 (session/turn.py) was trained on `transformers.WhisperFeatureExtractor(
chunk_length=8)` features: the turn's audio, its last 8 s kept or zeros put *before* it
to make 8 s, normalised to zero mean and unit variance, then a 400-point STFT (hop 160,
periodic Hann, reflect padding), an 80-band Slaney mel filterbank, log10 floored at
1e-10, clamped to 8 below its maximum and scaled `(x + 4) / 4`: 80 × 800 floats.

The same arithmetic as pipecat 1.14's `pipecat/audio/turn/smart_turn/_whisper_features.py`
(BSD-2-Clause, Daily; derived from Hugging Face transformers' feature extractor,
Apache-2.0), written for a batch; tests/session/test_turn.py checks it against that file
and against transformers' extractor.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from engine.api import SAMPLE_RATE

FloatArray = npt.NDArray[np.float32]

SECONDS = 8
SAMPLES = SECONDS * SAMPLE_RATE  # 128,000
N_FFT = 400
HOP = 160
N_MELS = 80
FRAMES = SAMPLES // HOP  # 800


def _hertz_to_mel(freq: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mels = 3.0 * freq / 200.0
    log = freq >= 1000.0
    mels[log] = 15.0 + np.log(freq[log] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hertz(mels: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    freq = 200.0 * mels / 3.0
    log = mels >= 15.0
    freq[log] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels[log] - 15.0))
    return freq


def _mel_filters() -> npt.NDArray[np.float64]:
    """Slaney-normalised triangular filters, shape (N_FFT // 2 + 1, N_MELS)."""
    edges = np.array([0.0, SAMPLE_RATE / 2.0])
    low, high = _hertz_to_mel(edges)
    filter_freqs = _mel_to_hertz(np.linspace(low, high, N_MELS + 2))
    fft_freqs = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    diff = np.diff(filter_freqs)
    slopes = filter_freqs[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    filters *= (2.0 / (filter_freqs[2 : N_MELS + 2] - filter_freqs[:N_MELS]))[None, :]
    return filters


_FILTERS_T = np.ascontiguousarray(_mel_filters().T)  # (N_MELS, bins)
_HANN = np.hanning(N_FFT + 1)[:-1]  # periodic, as torch.hann_window


def last_seconds(audio: FloatArray) -> FloatArray:
    """The last 8 s of `audio`, or `audio` after zeros that make 8 s."""
    if len(audio) >= SAMPLES:
        return audio[-SAMPLES:].astype(np.float32, copy=False)
    return np.pad(audio.astype(np.float32, copy=False), (SAMPLES - len(audio), 0))


def log_mel(audio: FloatArray) -> FloatArray:
    """Features (N_MELS, FRAMES) of one turn's audio (16 kHz, any length)."""
    x = last_seconds(audio)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), (N_FFT // 2, N_FFT // 2), mode="reflect")
    frames = sliding_window_view(padded, N_FFT)[::HOP]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # (FRAMES + 1, bins)
    mel = np.log10(np.maximum(1e-10, _FILTERS_T @ power.T))[:, :-1]
    mel = np.maximum(mel, mel.max() - 8.0)
    features: FloatArray = ((mel + 4.0) / 4.0).astype(np.float32)
    return features
