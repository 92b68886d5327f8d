"""Naming diarized voices after enrolled speakers (session/enrolled.py, the Diarizer)."""

from __future__ import annotations

import numpy as np

from session.diarizer import Diarizer, DiarizerConfig
from session.enrolled import EnrolledVoices


def direction(seed: int, size: int = 32) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=size)
    return (v / np.linalg.norm(v)).astype(np.float32)


def near(base: np.ndarray, seed: int, noise: float = 0.1) -> np.ndarray:
    v = base + noise * direction(seed + 1000, len(base))
    return (v / np.linalg.norm(v)).astype(np.float32)


ALICE, BOB, CAROL = direction(1), direction(2), direction(3)


def voices(*named: tuple[str, np.ndarray], threshold: float = 0.8) -> EnrolledVoices:
    return EnrolledVoices.of([(n, v.astype("<f4").tobytes()) for n, v in named], threshold, 2.0)


def test_match_is_one_to_one_and_thresholded() -> None:
    """Each name goes to its most alike cluster only; an unlike cluster keeps no name."""
    book = voices(("Alice", ALICE), ("Bob", BOB))
    centroids = {"S1": near(ALICE, 1), "S2": near(ALICE, 2, 0.3), "S3": CAROL}
    named = book.match(centroids, {"S1": 5.0, "S2": 5.0, "S3": 5.0})
    assert named == {"S1": "Alice"}
    assert book.match({"S1": near(BOB, 3)}, {"S1": 1.0}) == {}  # under min_seconds
    assert book.match({"S1": near(BOB, 3)}, {"S1": 3.0}) == {"S1": "Bob"}
    assert not voices() and voices().match({"S1": ALICE}, {"S1": 9.0}) == {}


def test_diarizer_names_a_voice_once_it_has_enough_speech() -> None:
    """A voice is S1 until its cluster holds 2 s; then its finals are renamed to the name,
    and later finals carry the name; an unenrolled voice stays an S-label."""
    diarizer = Diarizer(DiarizerConfig(), enrolled=voices(("Alice", ALICE)))
    assert diarizer.assign("u0", 0.0, 1.5, near(ALICE, 10)) == "S1"
    assert diarizer.renamed() == []
    assert diarizer.assign("u1", 2.0, 3.5, near(ALICE, 11)) == "Alice"
    assert [(r.key, r.label) for r in diarizer.renamed()] == [("u0", "Alice")]
    assert diarizer.assign("u2", 4.0, 7.0, near(CAROL, 12)) == "S2"
    assert diarizer.label_of("u0") == "Alice"
    relabels = diarizer.recluster()
    assert all(r.label in {"Alice", "S2"} for r in relabels)
    assert {diarizer.label_of(k) for k in ("u0", "u1")} == {"Alice"}
    assert diarizer.label_of("u2") not in {"Alice", None}


def test_without_enrolled_voices_labels_are_unchanged() -> None:
    """No book: renamed() says nothing and labels stay S-labels."""
    diarizer = Diarizer(DiarizerConfig())
    diarizer.assign("u0", 0.0, 3.0, ALICE)
    diarizer.assign("u1", 3.5, 6.0, near(ALICE, 5))
    assert diarizer.renamed() == []
    assert diarizer.label_of("u1") == "S1"
