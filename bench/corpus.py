"""The speech corpus (`shared/corpus` beside the checkout's folder): manifest and audio.

Set `PARLEY_CORPUS` to read it from elsewhere. The corpus is read-only.
"""

from __future__ import annotations

import json
import os
import wave
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.api import SAMPLE_RATE, AudioArray

CORPUS_ENV = "PARLEY_CORPUS"
DEFAULT_CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"


@dataclass(frozen=True, slots=True)
class Clip:
    """One manifest entry: an id, where its audio is, and what was said."""

    id: str
    language: str
    duration: float
    reference: str
    path: Path

    def audio(self) -> AudioArray:
        return read_wav(self.path)


def corpus_dir() -> Path:
    return Path(os.environ.get(CORPUS_ENV) or DEFAULT_CORPUS)


def clips(ids: Iterable[str] | None = None) -> list[Clip]:
    """Every clip in manifest order, or those whose id starts with one of `ids`."""
    root = corpus_dir()
    prefixes = tuple(ids) if ids is not None else ("",)
    with (root / "manifest.jsonl").open(encoding="utf-8") as manifest:
        entries = [json.loads(line) for line in manifest if line.strip()]
    return [
        Clip(
            id=entry["id"],
            language=entry["language"],
            duration=float(entry["duration_s"]),
            reference=entry["reference_text"],
            path=root / entry["path"],
        )
        for entry in entries
        if entry["id"].startswith(prefixes)
    ]


def read_wav(path: Path) -> AudioArray:
    """A 16 kHz mono 16-bit WAV as float32 samples in [-1, 1)."""
    with wave.open(str(path), "rb") as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (SAMPLE_RATE, 1, 2):
            raise ValueError(f"{path}: expected 16 kHz mono 16-bit PCM")
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    return (pcm / 32768.0).astype(np.float32)
