"""Enrollment benchmark: how well an enrolled embedding names a voice, and how often it
names the wrong one, on corpus speakers (and espeak-ng voices as impostors).

Each corpus speaker with enough speech gives an enrollment (the first `--enrol-s` seconds
of its speech, as `POST /v1/speakers` keeps it: VAD-kept windows, their mean embedding)
and probes (its other speech, in pieces of `--probe-s` seconds: what a diarized cluster
holds when it is first matched). The speakers are split in two halves by a seeded
shuffle: the threshold is chosen on the tune half (the fewest misses plus false accepts,
the highest of equals), and reported on the held-out half, which the choice never saw.

- miss: a probe of an enrolled speaker whose best match is not its own name (below the
  threshold, or another name above it);
- false accept: a probe of a speaker who is not enrolled (every other speaker of the half,
  one at a time left out of the book, and the espeak-ng voices) that gets a name.

    .venv/bin/python -m bench.enrollment
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from bench.corpus import clips, read_wav
from bench.meetings import HELDOUT_SENTENCES, HELDOUT_VOICES, Voice, speak
from bench.mixes import SAMPLE_RATE, FloatArray, speaker_of
from engine.speakers import SpeakerEncoder
from session.vad import WINDOW, SileroVad, VadState

THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.60, 0.951, 0.025))


def speech(audio: FloatArray, vad: SileroVad) -> FloatArray:
    """The VAD-kept windows of a recording, joined (what enrollment embeds)."""
    state = VadState()
    count = len(audio) // WINDOW
    windows = audio[: count * WINDOW].reshape(count, WINDOW)
    keep = [w for w in windows if vad.score(w[None, :], [state])[0] >= 0.5]
    return np.concatenate(keep) if keep else np.zeros(0, np.float32)


def embed(encoder: SpeakerEncoder, audio: FloatArray) -> np.ndarray:
    windows = encoder.embed([audio])[0]
    weights = np.array([e - s for s, e in windows.bounds], np.float64)
    mean = weights @ windows.embeddings.astype(np.float64)
    return mean / np.linalg.norm(mean)


def corpus_voices(vad: SileroVad, min_s: float) -> dict[str, FloatArray]:
    """Speaker → all its speech (one-speaker clips, long-form left out)."""
    who = speaker_of()
    pieces: dict[str, list[FloatArray]] = {}
    for clip in clips():
        speaker = who.get(clip.id)
        if speaker is not None and "longform" not in clip.id:
            pieces.setdefault(speaker, []).append(speech(read_wav(clip.path), vad))
    joined = {s: np.concatenate(p) for s, p in pieces.items()}
    return {s: a for s, a in joined.items() if len(a) / SAMPLE_RATE >= min_s}


def synthetic_voices(vad: SileroVad, count: int) -> dict[str, FloatArray]:
    if shutil.which("espeak-ng") is None or shutil.which("sox") is None:
        return {}
    out: dict[str, FloatArray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in HELDOUT_VOICES[:count]:
            text = " ".join(HELDOUT_SENTENCES[:3])
            out[name] = speech(speak(Voice(name, 165, 50), text, Path(tmp)), vad)
    return out


def split(
    encoder: SpeakerEncoder, audio: FloatArray, enrol_s: float, probe_s: float
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The enrollment embedding (first `enrol_s` of speech) and the probes (the rest)."""
    cut = int(enrol_s * SAMPLE_RATE)
    size = int(probe_s * SAMPLE_RATE)
    rest = audio[cut:]
    probes = [embed(encoder, rest[i : i + size]) for i in range(0, len(rest) - size + 1, size)]
    return embed(encoder, audio[:cut]), probes


def rates(
    book: dict[str, np.ndarray],
    probes: dict[str, list[np.ndarray]],
    impostors: dict[str, list[np.ndarray]],
    threshold: float,
) -> tuple[float, float, int, int]:
    """(miss rate, false-accept rate, probes, impostor trials) at `threshold`."""
    names = sorted(book)
    matrix = np.stack([book[n] for n in names])
    misses = trials = 0
    for speaker, own in probes.items():
        for probe in own:
            sims = matrix @ probe
            best = int(np.argmax(sims))
            trials += 1
            misses += not (names[best] == speaker and sims[best] >= threshold)
    accepts = tries = 0
    for speaker, own in probes.items():  # each speaker as if it were not enrolled
        others = [i for i, n in enumerate(names) if n != speaker]
        for probe in own:
            tries += 1
            accepts += bool((matrix[others] @ probe >= threshold).any())
    for voice in impostors.values():
        for probe in voice:
            tries += 1
            accepts += bool((matrix @ probe >= threshold).any())
    return misses / max(1, trials), accepts / max(1, tries), trials, tries


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--enrol-s", type=float, default=5.0)
    parser.add_argument("--probe-s", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic", type=int, default=8, help="espeak-ng impostor voices")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    vad, encoder = SileroVad(), SpeakerEncoder()
    voices = corpus_voices(vad, args.enrol_s + args.probe_s)
    order = sorted(voices)
    np.random.default_rng(args.seed).shuffle(order)
    halves = {"tune": order[: len(order) // 2], "heldout": order[len(order) // 2 :]}
    synthetic = {
        name: [embed(encoder, audio)]
        for name, audio in synthetic_voices(vad, args.synthetic).items()
    }
    tables: dict[str, list[tuple[float, float, float, int, int]]] = {}
    for half, speakers in halves.items():
        book: dict[str, np.ndarray] = {}
        probes: dict[str, list[np.ndarray]] = {}
        for speaker in speakers:
            book[speaker], probes[speaker] = split(
                encoder, voices[speaker], args.enrol_s, args.probe_s
            )
        tables[half] = [(t, *rates(book, probes, synthetic, t)) for t in THRESHOLDS]
        print(f"{half}: {', '.join(speakers)}")
    # The fewest errors (misses + false accepts) on the tune half; of equals, the highest
    # threshold (the safer side: a miss leaves an S-label, a false accept a wrong name).
    chosen = min(tables["tune"], key=lambda row: (row[1] + row[2], -row[0]))[0]
    print(f"\n{'threshold':>9} | {'tune miss':>9} {'tune FA':>8} | {'held miss':>9} {'held FA':>8}")
    for (t, m1, f1, _, _), (_, m2, f2, _, _) in zip(tables["tune"], tables["heldout"], strict=True):
        mark = "  <- chosen on tune" if t == chosen else ""
        print(f"{t:>9.3f} | {m1:>9.1%} {f1:>8.1%} | {m2:>9.1%} {f2:>8.1%}{mark}")
    _, _, _, n1, i1 = tables["tune"][0]
    _, _, _, n2, i2 = tables["heldout"][0]
    print(
        f"probes of {args.probe_s:g} s against {args.enrol_s:g} s enrollments: "
        f"tune {n1} own / {i1} impostor trials, held-out {n2} / {i2} "
        f"({len(synthetic)} espeak-ng impostor voices in both)"
    )


if __name__ == "__main__":
    main()
