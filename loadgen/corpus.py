"""The speech corpus (manifest + WAVs) and the meeting-like scripts the load generator plays.

A room's script is one conversation: clips from the manifest, cycled from a per-room
starting point, separated by 1-2 s of silence, spoken in turn by its participants. Each
participant streams the whole timeline (silence while others speak), so every source
stays connected and real time for the whole meeting, as in a real call.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from loadgen.audio import Samples, load_audio
from loadgen.client import Track
from wire.codes import DEFAULT_SAMPLE_RATE

CORPUS_ENV = "PARLEY_CORPUS"


def default_corpus_dir() -> Path:
    """$PARLEY_CORPUS, else the folder `shared/corpus` beside the checkout's own folder."""
    if env := os.environ.get(CORPUS_ENV):
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


@dataclass(frozen=True, slots=True)
class Clip:
    id: str
    language: str
    duration_s: float
    reference_text: str
    path: Path


def load_manifest(corpus_dir: Path) -> list[Clip]:
    """Every clip listed in `corpus_dir/manifest.jsonl`."""
    manifest = corpus_dir / "manifest.jsonl"
    if not manifest.is_file():
        raise FileNotFoundError(f"no corpus manifest at {manifest} (set --corpus or ${CORPUS_ENV})")
    clips = []
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            clips.append(
                Clip(
                    id=str(row["id"]),
                    language=str(row["language"]),
                    duration_s=float(row["duration_s"]),
                    reference_text=str(row["reference_text"]),
                    path=corpus_dir / str(row["path"]),
                )
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{manifest}:{number}: bad manifest row: {exc}") from None
    return clips


def select_clips(clips: Sequence[Clip], language: str, max_seconds: float) -> list[Clip]:
    """Clips of one language no longer than `max_seconds`, in manifest order."""
    chosen = [c for c in clips if c.language == language and c.duration_s <= max_seconds]
    if not chosen:
        raise ValueError(f"the corpus has no {language!r} clip of at most {max_seconds:g} s")
    return chosen


def decode_clips(clips: Sequence[Clip]) -> dict[str, Samples]:
    """The audio of each clip, decoded once and shared by every room that plays it."""
    return {clip.id: load_audio(clip.path) for clip in clips}


@dataclass(frozen=True, slots=True)
class Utterance:
    """One reference utterance: a clip placed on a participant's audio timeline."""

    participant: str
    clip_id: str
    start: float  # seconds on the participant's stream
    end: float
    text: str


@dataclass(frozen=True, slots=True)
class RoomPlan:
    meeting_id: str
    participants: tuple[str, ...]
    tracks: Mapping[str, Track]
    utterances: tuple[Utterance, ...]

    @property
    def audio_seconds(self) -> float:
        """Length of each participant's stream."""
        return next(iter(self.tracks.values())).total_samples / DEFAULT_SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class ScriptShape:
    """How a room's conversation is laid out in time."""

    duration_s: float = 60.0  # whole clips while any fits, skipping ones too long (at least one)
    gap_s: tuple[float, float] = (1.0, 2.0)  # silence between utterances, uniform
    lead_in_s: float = 0.5
    tail_s: float = 1.5


def _seconds(samples: int) -> float:
    return samples / DEFAULT_SAMPLE_RATE


def plan_room(
    meeting_id: str,
    participants: Sequence[str],
    clips: Sequence[Clip],
    audio: Mapping[str, Samples],
    shape: ScriptShape,
    rng: random.Random,
    first_clip: int = 0,
) -> RoomPlan:
    """Lay clips out as a conversation taken in turns by `participants`."""
    if not participants or not clips:
        raise ValueError("a room needs at least one participant and one clip")
    limit = round(shape.duration_s * DEFAULT_SAMPLE_RATE)
    cursor = round(shape.lead_in_s * DEFAULT_SAMPLE_RATE)
    placed: list[tuple[str, int, Clip]] = []  # (participant, start sample, clip)

    def length(index: int) -> int:
        return len(audio[clips[index % len(clips)].id])

    index = first_clip
    while True:
        if placed:  # the first clip always plays; later, the next one in cycle order that fits
            skip = next((k for k in range(len(clips)) if cursor + length(index + k) <= limit), None)
            if skip is None:
                break
            index += skip
        clip = clips[index % len(clips)]
        placed.append((participants[len(placed) % len(participants)], cursor, clip))
        cursor += length(index) + round(rng.uniform(*shape.gap_s) * DEFAULT_SAMPLE_RATE)
        index += 1
    _, last_start, last_clip = placed[-1]
    total = last_start + len(audio[last_clip.id]) + round(shape.tail_s * DEFAULT_SAMPLE_RATE)

    tracks: dict[str, Track] = {}
    for name in participants:
        pieces: list[Samples] = []
        position = 0
        for speaker, start, clip in placed:
            if speaker == name:
                pieces.append(np.zeros(start - position, dtype=np.int16))
                pieces.append(audio[clip.id])
                position = start + len(audio[clip.id])
        pieces.append(np.zeros(total - position, dtype=np.int16))
        tracks[name] = Track(tuple(p for p in pieces if len(p)))
    utterances = tuple(
        Utterance(
            participant=speaker,
            clip_id=clip.id,
            start=_seconds(start),
            end=_seconds(start + len(audio[clip.id])),
            text=clip.reference_text,
        )
        for speaker, start, clip in placed
    )
    return RoomPlan(meeting_id, tuple(participants), tracks, utterances)
