"""Clustering of speaker embeddings: average linkage on cosine similarity, cut by silhouette.

Plain numpy, no state: `session/diarizer.py` calls `cluster` when it re-clusters a
source's segments, and `absorb_small` to fold clusters too light to be a speaker.
"""

from __future__ import annotations

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
        score = _silhouette(1.0 - similarity, weights, cuts[k])
        if score > best[0]:
            best = (score, cuts[k])
    return best[1]


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


def _silhouette(
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


def unit(vector: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    norm = float(np.linalg.norm(vector))
    out: npt.NDArray[np.float64] = (vector / norm if norm > 0 else vector).astype(np.float64)
    return out
