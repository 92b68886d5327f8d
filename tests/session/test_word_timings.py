"""Word timings through the file pipeline (VAD, segmenter, scheduler, the real model)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from engine.api import SAMPLE_RATE
from engine.scheduling.scheduler import BatchScheduler
from engine.whisper.recognizer import WhisperRecognizer
from session.file_transcriber import FileOptions, FileProgress, FileTranscriber
from session.services import offline_services
from store.memory import MemoryStore
from tests.support.corpus import clip
from tests.support.scheduling import scheduler_config

pytestmark = pytest.mark.slow

GAP = 1.5  # seconds of digital silence between the two clips
FIRST, SECOND = "en_ls_1221-135766-0002", "en_timit_LDC93S1"


def energy_onset(samples: npt.NDArray[np.float32]) -> float:
    """Where the voice starts in a clean clip: the first 10 ms frame louder than both 15 dB
    above the clip's floor (its 10th-percentile frame) and 30 dB below its loudest frame.

    The truth the test needs must not come from what is tested: not from the model's
    alignment, nor from the voice activity detector that cuts the utterances. The clip's
    own energy is neither; on these clean read clips (floor -67 dB, peak -29 dB for TIMIT)
    it marks the first phone's start."""
    frame = SAMPLE_RATE // 100
    count = len(samples) // frame
    power = (samples[: count * frame].reshape(count, frame).astype(np.float64) ** 2).mean(axis=1)
    level = 10 * np.log10(power + 1e-12)
    threshold = max(float(np.percentile(level, 10)) + 15, float(level.max()) - 30)
    return int(np.argmax(level > threshold)) / 100


@pytest.mark.parametrize("left_context", [0.0, 10.0])
async def test_words_of_two_clips_around_a_silence(
    tmp_path: Path, tiny_en: Path, left_context: float
) -> None:
    """Two corpus clips joined by 1.5 s of silence, transcribed as one file: every final's
    words lie inside it in stream time, in order, and make its text; no word spans the
    silence; the second clip's first word starts within 0.3 s of its voice onset; also
    when the second is decoded behind the first (left context: its words are aligned
    over both and moved back)."""
    first, second = clip(FIRST).samples(), clip(SECOND).samples()
    silence = np.zeros(round(GAP * SAMPLE_RATE), np.float32)
    samples = np.concatenate([first, silence, second])
    path = tmp_path / "pair.s16"
    path.write_bytes((samples * 32767).astype("<i2").tobytes())
    scheduler = BatchScheduler(WhisperRecognizer(tiny_en), scheduler_config(max_batch_size=8))
    scheduler.start()
    services = dataclasses.replace(
        offline_services(scheduler, MemoryStore()), left_context=left_context
    )
    progress = FileProgress(total_samples=len(samples))
    try:
        await FileTranscriber(path, services, FileOptions("pair", "p", "en"), progress).run()
    finally:
        await scheduler.stop()
    finals = progress.finals
    assert len(finals) >= 2
    for final in finals:
        words = final.words
        assert words, final
        assert "".join(w["word"] for w in words).strip() == final.text
        inside = [final.start <= w["start"] <= w["end"] <= final.end for w in words]
        assert all(inside), (final.start, final.end, words)
        assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(words))
    gap_start = len(first) / SAMPLE_RATE
    gap_end = gap_start + GAP
    words = [w for f in finals for w in f.words]
    assert not [w for w in words if w["start"] < gap_end - 0.3 and w["end"] > gap_start + 0.5]
    after = [w for w in words if w["start"] >= gap_end - 0.3]
    onset = gap_end + energy_onset(second)
    print(f"second clip: onset {onset:.2f} s, first word {after[0]}")
    assert after[0]["word"].strip() == "She"
    assert abs(after[0]["start"] - onset) <= 0.3
