"""Sans-I/O diarization of one audio source: speaker embeddings in, labels out.

A `Diarizer` holds one source's labelled segments. For each utterance, with the
embeddings of its back-to-back windows (engine/speakers.py):

1. `split(windows, levels)` says where a speaker change falls inside the utterance: the
   window boundary where the mean embeddings on either side are least alike, if they are
   unlike enough (and each side is a different speaker); the cut then moves to the quietest
   point near that boundary (the pause between the two turns), so no word is cut. Each
   part is transcribed and labelled on its own.
2. `assign(key, start, end, embedding, windows)` labels one part online: the speaker whose
   centroid is most alike, or a new speaker ("S1", "S2", …, at most `max_speakers`) when
   none is alike enough and the part is long enough to tell.
3. `recluster()` (every `recluster_every_s` of new speech, and at the end) clusters the
   segments again with no speaker count given (session/clustering.py). Under
   `linkage_below_s` of speech: average linkage at an adaptive similarity (`linkage_cut`).
   Past it: spectral
   clustering of their windows' embeddings (a segment goes where most of its windows
   go), the count from the eigengap; where that finds no valid split (one cluster, or
   one whose segments' silhouette is below `min_silhouette`: too few points for an
   eigengap to mean anything), average linkage on the segments, cut by silhouette.
   Clusters take the labels they overlap most (so labels stay stable), and it returns
   the segments whose label changed.

Everything here is plain numpy and does no I/O; `recluster` costs O(n³) in the points it
sees, so it looks at the last `recluster_window` segments (older ones keep their label)
and at most `max_points` windows of theirs (neighbouring windows of a segment are
averaged when there are more), and the caller runs it off the event loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from engine.api import SAMPLE_RATE, SpeakerWindows
from session.assignment import best_assignment
from session.clustering import (
    absorb_small,
    cluster,
    linkage_cut,
    silhouette,
    spectral,
    unit,
    window_points,
)
from session.enrolled import EnrolledVoices

FloatArray = npt.NDArray[np.float32]

LABEL_PREFIX = "S"


@dataclass(frozen=True, slots=True)
class DiarizerConfig:
    max_speakers: int = 6
    new_speaker_similarity: float = 0.72  # below this to every centroid: a new speaker
    max_threshold: float = 0.95  # re-clustering raises the new-speaker threshold at most to
    min_silhouette: float = 0.4  # a split into speakers whose segments score below: none
    split_margin: float = 0.12  # sides of an utterance less alike than threshold - this: split
    min_new_speaker_s: float = 1.2  # shorter parts never open a new speaker
    min_cluster_s: float = 1.0  # shorter segments are attached after clustering, not clustered
    min_speaker_s: float = 3.0  # a cluster with less speech joins the one it is most alike,
    min_speaker_share: float = 0.05  # ... and so does one with less than this share of it
    min_part_windows: int = 1  # windows each side of a split keeps at least
    recluster_every_s: float = 15.0  # seconds of new speech between two re-clusterings
    recluster_window: int = 400  # segments re-clustered (the most recent)
    max_points: int = 240  # windows clustered at most (more: neighbours averaged in runs)
    cut_search_s: float = 0.8  # a split moves to the quietest point within this of its boundary
    linkage_below_s: float = 60.0  # less speech: average linkage (more: spectral clustering),
    merge_similarity: float = 0.87  # ... merging clusters at least this alike, or at least
    merge_margin: float = 0.08  # ... this below how alike the closest segments are,
    merge_floor: float = 0.70  # ... but never clusters less alike than this

    def __post_init__(self) -> None:
        if not 1 <= self.max_speakers <= 26:
            raise ValueError("max_speakers must lie in 1..26")
        for name in ("new_speaker_similarity", "min_silhouette"):
            if not -1.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [-1, 1]")
        if self.recluster_window < 2:
            raise ValueError("recluster_window must be at least 2")
        if self.max_points < 2:
            raise ValueError("max_points must be at least 2")


@dataclass(slots=True)
class Segment:
    """One labelled stretch of the source: an utterance, or a part of one."""

    key: str  # the utterance id its final carries
    start: float
    end: float
    embedding: FloatArray
    weight: float  # seconds of audio the embedding stands for
    label: str
    windows: FloatArray  # [m, size] unit embeddings of its windows (re-clustering's points)
    window_weights: npt.NDArray[np.float64]  # seconds each window stands for


@dataclass(frozen=True, slots=True)
class Part:
    """A stretch of one utterance that one speaker holds: samples from its start."""

    start: int
    end: int
    embedding: FloatArray | None  # None: too short to embed (it takes the nearest label)
    windows: SpeakerWindows | None = None  # the windows whose middle falls in the part


@dataclass(frozen=True, slots=True)
class Relabel:
    key: str
    label: str


@dataclass
class Diarizer:
    config: DiarizerConfig = field(default_factory=DiarizerConfig)
    segments: list[Segment] = field(default_factory=list)
    _sums: dict[str, FloatArray] = field(default_factory=dict)  # label → weighted sum
    _since_recluster: float = 0.0
    threshold: float = -1.0  # new-speaker similarity now: the config's, adapted by re-clustering
    enrolled: EnrolledVoices | None = None  # the tenant's named voices: clusters that match
    _names: dict[str, str] = field(default_factory=dict)  # cluster label → enrolled name
    _shown: dict[str, str] = field(default_factory=dict)  # segment key → label last given out

    def __post_init__(self) -> None:
        if self.threshold < 0:
            self.threshold = self.config.new_speaker_similarity

    # ------------------------------------------------------------------ online

    @property
    def labels(self) -> list[str]:
        return list(self._sums)

    def parts(self, audio: FloatArray, windows: SpeakerWindows) -> list[Part]:
        """Cut one utterance where its speaker changes; each part with its embedding (the
        mean of the windows whose middle falls in it)."""
        bounds = list(windows.bounds)
        if not bounds:
            return [Part(0, len(audio), None)]
        cuts = self.split(windows.embeddings, bounds, levels(audio))
        edges = [0, *cuts, len(audio)]
        out: list[Part] = []
        for start, end in itertools.pairwise(edges):
            inside = [i for i, (s, e) in enumerate(bounds) if start <= (s + e) // 2 < end]
            if not inside:  # a sliver: the window it lies in speaks for it
                inside = [min(range(len(bounds)), key=lambda i: abs(sum(bounds[i]) / 2 - start))]
            weights = np.array([bounds[i][1] - bounds[i][0] for i in inside], np.float32)
            mine = SpeakerWindows(tuple(bounds[i] for i in inside), windows.embeddings[inside])
            embedding = unit(weights @ mine.embeddings).astype(np.float32)
            out.append(Part(start, end, embedding, mine))
        return out

    def split(
        self, embeddings: FloatArray, bounds: Sequence[tuple[int, int]], levels: FloatArray
    ) -> list[int]:
        """Sample offsets (from the utterance's start) to cut the utterance at: empty when
        one speaker holds it. `embeddings[i]` covers samples `bounds[i]`; `levels` is the
        utterance's loudness per `len(audio) // len(levels)` samples (say, per 10 ms)."""
        return sorted(self._split(embeddings, list(bounds), levels, 0, len(bounds)))

    def _split(
        self,
        embeddings: FloatArray,
        bounds: list[tuple[int, int]],
        levels: FloatArray,
        first: int,
        last: int,
    ) -> list[int]:
        keep = self.config.min_part_windows
        if last - first < 2 * keep:
            return []
        weights = np.array([e - s for s, e in bounds[first:last]], np.float64)
        block = embeddings[first:last].astype(np.float64) * weights[:, None]
        best: tuple[float, int] | None = None
        for b in range(keep, last - first - keep + 1):
            left, right = unit(block[:b].sum(0)), unit(block[b:].sum(0))
            similarity = float(left @ right)
            if best is None or similarity < best[0]:
                best = (similarity, b)
        if best is None or best[0] >= self.threshold - self.config.split_margin:
            return []
        boundary = first + best[1]
        left = unit(block[: best[1]].sum(0))
        right = unit(block[best[1] :].sum(0))
        if self._sums and not self._different(left, right):
            return []
        cut = self._quietest(bounds[boundary][0], levels, bounds[-1][1])
        return [
            *self._split(embeddings, bounds, levels, first, boundary),
            cut,
            *self._split(embeddings, bounds, levels, boundary, last),
        ]

    def _different(self, left: npt.NDArray[np.float64], right: npt.NDArray[np.float64]) -> bool:
        """Do two sides of an utterance belong to different speakers, by what is known:
        each nearest another speaker, or one of them like no known speaker at all."""
        window_threshold = self.threshold - self.config.split_margin
        if self._nearest(left) != self._nearest(right):
            return True
        return min(self._similarity(left), self._similarity(right)) < window_threshold

    def _quietest(self, boundary: int, levels: FloatArray, total: int) -> int:
        if len(levels) == 0:
            return boundary
        step = max(1, total // len(levels))
        reach = round(self.config.cut_search_s * SAMPLE_RATE / step)
        center = min(len(levels) - 1, boundary // step)
        low, high = max(1, center - reach), min(len(levels) - 1, center + reach + 1)
        if high <= low:
            return boundary
        smooth = np.convolve(levels, np.ones(5, np.float32) / 5, mode="same")
        return int((low + int(np.argmin(smooth[low:high]))) * step)

    def assign(
        self,
        key: str,
        start: float,
        end: float,
        embedding: FloatArray | None,
        windows: SpeakerWindows | None = None,
    ) -> str:
        """Label a segment now (a final is about to be sent) and remember it, with the
        embeddings of its windows if given (else `embedding` is its one window). A segment
        too short to embed takes the label of the one before it and is not kept."""
        if embedding is None:
            return self.segments[-1].label if self.segments else self._new_label()
        weight = max(0.0, end - start)
        label = self._nearest(embedding)
        if label is None or (
            self._similarity(embedding) < self.threshold
            and weight >= self.config.min_new_speaker_s
            and len(self._sums) < self.config.max_speakers
        ):
            label = self._new_label()
        if windows is not None and len(windows.bounds) > 0:
            vectors = windows.embeddings.astype(np.float32)
            seconds = np.array([e - s for s, e in windows.bounds], np.float64) / SAMPLE_RATE
        else:
            vectors, seconds = embedding[None, :].astype(np.float32), np.array([weight])
        segment = Segment(key, start, end, embedding, weight, label, vectors, seconds)
        self.segments.append(segment)
        self._add(segment)
        self._since_recluster += weight
        self._shown[key] = self._shown_label(label)
        return self._shown[key]

    def label_of(self, key: str) -> str | None:
        """The label a segment shows now: its enrolled speaker's name, or its S-label."""
        for segment in reversed(self.segments):
            if segment.key == key:
                return self._names.get(segment.label, segment.label)
        return None

    def renamed(self) -> list[Relabel]:
        """Segments whose shown label changed since it was given out (a cluster matched an
        enrolled speaker as it grew, or re-clustering moved it), with their new label."""
        if self.enrolled:
            self._names = self.enrolled.match(
                {label: unit(total) for label, total in self._sums.items()}, self._seconds()
            )
        changed: list[Relabel] = []
        for segment in self.segments:
            label = self._names.get(segment.label, segment.label)
            if self._shown.get(segment.key) != label:
                self._shown[segment.key] = label
                changed.append(Relabel(segment.key, label))
        return changed

    def _shown_label(self, label: str) -> str:
        if self.enrolled:
            self._names = self.enrolled.match(
                {name: unit(total) for name, total in self._sums.items()}, self._seconds()
            )
        return self._names.get(label, label)

    def _seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for segment in self.segments:
            out[segment.label] = out.get(segment.label, 0.0) + segment.weight
        return out

    def due(self) -> bool:
        """Enough new speech since the last re-clustering to run another."""
        return self._since_recluster >= self.config.recluster_every_s

    # ------------------------------------------------------------------ re-clustering

    def recluster(self) -> list[Relabel]:
        """Cluster the recent segments again; relabel those whose speaker changed."""
        self._since_recluster = 0.0
        recent = self.segments[-self.config.recluster_window :]
        before = {s.key: self._names.get(s.label, s.label) for s in recent}
        for old in self.segments[: -self.config.recluster_window]:  # never clustered again
            old.windows, old.window_weights = old.embedding[None, :], np.array([old.weight])
        anchors = [s for s in recent if s.weight >= self.config.min_cluster_s]
        if len(anchors) < 2:
            return self.renamed()
        vectors = np.stack([s.embedding for s in anchors]).astype(np.float64)
        weights = np.array([s.weight for s in anchors])
        clusters = self._partition(anchors, vectors, weights)
        smallest = max(self.config.min_speaker_s, self.config.min_speaker_share * weights.sum())
        clusters = absorb_small(clusters, vectors, weights, smallest)
        centroids = [unit((vectors[c] * weights[c, None]).sum(0)) for c in clusters]
        self._adapt(vectors, clusters, centroids)
        members: list[list[Segment]] = [[anchors[i] for i in c] for c in clusters]
        # Segments too short to cluster join the cluster they are most alike.
        anchored = {id(s) for s in anchors}
        for segment in recent:
            if id(segment) not in anchored:
                sims = [float(segment.embedding @ c) for c in centroids]
                members[int(np.argmax(sims))].append(segment)
        for name, group in zip(self._name(members), members, strict=True):
            for segment in group:
                segment.label = name
        self._sums = {}
        for segment in self.segments:
            self._add(segment)
        self._sums = dict(sorted(self._sums.items(), key=lambda kv: _label_number(kv[0])))
        changed = self.renamed()
        told = {r.key for r in changed}
        for segment in recent:  # the label moved back to the one last given out
            label = self._names.get(segment.label, segment.label)
            if segment.key not in told and before[segment.key] != label:
                changed.append(Relabel(segment.key, label))
        return changed

    def _partition(
        self,
        anchors: list[Segment],
        vectors: npt.NDArray[np.float64],
        weights: npt.NDArray[np.float64],
    ) -> list[list[int]]:
        """Clusters of `anchors` (indices). Little speech (under `linkage_below_s`: a short
        meeting): average linkage, merging while clusters are `merge_similarity` alike.
        More: spectral on their windows, each segment where most of its windows' seconds
        go; average linkage cut by silhouette where spectral gives no valid split."""
        if float(weights.sum()) < self.config.linkage_below_s:
            config = self.config
            return linkage_cut(
                vectors,
                weights,
                ceiling=config.merge_similarity,
                margin=config.merge_margin,
                floor=config.merge_floor,
            )
        groups = [(s.windows, s.window_weights) for s in anchors]
        points, owners, seconds = window_points(groups, self.config.max_points)
        assigned = spectral(points, self.config.max_speakers)
        votes = np.zeros((len(anchors), int(assigned.max()) + 1))
        np.add.at(votes, (owners, assigned), seconds)
        choice = np.argmax(votes, axis=1)
        clusters = [np.flatnonzero(choice == c).tolist() for c in range(votes.shape[1])]
        clusters = [c for c in clusters if c]
        if len(clusters) >= 2:
            distance = 1.0 - np.clip(vectors @ vectors.T, -1.0, 1.0)
            if silhouette(distance, weights, clusters) >= self.config.min_silhouette:
                return clusters
        return cluster(vectors, weights, self.config.max_speakers, self.config.min_silhouette)

    def _adapt(
        self,
        vectors: npt.NDArray[np.float64],
        clusters: list[list[int]],
        centroids: list[npt.NDArray[np.float64]],
    ) -> None:
        """Move the online new-speaker threshold halfway between how alike a segment is
        to its own speaker and how alike the two closest speakers are (voices differ in
        how far apart they lie: synthetic voices sit much closer than real ones)."""
        if len(clusters) < 2:
            return
        own = np.concatenate([vectors[c] @ centroids[i] for i, c in enumerate(clusters)])
        between = max(float(a @ b) for a, b in itertools.combinations(centroids, 2))
        middle = (float(np.percentile(own, 10)) + between) / 2
        self.threshold = min(
            self.config.max_threshold, max(self.config.new_speaker_similarity, middle)
        )

    def _name(self, members: list[list[Segment]]) -> list[str]:
        """Give each cluster the label it overlaps most, one cluster per label; the rest
        get labels not in use by any segment kept outside the window."""
        old = sorted({s.label for group in members for s in group}, key=_label_number)
        # Columns past the old labels stand for fresh ones (overlap 0), so every cluster
        # gets a column.
        overlap = np.zeros((len(members), max(1, len(old), len(members))))
        for i, group in enumerate(members):
            for segment in group:
                if segment.label in old:
                    overlap[i, old.index(segment.label)] += segment.weight
        best = best_assignment(overlap)
        recent = {id(s) for group in members for s in group}
        taken = {s.label for s in self.segments if id(s) not in recent}
        names: list[str] = []
        for i, j in enumerate(best):
            if j < len(old) and overlap[i, j] > 0:
                names.append(old[j])
        in_use = set(names) | taken
        result: list[str] = []
        fresh = (f"{LABEL_PREFIX}{n}" for n in itertools.count(1))
        kept = iter(names)
        for i, j in enumerate(best):
            if j < len(old) and overlap[i, j] > 0:
                result.append(next(kept))
            else:
                label = next(name for name in fresh if name not in in_use)
                in_use.add(label)
                result.append(label)
        return result

    # ------------------------------------------------------------------ helpers

    def _add(self, segment: Segment) -> None:
        total = self._sums.get(segment.label)
        contribution = segment.embedding.astype(np.float32) * np.float32(segment.weight)
        self._sums[segment.label] = contribution if total is None else total + contribution

    def _nearest(self, embedding: npt.NDArray[np.floating]) -> str | None:
        if not self._sums:
            return None
        return max(self._sums, key=lambda label: float(unit(self._sums[label]) @ embedding))

    def _similarity(self, embedding: npt.NDArray[np.floating]) -> float:
        if not self._sums:
            return -1.0
        return max(float(unit(total) @ embedding) for total in self._sums.values())

    def _new_label(self) -> str:
        used = set(self._sums) | {s.label for s in self.segments}
        return next(
            f"{LABEL_PREFIX}{n}" for n in itertools.count(1) if f"{LABEL_PREFIX}{n}" not in used
        )


def _label_number(label: str) -> int:
    return int(label[len(LABEL_PREFIX) :]) if label[len(LABEL_PREFIX) :].isdigit() else 10**6


def levels(audio: FloatArray, step: int = 160) -> FloatArray:
    """Loudness (mean square) per `step` samples: where to look for a pause."""
    count = max(1, len(audio) // step)
    frames = audio[: count * step].reshape(count, step) if len(audio) >= step else audio[None, :]
    out: FloatArray = np.mean(np.square(frames, dtype=np.float32), axis=1).astype(np.float32)
    return out
