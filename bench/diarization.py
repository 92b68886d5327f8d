"""Diarization benchmark: who said each word, on mixes of real and synthetic speakers.

Builds meeting-like mixes at run time (bench/mixes.py; nothing is stored): 1–4 corpus
speakers, and 1–4 espeak-ng voices, in turns of 1–15 s with gaps of 0.2–1 s.

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
    .venv/bin/python -m bench.diarization --meetings tune:4 heldout:12 heldout-corpus:6

`--meetings` runs bench/meetings.py's short four-voice meetings instead (the tune voices,
held-out espeak-ng voices, rates and pitches, held-out corpus speakers), with a summary
per set: words right, and meetings where 3-5 speakers were found.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench import meetings
from bench.mixes import ALL, SAMPLE_RATE, FloatArray, Mix, Word, build
from engine.api import SpeakerWindows
from engine.speakers import SpeakerEncoder
from session.diarizer import Diarizer, DiarizerConfig
from session.segmenter import Segmenter, SegmenterConfig, UtteranceEnded
from session.vad import WINDOW, SileroVad, VadState


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
                Labelled(
                    key, start, end, diarizer.assign(key, start, end, part.embedding, part.windows)
                )
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
    parser.add_argument(
        "--meetings", nargs="*", default=[], help="SET:COUNT of bench/meetings.py's sets"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    vad = SileroVad()
    encoder = SpeakerEncoder()
    config = DiarizerConfig()
    if args.meetings:
        mixes = [
            mix
            for spec in args.meetings
            for mix in meetings.build(spec.split(":")[0], int(spec.split(":")[1]), vad, args.seed)
        ]
    else:
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
    for kind in sorted({o.name.rsplit("-", 1)[0] for o in outcomes}) if args.meetings else []:
        group = [o for o in outcomes if o.name.rsplit("-", 1)[0] == kind]
        right = sum(o.final * o.words for o in group) / max(1, sum(o.words for o in group))
        lowest = min(o.final for o in group)
        print(
            f"{kind}: {right:.1%} of words right (lowest meeting {lowest:.1%}),"
            f" 3-5 speakers found in {sum(3 <= o.found <= 5 for o in group)}/{len(group)}"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))


if __name__ == "__main__":
    main()
