"""The shared speech corpus: manifest entries and their audio."""

from __future__ import annotations

import os
import wave
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

REPO = Path(__file__).resolve().parents[2]
CORPUS_DIR = Path(os.environ.get("PARLEY_CORPUS", REPO.parent / "shared" / "corpus"))


@dataclass(frozen=True, slots=True)
class Clip:
    id: str
    path: Path
    language: str
    duration: float
    reference: str

    def pcm16(self) -> bytes:
        with wave.open(str(self.path), "rb") as wav:
            assert wav.getframerate() == 16_000 and wav.getnchannels() == 1
            assert wav.getsampwidth() == 2
            return wav.readframes(wav.getnframes())

    def samples(self) -> npt.NDArray[np.float32]:
        return np.frombuffer(self.pcm16(), dtype="<i2").astype(np.float32) / 32768.0


@cache
def clips() -> dict[str, Clip]:
    entries = {}
    for line in (CORPUS_DIR / "manifest.jsonl").read_bytes().splitlines():
        if not line.strip():
            continue
        item = orjson.loads(line)
        entries[item["id"]] = Clip(
            id=item["id"],
            path=CORPUS_DIR / item["path"],
            language=item["language"],
            duration=float(item["duration_s"]),
            reference=item["reference_text"],
        )
    return entries


def clip(clip_id: str) -> Clip:
    return clips()[clip_id]
