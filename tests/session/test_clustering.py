"""Speaker clustering on synthetic embeddings: clusters at different scales and sizes."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from engine.api import SpeakerWindows
from session.clustering import (
    cluster,
    linkage_cut,
    neighbour_counts,
    silhouette,
    spectral,
    window_points,
)
from session.diarizer import Diarizer

SIZE = 256
Vectors = npt.NDArray[np.float64]


def _unit(v: Vectors) -> Vectors:
    out: Vectors = v / np.linalg.norm(v, axis=-1, keepdims=True)
    return out


def voices(
    rng: np.random.Generator, count: int, between: float, within: float, points: int
) -> list[Vectors]:
    """`points` unit vectors for each of `count` voices: two of one voice are ≈ `within`
    alike, two of different voices ≈ `between` × `within`."""
    base = _unit(rng.standard_normal(SIZE))
    spread = _unit(rng.standard_normal((count, SIZE)))
    centres = _unit(np.sqrt(between) * base + np.sqrt(1 - between) * spread)
    noise = np.sqrt((1 - within) / within / SIZE)
    return [_unit(c + noise * rng.standard_normal((points, SIZE))) for c in centres]


def found(labels: npt.NDArray[np.int64], sizes: list[int]) -> list[set[int]]:
    """The labels each true voice's points got (points come voice after voice)."""
    edges = np.cumsum([0, *sizes])
    return [set(labels[a:b].tolist()) for a, b in itertools.pairwise(edges)]


def test_spectral_separates_close_voices_beside_a_far_one() -> None:
    """Three voices as alike as synthetic ones (0.83 between, 0.91 within) and one far:
    spectral finds all four; the silhouette prefers two (why it no longer decides)."""
    rng = np.random.default_rng(1)
    points = np.concatenate([*voices(rng, 3, 0.92, 0.91, 25), *voices(rng, 1, 0.0, 0.91, 25)])
    groups = found(spectral(points, 6), [25] * 4)
    assert all(len(g) == 1 for g in groups)
    assert len(set.union(*groups)) == 4
    weights = np.ones(100)
    distance = 1.0 - points @ points.T
    four = [list(range(i, i + 25)) for i in range(0, 100, 25)]
    two = [list(range(75)), list(range(75, 100))]
    assert silhouette(distance, weights, two) > silhouette(distance, weights, four)
    assert len(cluster(points, weights, 6, 0.4)) == 2


def test_spectral_is_blind_to_scale() -> None:
    """Three voices far apart (real speech: 0.4 between) or close (0.79): three clusters."""
    for between, within in ((0.5, 0.8), (0.85, 0.93)):
        rng = np.random.default_rng(2)
        points = np.concatenate(voices(rng, 3, between, within, 20))
        groups = found(spectral(points, 6), [20] * 3)
        assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 3


def test_spectral_finds_a_voice_that_says_little() -> None:
    """Voices with 60, 30 and 8 points (a speaker with 8 % of the talk) stay apart."""
    rng = np.random.default_rng(3)
    sizes = [60, 30, 8]
    clouds = voices(rng, 3, 0.85, 0.91, max(sizes))
    points = np.concatenate([c[:n] for c, n in zip(clouds, sizes, strict=True)])
    groups = found(spectral(points, 6), sizes)
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 3


def test_spectral_one_voice_and_tiny_inputs() -> None:
    """One voice is one cluster; under four points there is nothing to tell apart."""
    rng = np.random.default_rng(4)
    assert set(spectral(voices(rng, 1, 0.0, 0.85, 60)[0], 6).tolist()) == {0}
    assert spectral(np.concatenate(voices(rng, 3, 0.2, 0.9, 1)), 6).tolist() == [0, 0, 0]
    tried = neighbour_counts(100, 0.25, 12)
    assert tried[0] == 2 and tried[-1] == 25 and len(tried) == 12 == len(set(tried))
    assert neighbour_counts(8, 0.25, 12) == [2]


def test_window_points_average_runs_past_the_cap() -> None:
    """Under the cap every window is a point; over it, runs of neighbours are averaged
    within a segment (never across two), weighted by their seconds."""
    rng = np.random.default_rng(5)
    a, b = voices(rng, 2, 0.3, 0.9, 5)
    groups = [(a, np.full(5, 1.6)), (b[:3], np.array([1.6, 1.6, 0.8]))]
    points, owners, seconds = window_points(groups, 8)
    assert len(points) == 8 and owners.tolist() == [0] * 5 + [1] * 3
    points, owners, seconds = window_points(groups, 4)
    assert owners.tolist() == [0, 0, 0, 1, 1]
    assert seconds.tolist() == [3.2, 3.2, 1.6, 3.2, 0.8]
    assert np.allclose(points[0], _unit(a[0] + a[1]))
    assert np.allclose(np.linalg.norm(points, axis=1), 1.0)


def test_recluster_finds_four_voices_from_their_windows() -> None:
    """Segments of four voices (three close, one far), each with its windows: the
    re-clustering gives each voice its own label."""
    rng = np.random.default_rng(6)
    clouds = [*voices(rng, 3, 0.92, 0.91, 36), *voices(rng, 1, 0.0, 0.91, 36)]
    diarizer = Diarizer()
    order = [0, 1, 2, 3, 1, 0, 2, 3, 0, 2, 1, 3] * 3
    for n, speaker in enumerate(order):
        used = sum(1 for s in order[:n] if s == speaker)
        windows = clouds[speaker][3 * used : 3 * used + 3].astype(np.float32)
        bounds = tuple((i * 25_600, (i + 1) * 25_600) for i in range(3))
        mean = _unit(windows.astype(np.float64).sum(0)).astype(np.float32)
        diarizer.assign(f"u{n}", 5.0 * n, 5.0 * n + 4.8, mean, SpeakerWindows(bounds, windows))
    diarizer.recluster()
    labels = [diarizer.label_of(f"u{n}") for n in range(len(order))]
    by_voice = [{labels[n] for n, s in enumerate(order) if s == v} for v in range(4)]
    assert all(len(g) == 1 for g in by_voice)
    assert len(set.union(*by_voice)) == 4


def test_linkage_cut_counts_close_voices_and_loose_ones() -> None:
    """Average linkage at an adaptive cut: four voices that sit close together (synthetic:
    ~0.75 between, ~0.93 within) and four loose ones (real: ~0.4 between, ~0.85 within)
    each come out as four clusters of their own segments."""
    rng = np.random.default_rng(7)
    for spread, noise in ((0.45, 0.3), (1.2, 0.4)):
        common = rng.normal(size=64)
        centres = [common + spread * rng.normal(size=64) for _ in range(4)]
        rows, owners = [], []
        for speaker, centre in enumerate(centres):
            for _ in range(3):
                v = centre / np.linalg.norm(centre) + noise / 8 * rng.normal(size=64)
                rows.append(v / np.linalg.norm(v))
                owners.append(speaker)
        vectors = np.array(rows)
        clusters = linkage_cut(vectors, np.ones(len(rows)), ceiling=0.87, margin=0.08, floor=0.7)
        assert sorted(sorted(owners[i] for i in c) for c in clusters) == [
            [s] * 3 for s in range(4)
        ], (spread, [[owners[i] for i in c] for c in clusters])
