"""The sans-I/O diarizer on synthetic embeddings: labels, splits, re-clustering."""

from __future__ import annotations

import numpy as np
import pytest

from engine.api import SpeakerWindows
from engine.speakers import EMBEDDING_SIZE
from session.clustering import cluster
from session.diarizer import Diarizer, DiarizerConfig, Segment

RNG = np.random.default_rng(7)
CENTRES = [
    0.1 + (RNG.random(EMBEDDING_SIZE) < 0.3) * np.abs(RNG.standard_normal(EMBEDDING_SIZE)) * 2
    for _ in range(3)
]


def voice(speaker: int, noise: float = 0.6) -> np.ndarray:
    """A unit vector near speaker `speaker`'s centre (same ≈ 0.94, other ≈ 0.53 alike)."""
    v = CENTRES[speaker] + noise * np.abs(RNG.standard_normal(EMBEDDING_SIZE))
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_two_speakers_get_two_labels() -> None:
    """Alternating speakers get two stable labels online; one speaker keeps one."""
    diarizer = Diarizer()
    labels = [diarizer.assign(f"u{i}", 3.0 * i, 3.0 * i + 2.5, voice(i % 2)) for i in range(8)]
    assert labels == ["S1", "S2"] * 4
    single = Diarizer()
    assert {single.assign(f"u{i}", 3.0 * i, 3.0 * i + 2.5, voice(0)) for i in range(8)} == {"S1"}
    assert single.recluster() == []


def test_recluster_fixes_a_wrong_online_label() -> None:
    """A segment labelled wrongly online is relabelled by the re-clustering, once."""
    diarizer = Diarizer()
    for i in range(6):
        diarizer.assign(f"u{i}", 3.0 * i, 3.0 * i + 2.5, voice(i % 2))
    diarizer.segments[2].label = "S2"  # as if the online guess had been wrong
    relabels = diarizer.recluster()
    assert [(r.key, r.label) for r in relabels] == [("u2", "S1")]
    assert diarizer.recluster() == []


def test_split_at_the_quiet_point_of_a_change() -> None:
    """An utterance of speaker A then B is cut once, at the pause between them."""
    diarizer = Diarizer()
    for i in range(4):
        diarizer.assign(f"u{i}", 3.0 * i, 3.0 * i + 2.5, voice(i % 2))
    window = 25_600
    bounds = tuple((i * window, (i + 1) * window) for i in range(4))
    embeddings = np.stack([voice(0), voice(0), voice(1), voice(1)])
    audio = np.full(4 * window, 0.1, np.float32)
    pause = 2 * window - 3_000
    audio[pause : pause + 1_600] = 0.0
    parts = diarizer.parts(audio, SpeakerWindows(bounds, embeddings))
    assert len(parts) == 2
    assert abs(parts[0].end - (pause + 800)) < 1_000
    labels = [diarizer.assign(f"p{n}", 0, 3.0, p.embedding) for n, p in enumerate(parts)]
    assert labels == ["S1", "S2"]
    same = np.stack([voice(1) for _ in range(4)])
    assert len(diarizer.parts(audio, SpeakerWindows(bounds, same))) == 1


def test_cluster_count_by_silhouette() -> None:
    """Three voices give three clusters; one voice gives one; at most max_clusters."""
    vectors = np.stack([voice(i % 3) for i in range(30)]).astype(np.float64)
    weights = np.full(30, 3.0)
    found = cluster(vectors, weights, 6, 0.4)
    assert sorted(sorted(i % 3 for i in c) for c in found) == [[0] * 10, [1] * 10, [2] * 10]
    one = np.stack([voice(0) for _ in range(20)]).astype(np.float64)
    assert len(cluster(one, np.full(20, 3.0), 6, 0.4)) == 1
    assert len(cluster(vectors, weights, 2, 0.4)) == 2


def test_labels_stay_after_a_recluster() -> None:
    """Re-clustering keeps each speaker's label: S1 stays S1 even if S2 spoke more."""
    diarizer = Diarizer(DiarizerConfig(recluster_every_s=5.0))
    diarizer.assign("a", 0.0, 2.0, voice(0))
    diarizer.assign("a2", 2.0, 4.0, voice(0))
    for i in range(6):
        diarizer.assign(f"b{i}", 5.0 + 3 * i, 7.9 + 3 * i, voice(1))
    diarizer.recluster()
    assert diarizer.label_of("a") == "S1"
    assert diarizer.label_of("b0") == "S2"


@pytest.mark.timeout(30)
def test_twelve_speakers_keep_their_labels_through_a_relabelling() -> None:
    """Naming 12 clusters is an assignment, not 12! permutations (479 M tries, minutes
    under the GIL): each cluster keeps the label its segments carry, whatever the order."""
    order = np.random.default_rng(3).permutation(12)
    members = [
        [
            Segment(
                key=f"u{i}",
                start=float(i),
                end=i + 0.9,
                embedding=voice(i % 3),
                weight=0.9,
                label=f"S{order[i] + 1}",
                windows=voice(i % 3)[None, :],
                window_weights=np.array([0.9]),
            )
        ]
        for i in range(12)
    ]
    assert Diarizer()._name(members) == [f"S{j + 1}" for j in order]
