"""Can the speaker embeddings tell a mix's voices apart at all? (Diagnosis, not a score.)

For each mix of bench/mixes.py (the same ones bench/diarization.py scores), the
utterances the server's VAD and segmenter cut, embedded as the server embeds them
(engine/speakers.py: back-to-back 1.6 s windows), each with its true speaker (the one
saying most of its reference words). It prints, independently of any clustering:

- leave-one-out accuracy: each utterance's (and each window's) most alike other
  utterance (window) is of the same speaker ("1-NN"), and each utterance is most alike
  the centroid of its own speaker's other utterances ("centroid");
- cosine similarity of two utterances of the same voice and of each pair of voices
  (mean ± sd);
- the weighted silhouette of the true partition against that of average linkage's best
  cut (what a silhouette-chosen count would see).

    flock -x /tmp/parley-cpu.lock .venv/bin/python -m bench.separability --only espeak-4
"""

from __future__ import annotations

import argparse
import collections
import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from bench.diarization import embed_all, utterances
from bench.mixes import ALL, SAMPLE_RATE, Mix, build
from engine.api import SpeakerWindows
from engine.speakers import SpeakerEncoder
from session.clustering import cluster, silhouette, unit
from session.segmenter import UtteranceEnded
from session.vad import SileroVad

Vectors = npt.NDArray[np.float64]


def speaker_in(mix: Mix, start: float, end: float) -> str | None:
    """The speaker saying most of the reference words between two times."""
    said = collections.Counter(w.speaker for w in mix.words if start <= w.time < end)
    return said.most_common(1)[0][0] if said else None


def labelled(
    mix: Mix, events: Sequence[UtteranceEnded], windows: Sequence[SpeakerWindows]
) -> tuple[Vectors, Vectors, list[str], Vectors, list[str]]:
    """Utterance embeddings, their seconds and speakers; window embeddings and speakers."""
    utterance_rows: list[Vectors] = []
    seconds: list[float] = []
    speakers: list[str] = []
    window_rows: list[Vectors] = []
    window_speakers: list[str] = []
    for event, found in zip(events, windows, strict=True):
        who = speaker_in(mix, event.start / SAMPLE_RATE, event.end / SAMPLE_RATE)
        if who is None or not found.bounds:
            continue
        lengths = np.array([e - s for s, e in found.bounds], np.float64)
        utterance_rows.append(unit(lengths @ found.embeddings.astype(np.float64)))
        seconds.append(float(lengths.sum()) / SAMPLE_RATE)
        speakers.append(who)
        for (s, e), row in zip(found.bounds, found.embeddings, strict=True):
            start, end = (event.start + s) / SAMPLE_RATE, (event.start + e) / SAMPLE_RATE
            speaker = speaker_in(mix, start, end)
            if speaker is not None:
                window_rows.append(row.astype(np.float64))
                window_speakers.append(speaker)
    return (
        np.stack(utterance_rows),
        np.array(seconds),
        speakers,
        np.stack(window_rows),
        window_speakers,
    )


def nearest_neighbour(vectors: Vectors, speakers: Sequence[str]) -> float:
    similarity = vectors @ vectors.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = np.argmax(similarity, axis=1)
    return float(np.mean([speakers[j] == speakers[i] for i, j in enumerate(nearest)]))


def nearest_centroid(vectors: Vectors, weights: Vectors, speakers: Sequence[str]) -> float:
    names = sorted(set(speakers))
    labels = np.array([names.index(s) for s in speakers])
    right = 0
    for i in range(len(vectors)):
        scores = []
        for n in range(len(names)):
            others = (labels == n) & (np.arange(len(vectors)) != i)
            centre = (vectors[others] * weights[others, None]).sum(0)
            scores.append(float(unit(centre) @ vectors[i]) if others.any() else -np.inf)
        right += int(np.argmax(scores)) == labels[i]
    return right / len(vectors)


def report(mix: Mix, events: Sequence[UtteranceEnded], windows: Sequence[SpeakerWindows]) -> None:
    vectors, weights, speakers, window_vectors, window_speakers = labelled(mix, events, windows)
    names = sorted(set(speakers))
    print(
        f"{mix.name}: {len(vectors)} utterances, {len(window_vectors)} windows, "
        f"{len(names)} voices; leave-one-out 1-NN utterances "
        f"{nearest_neighbour(vectors, speakers):.1%}, windows "
        f"{nearest_neighbour(window_vectors, window_speakers):.1%}; centroid "
        f"{nearest_centroid(vectors, weights, speakers):.1%}"
    )
    similarity = vectors @ vectors.T
    upper = np.triu_indices(len(vectors), 1)
    for a, b in itertools.combinations_with_replacement(names, 2):
        pairs = [
            similarity[i, j]
            for i, j in zip(*upper, strict=True)
            if {speakers[i], speakers[j]} == {a, b}
        ]
        if pairs:
            kind = "same" if a == b else "diff"
            print(
                f"  {kind} {a:>20} ~ {b:<20} cosine {np.mean(pairs):.3f} ± {np.std(pairs):.3f}"
                f" (n={len(pairs)})"
            )
    if len(names) > 1:
        truth = [[i for i, s in enumerate(speakers) if s == n] for n in names]
        best = cluster(vectors, weights, 6, -1.0)
        distance = 1.0 - np.clip(similarity, -1.0, 1.0)
        print(
            f"  silhouette: true {len(truth)} voices {silhouette(distance, weights, truth):.3f},"
            f" average linkage's best cut ({len(best)} clusters) "
            f"{silhouette(distance, weights, best):.3f}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=list(ALL), help=f"mixes among {ALL}")
    parser.add_argument("--seed", type=int, default=0, help="another seed: other cuts and orders")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    vad = SileroVad()
    encoder = SpeakerEncoder()
    for mix in build(args.only, vad, args.seed):
        events = utterances(mix, vad)
        windows, _ = embed_all(encoder, [e.audio for e in events])
        report(mix, events, windows)


if __name__ == "__main__":
    main()
