"""Word timings (engine/whisper/alignment.py) on real speech, and the DTW against Whisper's."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from engine.api import SAMPLE_RATE, Utterance
from engine.whisper.alignment import dtw
from engine.whisper.recognizer import WhisperRecognizer
from tests.support.corpus import clip

CLIPS = ("en_jfk", "en_lj_LJ001-0004", "en_ls_61-70968-0000", "en_lj_LJ001-0008")


@pytest.fixture(scope="module")
def recognizer(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en)


@pytest.mark.slow
def test_finals_get_words_inside_their_audio_in_order_making_their_text(
    recognizer: WhisperRecognizer,
) -> None:
    """In one batch with a partial: every final's words lie inside its audio, in order
    without overlaps, concatenate to its text, with probabilities; the partial gets none."""
    audio = [clip(c).samples() for c in CLIPS]
    batch = [Utterance(a, word_timings=True) for a in audio]
    batch.append(Utterance(audio[0][: len(audio[0]) // 2]))  # a partial: no words asked
    results = recognizer.transcribe(batch)
    assert results[-1].text and results[-1].words == ()
    for samples, result in zip(audio, results, strict=False):
        words = result.words
        assert len(words) >= 4, result
        assert "".join(w.word for w in words).strip() == result.text
        duration = len(samples) / SAMPLE_RATE
        assert all(0 <= w.start <= w.end <= duration for w in words), words
        assert all(a.end <= b.start for a, b in itertools.pairwise(words)), words
        assert all(0 < w.probability <= 1 for w in words)
        assert np.mean([w.probability for w in words]) > 0.7
    # JFK's "country." is its last word: it ends within the last second and a half.
    jfk = results[0].words
    assert jfk[-1].word.strip() == "country." and jfk[-1].end > 9.5


def whisper_dtw(x: npt.NDArray[np.float64]) -> tuple[list[int], list[int]]:
    """openai-whisper's `dtw_cpu` and `backtrace`, cell by cell."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf)
    trace = -np.ones((n + 1, m + 1))
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        if trace[i, j] == 0:
            i, j = i - 1, j - 1
        elif trace[i, j] == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    return [p[0] for p in path], [p[1] for p in path]


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (6, 1), (7, 40), (12, 30)])
def test_dtw_takes_whispers_path(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape)
    tokens, frames = dtw(x)
    assert (tokens.tolist(), frames.tolist()) == whisper_dtw(x)
