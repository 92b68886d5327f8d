"""Short meetings of four voices taking turns (40–50 s), built at run time, in two sets:

- `tune`: the espeak-ng voices the diarizer's settings were tuned on (bench/mixes.py's
  VOICES, at the default rate and pitch);
- `heldout`: voices, rates and pitches the tuning never used: each meeting draws four
  voices from HELDOUT_VOICES (other languages' accents, other variants), each with its own
  rate (130–200 words a minute) and pitch (25–75), and speaks sentences the tuning never
  used; plus meetings of held-out corpus speakers (speakers none of bench/mixes.py's
  corpus mixes use).

A turn is one or two sentences (one corpus clip, or a 2–8 s cut of one); turns follow
each other with 0.2–0.9 s gaps and no voice twice in a row, until the meeting holds
40 s (at most 50 s). Each word carries its speaker and an estimated time (bench/mixes.py).
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.corpus import clips, read_wav
from bench.mixes import (
    SAMPLE_RATE,
    SENTENCES,
    VOICES,
    FloatArray,
    Mix,
    Turn,
    Word,
    speaker_of,
    timed_words,
    turns_of,
    voiced,
)
from session.vad import SileroVad

HELDOUT_VOICES = (
    "en+m1",
    "en+m2",
    "en-us+m4",
    "en-gb+m5",
    "en+m6",
    "en-us+m8",
    "en+f1",
    "en-us+f2",
    "en-gb+f5",
    "en-gb-scotland+m2",
    "en-029+f1",
    "en-gb-x-rp+m4",
    "en-us-nyc+f3",
    "en+Andy",
    "en+Annie",
    "en+david",
    "en+linda",
    "en+edward",
    "en+steph",
    "en+paul",
)
# Speakers none of bench/mixes.py's corpus mixes use (its JFK/LJ/1221/2412/… stay out).
HELDOUT_CORPUS = (
    "1089",
    "61",
    "1272",
    "13697",
    "leopard_de",
    "leopard_fr",
    "leopard_it",
    "leopard_pt",
    "leopard_es",
)
HELDOUT_SENTENCES = (
    "Good morning, can everyone see my screen now?",
    "The budget for the next quarter is still under review by finance.",
    "I would rather we ship a smaller feature than miss the deadline again.",
    "Has anybody looked at the support tickets from the weekend?",
    "Three of them were about the login page timing out.",
    "We should add a retry there and log the slow requests.",
    "My vote goes to the simpler design, it is easier to test.",
    "Can we move the planning meeting to Tuesday afternoon?",
    "The contract with the vendor ends in March, so we need a decision soon.",
    "I spoke with the legal team yesterday and they had no objections.",
    "Let me check the numbers and get back to you by tonight.",
    "Honestly I am not convinced the survey results are representative.",
    "The new hire starts next week and will join the platform team.",
    "Please send the slides to the whole group after the call.",
    "We are almost out of time, any last questions?",
    "The mobile app crashed twice during the demo, which was embarrassing.",
    "Our biggest customer wants a discount if they sign for two years.",
    "I have drafted the announcement, it just needs a final review.",
)


@dataclass(frozen=True, slots=True)
class Voice:
    name: str  # espeak-ng voice, e.g. en-us+f2
    rate: int  # words per minute
    pitch: int  # 0..99

    def label(self) -> str:
        return f"{self.name}@{self.rate}/{self.pitch}"


def speak(voice: Voice, text: str, workdir: Path) -> FloatArray:
    """espeak-ng → 16 kHz mono float32 (through sox)."""
    raw, out = workdir / "say.wav", workdir / "say16.wav"
    command = ["espeak-ng", "-v", voice.name, "-s", str(voice.rate), "-p", str(voice.pitch)]
    subprocess.run([*command, "-w", str(raw), text], check=True)
    subprocess.run(
        ["sox", "-V1", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True
    )
    return read_wav(out)


def interleave(
    name: str, turns: dict[str, list[Turn]], rng: np.random.Generator, low: float = 40.0
) -> Mix:
    """Turns in a random order, no speaker twice in a row, gaps of 0.2–0.9 s, until the
    meeting holds `low` s (never past 50 s)."""
    queues = {s: list(t) for s, t in turns.items()}
    for queue in queues.values():
        rng.shuffle(queue)
    pieces: list[FloatArray] = []
    words: list[tuple[str, float, str]] = []
    position = 0
    last: str | None = None
    while position < low * SAMPLE_RATE:
        choices = [s for s, q in queues.items() if q and s != last]
        if not choices:
            break
        # the speaker who spoke least so far goes first more often: everyone gets turns
        spoken = np.array([len(turns[s]) - len(queues[s]) for s in choices], np.float64)
        weights = np.exp(-spoken)
        speaker = choices[int(rng.choice(len(choices), p=weights / weights.sum()))]
        turn = queues[speaker].pop()
        if position + len(turn.audio) > 50 * SAMPLE_RATE:
            continue
        gap = np.zeros(int(rng.uniform(0.2, 0.9) * SAMPLE_RATE), np.float32)
        pieces.append(gap)
        position += len(gap)
        pieces.append(turn.audio)
        words.extend((w, position / SAMPLE_RATE + t, turn.speaker) for w, t in turn.words)
        position += len(turn.audio)
        last = speaker
    pieces.append(np.zeros(SAMPLE_RATE // 2, np.float32))
    return Mix(
        name,
        np.concatenate(pieces),
        tuple(Word(w, t, s) for w, t, s in words),
        tuple(s for s in turns if any(w[2] == s for w in words)),
    )


def synthetic(
    name: str, voices: Sequence[Voice], sentences: Sequence[str], vad: SileroVad, seed: int
) -> Mix:
    rng = np.random.default_rng(seed)
    turns: dict[str, list[Turn]] = {v.label(): [] for v in voices}
    order = list(sentences)
    rng.shuffle(order)
    with tempfile.TemporaryDirectory() as tmp:
        for i, voice in enumerate(voices):
            for j in range(5):  # five turns each, more than a meeting uses
                first = order[(i * 5 + j) % len(order)]
                text = first
                if rng.random() < 0.35:
                    text = f"{first} {order[(i * 5 + j + 7) % len(order)]}"
                audio = speak(voice, text, Path(tmp))
                turns[voice.label()].append(Turn(voice.label(), audio, _whole(text, audio, vad)))
    return interleave(name, turns, rng)


def _whole(text: str, audio: FloatArray, vad: SileroVad) -> tuple[tuple[str, float], ...]:
    return tuple(timed_words(text, voiced(audio, vad)))


def corpus_meeting(name: str, speakers: Sequence[str], vad: SileroVad, seed: int) -> Mix:
    rng = np.random.default_rng(seed)
    who = speaker_of()
    turns: dict[str, list[Turn]] = {s: [] for s in speakers}
    for clip in clips():
        speaker = who.get(clip.id)
        if speaker in turns and "longform" not in clip.id:
            turns[speaker].extend(turns_of(speaker, read_wav(clip.path), clip.reference, vad, rng))
    return interleave(name, turns, rng, low=min(40.0, _total(turns) * 0.9))


def _total(turns: dict[str, list[Turn]]) -> float:
    return sum(len(t.audio) for ts in turns.values() for t in ts) / SAMPLE_RATE


def build(which: str, count: int, vad: SileroVad, seed: int = 0) -> list[Mix]:
    """`count` meetings of the set `which` (tune, heldout or heldout-corpus)."""
    rng = np.random.default_rng(1000 + seed)
    out: list[Mix] = []
    for n in range(count):
        if which == "tune":
            voices = [Voice(v, 165, 50) for v in VOICES]
            out.append(synthetic(f"tune-{n}", voices, SENTENCES, vad, seed * 100 + n))
        elif which == "heldout":
            names = rng.choice(len(HELDOUT_VOICES), 4, replace=False)
            voices = [
                Voice(HELDOUT_VOICES[i], int(rng.integers(130, 201)), int(rng.integers(25, 76)))
                for i in names
            ]
            out.append(
                synthetic(f"heldout-{n}", voices, HELDOUT_SENTENCES, vad, seed * 100 + 50 + n)
            )
        elif which == "heldout-corpus":
            chosen = rng.choice(len(HELDOUT_CORPUS), 4, replace=False)
            speakers = [HELDOUT_CORPUS[i] for i in chosen]
            out.append(corpus_meeting(f"corpus-{n}", speakers, vad, seed * 100 + 80 + n))
        else:
            raise ValueError(f"unknown set {which!r}")
    return out
