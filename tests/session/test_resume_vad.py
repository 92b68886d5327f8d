"""A resumed stream's VAD goes on from the state stored with its last final, so it hears
what the unbroken stream heard (issue 38): the real Silero VAD on a real recording."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.chaos import speech
from bench.corpus import clips
from engine.api import SAMPLE_RATE
from session.audio import FrameDecoder
from session.pipeline import AudioPipeline
from session.segmenter import SegmenterConfig, UtteranceEnded
from session.vad import WINDOW, DirectScorer, SileroVad, VadState, pack_state, unpack_state
from wire.codes import Encoding

RESUME_FROM = 7.744  # the end of the last logged final before "Word." in chaos-7-2
WORD = (8.03, 8.67)  # "Word." in bench.chaos.speech(702, ...)


@pytest.fixture(scope="module")
def audio() -> bytes:
    return speech(702, 12)


def pipeline(
    scorer: DirectScorer, start: float = 0.0, vad_start: VadState | None = None
) -> AudioPipeline:
    return AudioPipeline(
        FrameDecoder(Encoding.PCM_S16LE, SAMPLE_RATE),
        scorer,
        SegmenterConfig(),
        start_sample=round(start * SAMPLE_RATE),
        vad_start=vad_start,
    )


async def utterances(stream: AudioPipeline, pcm: bytes) -> list[UtteranceEnded]:
    frame = SAMPLE_RATE // 50 * 2  # 20 ms frames, as a live client sends them
    ended: list[UtteranceEnded] = []
    for offset in range(0, len(pcm), frame):
        events = await stream.decode(pcm[offset : offset + frame])
        ended += [e for e in events if isinstance(e, UtteranceEnded)]
    return ended


def spans(ended: list[UtteranceEnded]) -> list[tuple[float, float]]:
    return [(e.start / SAMPLE_RATE, e.end / SAMPLE_RATE) for e in ended]


def hears_word(ended: list[UtteranceEnded]) -> bool:
    return any(s <= WORD[0] + 0.1 and e >= WORD[1] - 0.1 for s, e in spans(ended))


async def test_resume_goes_on_from_the_stored_vad_state(audio: bytes) -> None:
    """Resumed at 7.744 s with the VAD state stored with the final that ends there, the
    stream cuts "Word." (8.03-8.67 s) as the unbroken one does; from a zero state (as
    before) it hears nothing there."""
    scorer = DirectScorer(SileroVad())
    unbroken = pipeline(scorer)
    whole = await utterances(unbroken, audio)
    assert hears_word(whole), spans(whole)
    last = next(e for e in whole if round(e.end / SAMPLE_RATE, 3) == RESUME_FROM)
    stored = unbroken.vad_state_at(last.index)
    assert stored is not None
    tail = audio[round(RESUME_FROM * SAMPLE_RATE) * 2 :]
    resumed = await utterances(pipeline(scorer, RESUME_FROM, unpack_state(stored)), tail)
    after = [e for e in whole if e.start >= last.end]
    assert spans(resumed) == spans(after)
    for got, want in zip(resumed, after, strict=True):
        np.testing.assert_allclose(got.audio, want.audio)
    cold = await utterances(pipeline(scorer, RESUME_FROM), tail)
    assert not hears_word(cold), spans(cold)  # the cold start the issue measured


def test_a_packed_state_comes_back_whole() -> None:
    """pack_state / unpack_state round-trip a state exactly; anything else is refused."""
    rng = np.random.default_rng(1)
    state = VadState(
        rng.standard_normal((2, 1, 128)).astype(np.float32),
        rng.standard_normal(64).astype(np.float32),
    )
    back = unpack_state(pack_state(state.state, state.context))
    np.testing.assert_array_equal(back.state, state.state)
    np.testing.assert_array_equal(back.context, state.context)
    with pytest.raises(ValueError):
        unpack_state(pack_state(state.state, state.context[:10]))


def pcm16(samples: np.ndarray[Any, Any]) -> bytes:
    return bytes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


async def test_a_new_stream_keeps_its_first_word() -> None:
    """A new stream (zero VAD state, as before) that starts 30 ms before its speaker's
    first word cuts its first utterance from there, as it does with 1 s of silence before:
    the English corpus clips, cut just before their speech."""
    scorer = DirectScorer(SileroVad())
    lead = SAMPLE_RATE  # 1 s of silence
    checked = 0
    for clip in [c for c in clips() if c.language == "en"]:
        audio = clip.audio()
        padded = await utterances(
            pipeline(scorer), pcm16(np.concatenate([np.zeros(lead, np.float32), audio]))
        )
        if not padded:
            continue
        onset = max(0, next(iter(padded)).start - lead + round(0.2 * SAMPLE_RATE))  # pre-roll
        cut = max(0, onset - round(0.03 * SAMPLE_RATE))
        fresh = await utterances(pipeline(scorer), pcm16(audio[cut:]))
        assert fresh, clip.id
        first = fresh[0]
        # Its first utterance's audio starts before the onset (its pre-roll reaches back)
        # and holds at least min_speech of what follows it: the first word is in it.
        # (Within a window: the cut does not fall on the padded stream's window grid.)
        assert first.start <= onset - cut + WINDOW, (clip.id, spans(fresh))
        assert first.end >= onset - cut + round(0.25 * SAMPLE_RATE), (clip.id, spans(fresh))
        checked += 1
    assert checked >= 12  # the English clips of the corpus
