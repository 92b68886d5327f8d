"""Names for diarized voices: which of a tenant's enrolled speakers (store/enrolled.py) a
source's speaker clusters are.

`EnrolledVoices` holds the names and unit embeddings of the speakers a tenant enrolled
(read when the source starts). `match(centroids, seconds)` names clusters: a cluster
whose centroid is at least `threshold` alike (cosine) to an enrolled embedding, with at
least `min_seconds` of speech, takes that speaker's name; one name per cluster and one
cluster per name, the most alike pairs first. Other clusters keep their S-labels.

The threshold is measured by `bench/enrollment.py` (false accepts against misses on
corpus speakers). Plain numpy, no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from store.api import Store
from store.errors import StoreError

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]

DEFAULT_THRESHOLD = 0.75
DEFAULT_MIN_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class EnrolledVoices:
    names: tuple[str, ...]
    embeddings: FloatArray  # [len(names), size] unit rows
    threshold: float = DEFAULT_THRESHOLD
    min_seconds: float = DEFAULT_MIN_SECONDS

    @classmethod
    def of(
        cls,
        speakers: Sequence[tuple[str, bytes]],
        threshold: float = DEFAULT_THRESHOLD,
        min_seconds: float = DEFAULT_MIN_SECONDS,
    ) -> EnrolledVoices:
        """From (name, float32 embedding bytes) pairs; rows are re-normalised."""
        rows = [np.frombuffer(e, dtype="<f4").astype(np.float32) for _, e in speakers]
        sizes = {len(r) for r in rows}
        if len(sizes) > 1:
            raise ValueError(f"enrolled embeddings differ in size: {sorted(sizes)}")
        matrix = np.stack(rows) if rows else np.zeros((0, 0), np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True) if rows else 1.0
        matrix = (matrix / np.maximum(norms, 1e-12)).astype(np.float32)
        return cls(tuple(n for n, _ in speakers), matrix, threshold, min_seconds)

    def __bool__(self) -> bool:
        return bool(self.names)

    def match(
        self, centroids: Mapping[str, npt.NDArray[np.floating]], seconds: Mapping[str, float]
    ) -> dict[str, str]:
        """Cluster label → enrolled name, for the clusters that match one."""
        if not self.names:
            return {}
        labels = [k for k in centroids if seconds.get(k, 0.0) >= self.min_seconds]
        if not labels:
            return {}
        if self.embeddings.shape[1] != len(next(iter(centroids.values()))):
            return {}  # enrolled with another embedding model: nothing can match
        vectors = np.stack([_unit(centroids[k]) for k in labels])
        similarity = vectors @ self.embeddings.T.astype(np.float64)
        pairs = sorted(
            ((float(similarity[i, j]), i, j) for i, j in np.argwhere(similarity >= self.threshold)),
            reverse=True,
        )
        named: dict[str, str] = {}
        taken: set[int] = set()
        for _, i, j in pairs:
            if labels[i] not in named and j not in taken:
                named[labels[i]] = self.names[j]
                taken.add(int(j))
        return named


async def load_voices(store: Store, tenant: str | None, threshold: float) -> EnrolledVoices:
    """The tenant's enrolled voices, read when a diarized source starts (best effort: a
    store that cannot be read leaves the source's voices unnamed, with a warning)."""
    try:
        speakers = await store.speakers.list(tenant)
    except StoreError:
        logger.warning("enrolled speakers not read: voices stay unnamed", exc_info=True)
        speakers = []
    return EnrolledVoices.of([(s.name, s.embedding) for s in speakers], threshold)


def _unit(vector: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    v = np.asarray(vector, np.float64)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v
