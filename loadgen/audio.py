"""Decode audio files into the stream format of protocol v1: 16 kHz mono signed 16-bit PCM.

A WAV file already in that format is read with the standard library; anything else
(other WAV layouts, mp3, m4a, flac, ogg, opus, ...) is decoded and resampled by PyAV,
imported only then (the corpus is WAV: a load generator on a bare machine needs no PyAV).
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from wire.codes import DEFAULT_SAMPLE_RATE

Samples = npt.NDArray[np.int16]


class AudioDecodeError(Exception):
    """A file that cannot be decoded into audio."""


def _read_plain_wav(path: Path) -> Samples | None:
    """The samples of a 16 kHz mono s16 WAV file, or None when it is anything else."""
    try:
        with wave.open(str(path), "rb") as wav:
            if (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) != (
                1,
                2,
                DEFAULT_SAMPLE_RATE,
            ):
                return None
            data = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError):
        return None  # e.g. WAVE_FORMAT_EXTENSIBLE or float WAV: let PyAV decode it
    return np.frombuffer(data, dtype="<i2").astype(np.int16)


def _decode_with_av(path: Path) -> Samples:
    import av

    try:
        container = av.open(str(path))
    except av.error.FFmpegError as exc:
        raise AudioDecodeError(f"{path}: cannot open: {exc}") from exc
    with container:
        if not container.streams.audio:
            raise AudioDecodeError(f"{path}: no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="s16", layout="mono", rate=DEFAULT_SAMPLE_RATE)
        chunks: list[npt.NDArray[Any]] = []
        try:
            for frame in container.decode(stream):
                chunks.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(frame))
            chunks.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(None))
        except av.error.FFmpegError as exc:
            raise AudioDecodeError(f"{path}: cannot decode: {exc}") from exc
    if not chunks:
        return np.zeros(0, dtype=np.int16)
    return np.concatenate(chunks).astype(np.int16, copy=False)


def load_audio(path: str | Path) -> Samples:
    """Decode any audio file into 16 kHz mono int16 samples."""
    path = Path(path)
    if not path.is_file():
        raise AudioDecodeError(f"{path}: no such file")
    if path.suffix.lower() == ".wav":
        samples = _read_plain_wav(path)
        if samples is not None:
            return samples
    return _decode_with_av(path)
