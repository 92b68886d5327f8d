"""bench/flush_lead.py on real clips: each last Finalize of `bench.ttfs` finds the final it
cuts speculated ahead of it, the clip ending in a noise floor too (a dip, session/segmenter.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import flush_lead
from engine.whisper.recognizer import WhisperRecognizer
from loadgen.corpus import default_corpus_dir, load_manifest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("clip_id", ["en_jfk", "en_ls_1221-135766-0002"])
def test_the_last_finalize_finds_a_speculation_made_before_it(tiny_en: Path, clip_id: str) -> None:
    recognizer = WhisperRecognizer(tiny_en)
    [clip] = [c for c in load_manifest(default_corpus_dir()) if c.id == clip_id]
    flush = flush_lead.last_flush(clip, recognizer, partial_ms=100)
    assert flush.speculation is not None, "decoded at the flush"
    # Made at the server's first silent window (or the dip's second), before the client's
    # VAD (0.7, 0.2 s) stops: at most 160 ms ahead, and for these two clips at least 64.
    assert 0.064 <= flush.lead <= 0.160
    assert flush.speculation.word_timings and flush.speculation.draft
