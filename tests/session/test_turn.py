"""End of turn by a model: the segmenter's turn rules (synthetic probabilities), the turn
model's features against pipecat's and transformers', and the batcher on the real model."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

import numpy as np
import pytest

from session.segmenter import (
    Segmenter,
    SegmenterConfig,
    SegmentEvent,
    SpeechStopped,
    TurnCheck,
    TurnEnded,
    TurnResumed,
    UtteranceEnded,
)
from session.turn import SmartTurn, TurnBatcher, smart_turn_path
from session.turn_features import SAMPLES, last_seconds, log_mel
from session.turn_words import ends_unfinished
from session.vad import WINDOW
from tests.support.corpus import clip

CONFIG = SegmenterConfig(
    partial_interval=0, min_silence=0.384, turn_silence=0.192, turn_hold=0.96, turn_eager=0.3
)
SPEECH = [0.1] * 5 + [0.9] * 20  # 20 windows of speech (0.64 s) after silence
TURN = 6  # windows of silence at which the model is asked (0.192 s)
FIXED = 12  # windows of silence that end an utterance by the silence rule (0.384 s)
HOLD = 30  # windows of silence an incomplete turn waits (0.96 s)


def run(
    probabilities: list[float], answer: Callable[[TurnCheck], float | None]
) -> list[tuple[int, SegmentEvent]]:
    """Feed the windows; answer each TurnCheck at once: (window number, event)."""
    segmenter = Segmenter(CONFIG, turn_events=True)
    out: list[tuple[int, SegmentEvent]] = []
    for i, p in enumerate(probabilities):
        for event in segmenter.push(np.zeros(WINDOW, np.float32), p):
            if isinstance(event, TurnCheck):
                out.extend((i, e) for e in segmenter.decide(event.index, answer(event)))
            else:
                out.append((i, event))
    return out


def ended_at(events: list[tuple[int, SegmentEvent]]) -> list[int]:
    return [i for i, e in events if isinstance(e, UtteranceEnded)]


def test_a_complete_turn_ends_at_the_short_silence() -> None:
    """The model says complete: the utterance ends at TURN_SILENCE, not at the silence
    rule; a TurnEnded with the model's probability comes first."""
    events = run(SPEECH + [0.0] * 40, lambda check: 0.9)
    assert ended_at(events) == [len(SPEECH) - 1 + TURN]
    kinds = [type(e) for _, e in events]
    assert kinds[-3:] == [TurnEnded, SpeechStopped, UtteranceEnded]
    turn = events[-3][1]
    assert isinstance(turn, TurnEnded) and turn.probability == 0.9 and not turn.eager


def test_an_incomplete_turn_waits_past_the_silence_rule() -> None:
    """The model says incomplete: a pause longer than the silence rule does not end it;
    speech resumes into the same utterance; at the end the hold bounds the wait."""
    pause = [0.0] * (FIXED + 6)
    events = run(SPEECH + pause + [0.9] * 10 + [0.0] * 40, lambda check: 0.1)
    assert ended_at(events) == [len(SPEECH) + len(pause) + 10 - 1 + HOLD]
    assert len(ended_at(events)) == 1


def test_unfinished_words_hold_a_turn_the_model_calls_complete() -> None:
    """Words that stop on "should" (session/turn_words.py): the model's 0.9 does not end
    the utterance at TURN_SILENCE; it waits as an incomplete turn does (to the hold), and
    says no eager end."""
    segmenter = Segmenter(CONFIG, turn_events=True)
    ended: list[int] = []
    eager: list[TurnEnded] = []
    for i, p in enumerate(SPEECH + [0.0] * 40):
        for event in segmenter.push(np.zeros(WINDOW, np.float32), p):
            decided = (
                segmenter.decide(event.index, 0.9, unfinished=True)
                if isinstance(event, TurnCheck)
                else [event]
            )
            ended += [i for e in decided if isinstance(e, UtteranceEnded)]
            eager += [e for e in decided if isinstance(e, TurnEnded) and e.eager]
    assert ended == [len(SPEECH) - 1 + HOLD]
    assert eager == []


@pytest.mark.parametrize(
    ("text", "unfinished"),
    [
        ("I was thinking that we should", True),
        ("I was thinking that we should.", True),  # Whisper's period proves nothing
        ("The customer asked for an export to", True),
        ("We moved the database to the", True),
        ("Let us start with the numbers from last week,", True),
        ("So the plan is...", True),
        ("Who is taking the notes today?", False),
        ("What is it for?", False),  # a question may end on a preposition
        ("Yes, I do.", False),
        ("", False),
    ],
)
def test_words_that_leave_a_sentence_unfinished(text: str, unfinished: bool) -> None:
    assert ends_unfinished(text, "en") is unfinished


def test_words_of_another_language_hold_nothing() -> None:
    assert not ends_unfinished("Je pense que nous devrions à la", "fr")
    assert not ends_unfinished("and", "de")


def test_no_answer_leaves_the_silence_rule() -> None:
    """An unscored question (None: model failed or too busy) ends it at the silence rule."""
    events = run(SPEECH + [0.0] * 40, lambda check: None)
    assert ended_at(events) == [len(SPEECH) - 1 + FIXED]
    turn = next(e for _, e in events if isinstance(e, TurnEnded))
    assert turn.probability is None


def test_an_eager_end_then_resumed() -> None:
    """Between TURN_EAGER and the threshold: an eager TurnEnded at once (the utterance
    stays open), TurnResumed when speech comes back, then one final TurnEnded."""
    events = run(SPEECH + [0.0] * 15 + [0.9] * 10 + [0.0] * 40, lambda check: 0.4)
    turns = [e for _, e in events if isinstance(e, TurnEnded | TurnResumed)]
    assert [type(e) for e in turns] == [TurnEnded, TurnResumed, TurnEnded, TurnEnded]
    assert [getattr(e, "eager", None) for e in turns] == [True, None, True, False]
    assert len(ended_at(events)) == 1


def test_a_late_answer_changes_nothing() -> None:
    """An answer that comes after speech resumed is ignored."""
    segmenter = Segmenter(CONFIG, turn_events=True)
    checks: list[TurnCheck] = []
    for p in SPEECH + [0.0] * TURN + [0.9] * 3:
        checks += [
            e for e in segmenter.push(np.zeros(WINDOW, np.float32), p) if isinstance(e, TurnCheck)
        ]
    assert len(checks) == 1
    assert segmenter.decide(checks[0].index, 0.99) == []


def test_turn_events_only_when_asked() -> None:
    """Without turn_events the segmenter says no TurnEnded (the model still decides)."""
    segmenter = Segmenter(CONFIG)
    events: list[SegmentEvent] = []
    for p in SPEECH + [0.0] * 40:
        for event in segmenter.push(np.zeros(WINDOW, np.float32), p):
            events += (
                segmenter.decide(event.index, 0.9) if isinstance(event, TurnCheck) else [event]
            )
    assert not any(isinstance(e, TurnEnded) for e in events)
    assert [i for i, e in enumerate(events) if isinstance(e, UtteranceEnded)]


def _pipecat_features() -> Callable[..., np.ndarray]:
    """pipecat 1.14's own feature function, loaded from the wheel's file (pipecat itself
    is installed without its dependencies and cannot be imported)."""
    path = smart_turn_path().parent.parent / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function: Callable[..., np.ndarray] = module.compute_whisper_log_mel_features
    return function


def test_features_equal_pipecats_and_transformers() -> None:
    """The features of a real clip (shorter than 8 s: zeros before it) equal pipecat's
    exactly and transformers' WhisperFeatureExtractor(chunk_length=8) to float precision."""
    from transformers import WhisperFeatureExtractor

    audio = clip("en_ls_1089-134686-0001").samples()[: 5 * 16000]
    mine = log_mel(audio)
    assert mine.shape == (80, 800)
    assert np.array_equal(mine, _pipecat_features()(last_seconds(audio)))
    extractor = WhisperFeatureExtractor(chunk_length=8)  # type: ignore[no-untyped-call]
    reference = extractor(
        last_seconds(audio),
        sampling_rate=16000,
        padding="max_length",
        max_length=SAMPLES,
        truncation=True,
        do_normalize=True,
        return_tensors="np",
    ).input_features[0]
    assert np.abs(reference - mine).max() < 1e-4
    assert np.array_equal(last_seconds(np.ones(SAMPLES + 5, np.float32))[:1], [1.0])


async def test_batcher_scores_streams_together() -> None:
    """Questions asked together are scored in fewer model calls than questions, each
    with the score the model gives it alone: a finished sentence and the same cut in
    mid-word get different answers."""
    model = SmartTurn()
    batcher = TurnBatcher(model)
    audio = clip("en_ls_1221-135766-0002").samples()
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    whole = np.concatenate([audio[: loud[-1]], np.zeros(3200, np.float32)])
    cut = np.concatenate([audio[: len(audio) // 2], np.zeros(3200, np.float32)])
    turns = [whole, cut, whole, cut, whole]
    try:
        scores = await asyncio.gather(*(batcher.probability(t) for t in turns))
    finally:
        batcher.close()
    alone = model.probabilities([whole, cut])
    assert scores == pytest.approx([alone[0], alone[1]] * 2 + [alone[0]], abs=1e-4)
    assert batcher.turns == 5 and batcher.calls < 5
    assert alone[0] >= 0.5 > alone[1]
