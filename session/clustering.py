"""Clustering of speaker embeddings, with the number of speakers unknown.

- `spectral`: spectral clustering of window embeddings on a cosine affinity pruned to each
  row's p nearest neighbours, the number of clusters read from the eigengap of the graph
  Laplacian, and p chosen where that eigengap is clearest (Park et al. 2019, "Auto-tuning
  spectral clustering for speaker diarization using normalized maximum eigengap"). Keeping
  only each point's nearest neighbours makes it blind to how far apart voices lie in
  absolute terms: synthetic voices whose different speakers are as alike (cosine ≈ 0.83)
  as one real speaker's utterances are to each other still come apart.
- `cluster`: average-linkage agglomerative clustering on cosine similarity, the count
  chosen by silhouette: good with few points, where the eigengap is noise.
- `silhouette`, `absorb_small`: to judge a partition and to fold clusters too light to be
  a speaker; `window_points`: the points spectral clustering sees.

Plain numpy, no state: `session/diarizer.py` calls these when it re-clusters a source.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def cluster(
    vectors: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    max_clusters: int,
    min_silhouette: float,
) -> list[list[int]]:
    """Average-linkage agglomerative clustering on cosine similarity (rows are unit
    vectors, weighted by `weights`), with the number of clusters chosen by silhouette:
    among the dendrogram's cuts into 2..`max_clusters` clusters the one with the highest
    weighted mean silhouette, unless even that is below `min_silhouette` (one cluster)."""
    count = len(vectors)
    similarity = np.clip(vectors @ vectors.T, -1.0, 1.0)
    cuts = _dendrogram_cuts(similarity, weights, max_clusters)
    best: tuple[float, list[list[int]]] = (min_silhouette, [list(range(count))])
    for k in range(2, min(max_clusters, count) + 1):
        score = silhouette(1.0 - similarity, weights, cuts[k])
        if score > best[0]:
            best = (score, cuts[k])
    return best[1]


def linkage_cut(
    vectors: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    *,
    ceiling: float,
    margin: float,
    floor: float,
    close: float = 0.6,
    share: int = 3,
) -> list[list[int]]:
    """Average-linkage agglomerative clustering on cosine similarity (rows are unit
    vectors, weighted by `weights`), merging while two clusters are alike enough: the
    count follows from how alike voices are, not from a score that needs many points
    (with a few segments per speaker, silhouette and eigengap are noise).

    "Alike enough" is `margin` below how alike one speaker's segments are here, kept
    within [`floor`, `ceiling`]:
    - where the voices sit close together (a quarter of all pairs at least `close`
      alike: synthetic voices, whose different speakers are 0.7-0.9 alike and one
      speaker's segments ~0.94), one threshold for all: `margin` below the mean
      similarity of the most alike 1/`share` of segments to their nearest neighbour;
    - else (real voices, different speakers ~0.55 alike, one speaker's segments 0.75-0.95
      depending on the speaker), a threshold per pair of clusters: `margin` below the
      looser cluster's own similarity of its segments to their nearest neighbours (a
      tight reader and a loose talker in one meeting each keep their own scale)."""
    count = len(vectors)
    if count < 2:
        return [list(range(count))]
    sim = np.clip(vectors @ vectors.T, -1.0, 1.0)
    pairs = sim[np.triu_indices(count, 1)]
    np.fill_diagonal(sim, -np.inf)
    nearest = sim.max(axis=1)
    if float(np.percentile(pairs, 25)) >= close:
        own = np.full(count, float(np.sort(nearest)[::-1][: max(1, count // share)].mean()))
    else:
        own = nearest.copy()
    sizes = weights.astype(np.float64).copy()
    members: list[list[int]] = [[i] for i in range(count)]
    alive = np.ones(count, bool)
    for _ in range(count - 1):
        threshold = np.clip(np.minimum(own[:, None], own[None, :]) - margin, floor, ceiling)
        a, b = divmod(int(np.argmax(sim - threshold)), count)
        if sim[a, b] < threshold[a, b]:
            break
        merged = (sim[a] * sizes[a] + sim[b] * sizes[b]) / (sizes[a] + sizes[b])
        sim[a, :] = merged
        sim[:, a] = merged
        sim[a, a] = -np.inf
        sim[b, :] = -np.inf
        sim[:, b] = -np.inf
        own[a] = (own[a] * sizes[a] + own[b] * sizes[b]) / (sizes[a] + sizes[b])
        sizes[a] += sizes[b]
        members[a].extend(members[b])
        members[b] = []
        alive[b] = False
    return [members[i] for i in range(count) if alive[i]]


def absorb_small(
    clusters: list[list[int]],
    vectors: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    min_weight: float,
) -> list[list[int]]:
    """Fold clusters lighter than `min_weight` into the cluster most alike."""
    clusters = sorted(clusters, key=lambda c: -weights[c].sum())
    while len(clusters) > 1 and weights[clusters[-1]].sum() < min_weight:
        small = clusters.pop()
        centre = unit((vectors[small] * weights[small, None]).sum(0))
        sims = [float(unit((vectors[c] * weights[c, None]).sum(0)) @ centre) for c in clusters]
        clusters[int(np.argmax(sims))].extend(small)
    return clusters


def _dendrogram_cuts(
    similarity: npt.NDArray[np.float64], weights: npt.NDArray[np.float64], max_clusters: int
) -> dict[int, list[list[int]]]:
    """The clusters at each count 1..max_clusters, merging the most alike pair each step
    (Lance–Williams update for average linkage: the merged row is the weighted mean)."""
    count = len(similarity)
    sim = similarity.copy()
    np.fill_diagonal(sim, -np.inf)
    sizes = weights.astype(np.float64).copy()
    members: list[list[int]] = [[i] for i in range(count)]
    alive = np.ones(count, bool)
    cuts: dict[int, list[list[int]]] = {}
    for clusters in range(count, 0, -1):
        if clusters <= max_clusters:
            cuts[clusters] = [list(members[i]) for i in range(count) if alive[i]]
        if clusters == 1:
            break
        a, b = divmod(int(np.argmax(sim)), count)
        merged = (sim[a] * sizes[a] + sim[b] * sizes[b]) / (sizes[a] + sizes[b])
        sim[a, :] = merged
        sim[:, a] = merged
        sim[a, a] = -np.inf
        sim[b, :] = -np.inf
        sim[:, b] = -np.inf
        sizes[a] += sizes[b]
        members[a].extend(members[b])
        members[b] = []
        alive[b] = False
    return cuts


def silhouette(
    distance: npt.NDArray[np.float64], weights: npt.NDArray[np.float64], clusters: list[list[int]]
) -> float:
    """Weighted mean silhouette (a member of a singleton cluster scores 0)."""
    assignment = np.empty(len(distance), int)
    for c, group in enumerate(clusters):
        assignment[group] = c
    # Weighted mean distance from every point to every cluster: [n, k].
    mass = np.zeros((len(distance), len(clusters)))
    for c, group in enumerate(clusters):
        mass[:, c] = distance[:, group] @ weights[group]
    totals = np.array([weights[g].sum() for g in clusters])
    own = assignment
    rows = np.arange(len(distance))
    own_total = totals[own] - weights  # leave the point itself out
    inner = np.where(own_total > 0, mass[rows, own] / np.maximum(own_total, 1e-12), 0.0)
    between = mass / totals[None, :]
    between[rows, own] = np.inf
    outer = between.min(axis=1)
    score = np.where(
        own_total > 0, (outer - inner) / np.maximum(np.maximum(outer, inner), 1e-12), 0.0
    )
    return float(score @ weights / weights.sum())


def spectral(
    vectors: npt.NDArray[np.float64],
    max_clusters: int,
    max_neighbour_share: float = 0.25,
    searches: int = 12,
) -> npt.NDArray[np.int64]:
    """A cluster index per row of `vectors` (unit vectors), by auto-tuned spectral clustering.

    For each candidate p (2 .. `max_neighbour_share` of the points, at most `searches`
    values): keep each row's p most alike points (itself included) as edges of weight 1,
    symmetrise, and take the eigenvalues of the graph Laplacian. The number of clusters is
    where the first `max_clusters` + 1 eigenvalues jump most; p is the one whose jump,
    relative to the largest eigenvalue, is largest for its size (the least p / gap). The
    points are then k-means clustered on the Laplacian's first k eigenvectors."""
    count = len(vectors)
    max_clusters = min(max_clusters, count - 1)
    if count < 4 or max_clusters < 2:
        return np.zeros(count, np.int64)
    order = np.argsort(-(vectors @ vectors.T), axis=1, kind="stable")
    best: tuple[float, int, npt.NDArray[np.float64]] | None = None
    for p in neighbour_counts(count, max_neighbour_share, searches):
        laplacian = _laplacian(order, p)
        eigenvalues = np.linalg.eigvalsh(laplacian)
        gaps = np.diff(eigenvalues[: max_clusters + 1])
        gap = float(gaps.max()) / max(float(eigenvalues[-1]), 1e-10)
        if gap > 1e-9 and (best is None or p / gap < best[0]):
            best = (p / gap, int(np.argmax(gaps)) + 1, laplacian)
    if best is None or best[1] == 1:
        return np.zeros(count, np.int64)
    _, clusters, laplacian = best
    _, eigenvectors = np.linalg.eigh(laplacian)
    return kmeans(eigenvectors[:, :clusters], clusters)


def neighbour_counts(count: int, max_share: float, searches: int) -> list[int]:
    """The p values to try: 2 .. max_share of `count`, at most `searches` of them."""
    top = max(2, int(count * max_share))
    return sorted({round(float(p)) for p in np.linspace(2, top, min(searches, top - 1))})


def _laplacian(order: npt.NDArray[np.int64], neighbours: int) -> npt.NDArray[np.float64]:
    """The normalised Laplacian I - D^-1/2 A D^-1/2 of the graph A linking each row to the
    others among its first `neighbours` in `order` (itself left out; symmetrised).
    Normalised, the eigengap does not favour large clusters over a speaker who says
    little."""
    count = len(order)
    graph = np.zeros((count, count))
    graph[np.arange(count)[:, None], order[:, :neighbours]] = 1.0
    np.fill_diagonal(graph, 0.0)
    graph = 0.5 * (graph + graph.T)
    scale = 1.0 / np.sqrt(graph.sum(axis=1))  # neighbours >= 2: every row links to another
    laplacian: npt.NDArray[np.float64] = np.eye(count) - scale[:, None] * graph * scale[None, :]
    return laplacian


def kmeans(
    points: npt.NDArray[np.float64], clusters: int, iterations: int = 100
) -> npt.NDArray[np.int64]:
    """Lloyd's k-means from a farthest-point start (deterministic: the first centre is the
    point farthest from the mean)."""
    centres = [int(np.argmax(((points - points.mean(axis=0)) ** 2).sum(axis=1)))]
    nearest = ((points - points[centres[0]]) ** 2).sum(axis=1)
    for _ in range(1, clusters):
        centres.append(int(np.argmax(nearest)))
        nearest = np.minimum(nearest, ((points - points[centres[-1]]) ** 2).sum(axis=1))
    means = points[centres].copy()
    labels = np.zeros(len(points), np.int64)
    for _ in range(iterations):
        distances = ((points[:, None, :] - means[None, :, :]) ** 2).sum(axis=2)
        labels = np.argmin(distances, axis=1)
        moved = np.stack(
            [
                points[labels == c].mean(axis=0) if (labels == c).any() else means[c]
                for c in range(clusters)
            ]
        )
        if np.allclose(moved, means):
            break
        means = moved
    return labels


def window_points(
    groups: Sequence[tuple[npt.NDArray[np.floating], npt.NDArray[np.float64]]], max_points: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The points to cluster from each group's (segment's) window embeddings and their
    seconds: unit rows, the group each belongs to, and the seconds it stands for. When
    there are more than `max_points` windows, runs of a group's neighbouring windows are
    averaged (runs of the fewest windows that keep the count at most `max_points`)."""
    total = sum(len(vectors) for vectors, _ in groups)
    run = max(1, -(-total // max_points))  # ceil
    rows: list[npt.NDArray[np.float64]] = []
    owners: list[int] = []
    seconds: list[float] = []
    for index, (vectors, weights) in enumerate(groups):
        for first in range(0, len(vectors), run):
            part = weights[first : first + run]
            rows.append(unit(part @ vectors[first : first + run]))
            owners.append(index)
            seconds.append(float(part.sum()))
    return np.stack(rows), np.array(owners, np.int64), np.array(seconds)


def unit(vector: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    norm = float(np.linalg.norm(vector))
    out: npt.NDArray[np.float64] = (vector / norm if norm > 0 else vector).astype(np.float64)
    return out
