"""Speaker embeddings: librosa-exact spectrogram, shipped weights, batching off the loop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from engine.api import EmbedderFull
from engine.speakers import (
    EMBEDDING_SIZE,
    SpeakerEmbedder,
    SpeakerEncoder,
    mel_filterbank,
    mel_frames,
    window_bounds,
)
from tests.support.corpus import clips


@pytest.fixture(scope="module")
def encoder() -> SpeakerEncoder:
    return SpeakerEncoder()


def _chirp() -> np.ndarray:
    t = np.arange(8000) / 16000
    return (0.3 * np.sin(2 * np.pi * (200 + 1800 * t) * t)).astype(np.float32)


def test_mel_matches_librosa() -> None:
    """The 40-band spectrogram equals librosa 0.11's melspectrogram (values taken from it)."""
    mel = mel_frames(_chirp())
    assert mel.shape == (51, 40)
    expected = [
        [0.6075, 0.0284, 0.0008, 0.0001, 0.0],
        [0.0, 0.0756, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0165, 0.0, 0.0],
        [0.0033, 0.0038, 0.0057, 0.0853, 0.0008],
    ]
    np.testing.assert_allclose(mel[[0, 10, 25, 50]][:, [0, 5, 12, 20, 30]], expected, atol=1e-4)
    assert float(mel.sum()) == pytest.approx(749.465, rel=1e-5)
    sums = mel_filterbank().sum(axis=1)[[0, 10, 20, 39]]
    np.testing.assert_allclose(sums, [0.024809, 0.024809, 0.025220, 0.024979], atol=1e-6)


def test_window_bounds() -> None:
    """Back-to-back 1.6 s windows; a short tail joins the last; tiny audio has none."""
    assert window_bounds(16_000 * 4) == [(0, 25_600), (25_600, 51_200), (51_200, 64_000)]
    assert window_bounds(25_600 + 4_000) == [(0, 29_600)]
    assert window_bounds(100) == []


def test_same_speaker_is_closer(encoder: SpeakerEncoder) -> None:
    """Two clips of one corpus speaker are more alike than clips of two speakers."""
    corpus = clips()
    a1 = corpus["en_lj_LJ001-0001"].samples()
    a2 = corpus["en_lj_LJ001-0003"].samples()
    b1 = corpus["en_mfa_words"].samples()
    windows = encoder.embed([a1, a2, b1])
    assert windows[0].embeddings.shape[1] == EMBEDDING_SIZE
    e1, e2, e3 = (w.mean() for w in windows)
    assert float(e1 @ e2) > 0.85
    assert float(e1 @ e3) < 0.7


async def test_embedder_batches_across_callers(encoder: SpeakerEncoder) -> None:
    """Requests made in one loop turn share one model call, off the event loop."""
    embedder = SpeakerEmbedder(encoder)
    audio = clips()["en_jfk"].samples()
    try:
        results = await asyncio.gather(*(embedder.embed(audio[i * 16000 :]) for i in range(3)))
        assert embedder.stats.batches == 1
        assert embedder.stats.utterances == 3
        assert [len(r.bounds) for r in results] == [7, 6, 6]
        assert embedder.stats.cpu_seconds > 0
    finally:
        await embedder.close()


async def test_embedder_bounds_its_queue(encoder: SpeakerEncoder) -> None:
    """Past max_pending_windows a request fails at once instead of waiting."""
    embedder = SpeakerEmbedder(encoder, max_pending_windows=4)
    audio = np.zeros(16_000 * 5, np.float32)
    try:
        first = asyncio.ensure_future(embedder.embed(audio))
        await asyncio.sleep(0)
        with pytest.raises(EmbedderFull):
            await embedder.embed(audio)
        await first
    finally:
        await embedder.close()
