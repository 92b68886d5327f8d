"""The sans-I/O segmenter, driven by synthetic probabilities and by real VAD on the corpus."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from session.segmenter import (
    PartialDue,
    Segmenter,
    SegmenterConfig,
    SegmentEvent,
    SpeechStarted,
    SpeechStopped,
    UtteranceEnded,
    UtteranceMayEnd,
    UtteranceResumed,
)
from session.vad import WINDOW, DirectScorer, SileroVad, VadStream
from tests.support.corpus import clip

WINDOW_S = WINDOW / 16_000


def feed(segmenter: Segmenter, probabilities: list[float]) -> list[SegmentEvent]:
    events: list[SegmentEvent] = []
    for i, p in enumerate(probabilities):
        window = np.full(WINDOW, i, dtype=np.float32)  # each window's samples = its number
        events.extend(segmenter.push(window, p))
    return events


def windows(seconds: float) -> int:
    return round(seconds / WINDOW_S)


def test_utterance_with_pre_roll_post_roll_and_hysteresis() -> None:
    """Speech between silences yields start, stop and one utterance padded by the rolls."""
    config = SegmenterConfig(pre_roll=0.064, post_roll=0.064, min_silence=0.32, partial_interval=0)
    seg = Segmenter(config)
    probs = [0.1] * 10 + [0.9] * 20 + [0.4] * 5 + [0.9] * 5 + [0.1] * 20
    events = feed(seg, probs)
    kinds = [type(e) for e in events]
    assert kinds == [SpeechStarted, SpeechStopped, UtteranceEnded]
    started, stopped, ended = events
    assert isinstance(ended, UtteranceEnded) and isinstance(started, SpeechStarted)
    assert started.sample == 10 * WINDOW
    # 0.4 lies above threshold - hysteresis (0.35): the dip does not end the utterance.
    assert isinstance(stopped, SpeechStopped) and stopped.sample == 40 * WINDOW
    assert ended.start == 8 * WINDOW and ended.end == 42 * WINDOW
    assert list(np.unique(ended.audio)) == list(range(8, 42))
    assert len(ended.audio) == ended.end - ended.start


def test_short_burst_is_dropped() -> None:
    """Speech shorter than min_speech produces no utterance."""
    seg = Segmenter(SegmenterConfig(min_speech=0.25, partial_interval=0))
    events = feed(seg, [0.1] * 5 + [0.9] * 3 + [0.1] * 30)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]


def test_partials_every_interval_and_final_index() -> None:
    """Partials come every partial_interval of speech and carry the utterance so far."""
    seg = Segmenter(SegmenterConfig(partial_interval=0.32, min_silence=0.32))
    events = feed(seg, [0.9] * 40 + [0.1] * 12)
    partials = [e for e in events if isinstance(e, PartialDue)]
    assert len(partials) == 3  # at 10, 20 and 30 windows after the onset
    assert all(p.index == 0 and p.start == 0 for p in partials)
    assert [p.end for p in partials] == [11 * WINDOW, 21 * WINDOW, 31 * WINDOW]
    finals = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(finals) == 1 and finals[0].index == 0 and seg.next_index == 1


def test_long_speech_is_cut_at_the_quietest_window() -> None:
    """Speech past max_utterance is cut at the lowest-probability window of its last
    cut_search seconds; the rest starts the next utterance with nothing lost."""
    config = SegmenterConfig(
        max_utterance=4.0,
        soft_max_utterance=4.0,
        cut_search=1.0,
        min_silence=0.5,
        partial_interval=0,
        pre_roll=0,
    )
    seg = Segmenter(config)
    n = windows(4.0)
    probs = [0.95] * n
    probs[n - 10] = 0.6  # quietest within the last second
    probs[n - 40] = 0.55  # quieter, but earlier than the last second
    events = feed(seg, probs + [0.95] * 20 + [0.0] * 30)
    ended = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(ended) == 2
    assert ended[0].end == (n - 9) * WINDOW
    assert ended[1].start == ended[0].end  # no sample lost or repeated
    assert [e.index for e in ended] == [0, 1]


def test_a_word_gap_in_the_cut_zone_ends_the_utterance_as_it_comes() -> None:
    """In the last cut_search seconds before max_utterance, the first window that is not
    speech ends the utterance when it is pushed, not at max_utterance after the fact; the
    same gap earlier does not."""
    config = SegmenterConfig(
        max_utterance=4.0,
        soft_max_utterance=4.0,
        cut_search=1.0,
        min_silence=0.5,
        post_roll=0,
        partial_interval=0,
        pre_roll=0,
    )
    seg = Segmenter(config)
    early_gap = windows(2.0)  # before the cut zone (past 3 s)
    late_gap = windows(3.5)
    ended_at: list[tuple[int, UtteranceEnded]] = []  # (the window pushed, what it ended)
    for i in range(windows(6.0)):
        p = 0.1 if i in (early_gap, late_gap) else 0.95
        for event in seg.push(np.full(WINDOW, i, dtype=np.float32), p):
            if isinstance(event, UtteranceEnded):
                ended_at.append((i, event))
    (when, first), *_ = ended_at
    assert when == late_gap  # decided on the gap's own window: no lag behind the live audio
    assert first.end == late_gap * WINDOW  # the speech before the gap (no post-roll here)
    assert len(first.audio) == first.end - first.start


def test_long_utterance_ends_at_a_short_pause() -> None:
    """Past soft_max_utterance, a pause of soft_pause ends the utterance; before, it does not."""
    config = SegmenterConfig(
        soft_max_utterance=2.0, soft_pause=0.128, min_silence=0.5, partial_interval=0, pre_roll=0
    )
    seg = Segmenter(config)
    pause = [0.1] * 4  # 128 ms
    events = feed(
        seg, [0.9] * windows(1.0) + pause + [0.9] * windows(1.5) + pause + [0.9] * 10 + [0.0] * 20
    )
    ended = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(ended) == 2
    assert ended[0].end - ended[0].start > 2.0 * 16_000  # the first pause did not cut
    assert ended[1].start >= ended[0].end


def test_flush_ends_speech_now_and_start_offset_is_kept() -> None:
    """flush() closes the utterance in progress; times count from start_sample."""
    seg = Segmenter(
        SegmenterConfig(partial_interval=0, pre_roll=0), start_sample=16_000, first_index=7
    )
    feed(seg, [0.9] * 20)
    events = seg.flush()
    ended = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(ended) == 1 and ended[0].index == 7
    assert ended[0].start == 16_000 and ended[0].end == 16_000 + 20 * WINDOW
    assert seg.flush() == []


SPECULATING = SegmenterConfig(
    pre_roll=0.064, post_roll=0.096, min_silence=0.5, partial_interval=0, speculate_after=0.16
)


def test_speculation_hands_out_the_finals_audio_once_it_is_fixed() -> None:
    """After speculate_after of silence, UtteranceMayEnd carries exactly what the final
    carries; the final comes min_silence after the speech, nothing else in between."""
    seg = Segmenter(SPECULATING)
    events = feed(seg, [0.1] * 5 + [0.9] * 20)
    assert [type(e) for e in events] == [SpeechStarted]
    silence = feed(seg, [0.1] * windows(0.16))
    assert [type(e) for e in silence] == [UtteranceMayEnd]
    (may_end,) = silence
    assert isinstance(may_end, UtteranceMayEnd)
    rest = feed(seg, [0.1] * (windows(0.5) - windows(0.16)))
    assert [type(e) for e in rest] == [SpeechStopped, UtteranceEnded]
    ended = rest[1]
    assert isinstance(ended, UtteranceEnded)
    assert (may_end.index, may_end.start, may_end.end) == (ended.index, ended.start, ended.end)
    assert np.array_equal(may_end.audio, ended.audio)
    assert ended.end == (25 + windows(0.096)) * WINDOW  # the last speech plus the post-roll


def test_speculation_before_the_post_roll_is_in_ends_the_final_where_it_speculated() -> None:
    """A speculate_after shorter than the post-roll speculates at once with the post-roll
    heard so far; an utterance that ends in that silence run (endpoint or a client's cut)
    ends with exactly that audio, so the speculation serves it; after speech resumed, the
    next silence speculates and ends afresh."""
    config = SegmenterConfig(
        pre_roll=0, post_roll=0.096, min_silence=0.5, partial_interval=0, speculate_after=0.032
    )
    for finish in ("endpoint", "finalize"):
        seg = Segmenter(config)
        feed(seg, [0.9] * 20)
        (may_end,) = feed(seg, [0.1])  # the first silent window
        assert isinstance(may_end, UtteranceMayEnd)
        assert may_end.end == 21 * WINDOW == seg.position  # one window of post-roll
        if finish == "endpoint":
            events = feed(seg, [0.1] * windows(0.5))
        else:
            events = feed(seg, [0.1] * 5) + seg.finalize()
        [ended] = [e for e in events if isinstance(e, UtteranceEnded)]
        assert (ended.start, ended.end) == (may_end.start, may_end.end)
        assert np.array_equal(ended.audio, may_end.audio)
    seg = Segmenter(config)
    feed(seg, [0.9] * 20)
    assert [type(e) for e in feed(seg, [0.1]) + feed(seg, [0.9] * 5)] == [
        UtteranceMayEnd,
        UtteranceResumed,
    ]
    (second,) = feed(seg, [0.1])
    assert isinstance(second, UtteranceMayEnd) and second.end == 27 * WINDOW
    [ended] = [e for e in feed(seg, [0.1] * 20) if isinstance(e, UtteranceEnded)]
    assert ended.end == second.end


def test_without_speculation_the_final_keeps_its_whole_post_roll() -> None:
    """With speculation off, or speculating at the post-roll, an endpoint's final carries
    the last speech plus the whole post-roll, as it always did."""
    for speculate_after in (0.0, 0.096):
        config = SegmenterConfig(
            pre_roll=0,
            post_roll=0.096,
            min_silence=0.5,
            partial_interval=0,
            speculate_after=speculate_after,
        )
        seg = Segmenter(config)
        events = feed(seg, [0.9] * 20 + [0.1] * 30)
        [ended] = [e for e in events if isinstance(e, UtteranceEnded)]
        assert ended.end == (20 + windows(0.096)) * WINDOW


def test_resumed_speech_withdraws_the_speculation_and_a_new_silence_speculates_again() -> None:
    """Speech after an UtteranceMayEnd yields UtteranceResumed (once); the utterance goes on,
    and its next silence speculates again with the longer audio, which the final matches."""
    seg = Segmenter(SPECULATING)
    feed(seg, [0.9] * 20)
    (first,) = feed(seg, [0.1] * windows(0.16))
    assert isinstance(first, UtteranceMayEnd)
    assert feed(seg, [0.1] * 3) == []  # still silent: no second speculation
    resumed = feed(seg, [0.9] * 10)
    assert [type(e) for e in resumed] == [UtteranceResumed]
    assert isinstance(resumed[0], UtteranceResumed) and resumed[0].index == first.index
    (second,) = feed(seg, [0.1] * windows(0.16))
    assert isinstance(second, UtteranceMayEnd) and second.index == first.index
    assert second.end > first.end
    ended = [e for e in feed(seg, [0.1] * 20) if isinstance(e, UtteranceEnded)]
    assert len(ended) == 1 and ended[0].end == second.end
    assert np.array_equal(ended[0].audio, second.audio)


def test_no_speculation_for_a_burst_too_short_to_be_a_final_or_when_off() -> None:
    """A burst under min_speech gets no UtteranceMayEnd (it makes no final); nor does
    anything with speculate_after=0."""
    seg = Segmenter(SPECULATING)
    events = feed(seg, [0.1] * 5 + [0.9] * 3 + [0.1] * 30)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    off = Segmenter(SegmenterConfig(partial_interval=0))
    events = feed(off, [0.9] * 20 + [0.1] * 30)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped, UtteranceEnded]


def test_flush_after_speculation_ends_with_the_speculated_audio() -> None:
    """A `finalize` in the silence after a speculation gives the final speculated."""
    seg = Segmenter(SPECULATING)
    feed(seg, [0.9] * 20)
    (may_end,) = feed(seg, [0.1] * windows(0.16))
    ended = [e for e in seg.flush() if isinstance(e, UtteranceEnded)]
    assert isinstance(may_end, UtteranceMayEnd) and len(ended) == 1
    assert (ended[0].start, ended[0].end) == (may_end.start, may_end.end)


def test_config_is_validated() -> None:
    """Nonsensical settings are refused at construction."""
    with pytest.raises(ValueError):
        SegmenterConfig(threshold=1.5)
    with pytest.raises(ValueError):
        SegmenterConfig(max_utterance=60)


async def test_real_vad_segments_jfk_into_phrases() -> None:
    """Silero VAD + segmenter cut the JFK clip into its 4 phrases, none lost."""
    audio = clip("en_jfk").samples()
    stream = VadStream(DirectScorer(SileroVad()))
    seg = Segmenter(SegmenterConfig())
    events: list[SegmentEvent] = []
    for i in range(0, len(audio), 333):  # odd frame sizes on purpose
        for window, p in await stream.process(audio[i : i + 333]):
            events.extend(seg.push(window, p))
    events.extend(seg.flush())
    ended = [e for e in events if isinstance(e, UtteranceEnded)]
    assert 3 <= len(ended) <= 6
    speech = sum(e.end - e.start for e in ended) / 16_000
    assert 7.0 < speech < 11.0
    assert all(b.start >= a.end for a, b in itertools.pairwise(ended))


async def test_real_vad_finds_no_speech_in_silence_and_noise() -> None:
    """Digital silence and low noise produce no utterance."""
    rng = np.random.default_rng(0)
    for audio in (
        np.zeros(16_000 * 5, np.float32),
        (rng.standard_normal(16_000 * 5) * 10 ** (-50 / 20)).astype(np.float32),
    ):
        stream = VadStream(DirectScorer(SileroVad()))
        seg = Segmenter(SegmenterConfig())
        events = [e for w, p in await stream.process(audio) for e in seg.push(w, p)]
        events += seg.flush()
        assert not any(isinstance(e, UtteranceEnded) for e in events)


def test_finalize_in_mid_speech_keeps_every_window_and_goes_on() -> None:
    """A client's cut in mid-speech ends the utterance with all the audio received; the
    speech goes on as the next utterance from exactly there (no window dropped, no
    SpeechStopped), which says it continues the cut one; the one after starts cold."""
    seg = Segmenter(SegmenterConfig(partial_interval=0, pre_roll=0.064, post_roll=0.064))
    events = feed(seg, [0.1] * 5 + [0.9] * 20)
    events += seg.finalize()
    # After the cut the speech dips below the threshold (a word's quiet consonant), then on.
    events += feed(seg, [0.4] * 3 + [0.9] * 20 + [0.1] * 20 + [0.9] * 20 + [0.1] * 20)
    kinds = [type(e) for e in events]
    assert kinds == [
        SpeechStarted,
        UtteranceEnded,
        SpeechStopped,
        UtteranceEnded,
        SpeechStarted,
        SpeechStopped,
        UtteranceEnded,
    ]
    cut, after, cold = [e for e in events if isinstance(e, UtteranceEnded)]
    assert cut.end == 25 * WINDOW and not cut.continues
    assert after.start == cut.end and after.continues
    assert list(np.unique(after.audio))[:3] == [0, 1, 2]  # the windows right after the cut
    assert not cold.continues


def test_finalize_in_a_pause_or_too_early_does_not_split() -> None:
    """A cut in a pause ends the utterance as an endpoint would (SpeechStopped, the next
    one starts cold); a cut before there is enough speech for a final cuts nothing, and
    that speech goes on into the next final."""
    seg = Segmenter(SegmenterConfig(partial_interval=0, post_roll=0.064, min_speech=0.25))
    events = feed(seg, [0.9] * 20 + [0.1] * 5) + seg.finalize()
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped, UtteranceEnded]
    early = Segmenter(SegmenterConfig(partial_interval=0, min_speech=0.25))
    feed(early, [0.9] * 3)
    assert early.finalize() == []
    events = feed(early, [0.9] * 10 + [0.1] * 20)
    [ended] = [e for e in events if isinstance(e, UtteranceEnded)]
    assert ended.start == 0 and not ended.continues


def test_finalize_in_silence_ends_with_the_speculated_audio_however_long_the_silence() -> None:
    """A client's `finalize` after the speculation, with more silence heard since (a
    client VAD's 0.2 s), ends the utterance with exactly the audio speculated (the silence
    after the post-roll trimmed); one after a single silent window ends it as an endpoint
    too (SpeechStopped, the next starts cold), not as a cut in mid-speech."""
    at_post_roll = SegmenterConfig(
        pre_roll=0.064, post_roll=0.096, min_silence=0.5, partial_interval=0, speculate_after=0.1
    )
    seg = Segmenter(at_post_roll)
    feed(seg, [0.9] * 20)
    (may_end,) = feed(seg, [0.1] * 3)  # at the post-roll
    assert isinstance(may_end, UtteranceMayEnd)
    assert feed(seg, [0.1] * 4) == []  # more silence: still below the endpoint
    events = seg.finalize()
    assert [type(e) for e in events] == [SpeechStopped, UtteranceEnded]
    ended = events[1]
    assert isinstance(ended, UtteranceEnded)
    assert (ended.start, ended.end) == (may_end.start, may_end.end)
    assert np.array_equal(ended.audio, may_end.audio)
    short = Segmenter(at_post_roll)
    feed(short, [0.9] * 20 + [0.1])
    events = short.finalize() + feed(short, [0.9] * 10 + [0.1] * 20)
    first, after = [e for e in events if isinstance(e, UtteranceEnded)]
    assert isinstance(events[0], SpeechStopped) and not after.continues
    assert first.end == 21 * WINDOW  # all it heard: the speech and its one silent window


def test_a_dip_is_speculated_and_a_cut_in_it_ends_the_utterance_there() -> None:
    """Windows under the threshold but in the hysteresis band (a recording's noise floor,
    which a client's VAD hears as silence) keep the utterance open; two in a row speculate
    the utterance as if it ended at its last window over the threshold (the post-roll heard
    so far), pause the partials, and a client's cut in that dip ends the utterance with
    exactly that audio. A window over the threshold withdraws it; a dip that turns into
    silence is speculated again there, and its endpoint keeps the dip."""
    config = SegmenterConfig(
        pre_roll=0, post_roll=0.096, min_silence=0.4, partial_interval=0.1, speculate_after=0.032
    )
    seg = Segmenter(config)
    feed(seg, [0.9] * 20)
    assert not any(isinstance(e, UtteranceMayEnd) for e in feed(seg, [0.45]))  # one is no dip
    (may_end,) = feed(seg, [0.45])
    assert isinstance(may_end, UtteranceMayEnd)
    assert may_end.end == 22 * WINDOW == seg.position  # the last strong window + 2 heard
    held = feed(seg, [0.42] * 6)  # the dip goes on: it holds, and no partial is due
    assert held == []
    ended = [e for e in seg.finalize() if isinstance(e, UtteranceEnded)]
    assert [(e.start, e.end) for e in ended] == [(may_end.start, may_end.end)]
    assert np.array_equal(ended[0].audio, may_end.audio)
    assert feed(seg, [0.45] * 10) == []  # the rest of the dip is no new speech

    seg = Segmenter(config)
    feed(seg, [0.9] * 20)
    kinds = [type(e) for e in feed(seg, [0.45, 0.45, 0.9]) if not isinstance(e, PartialDue)]
    assert kinds == [UtteranceMayEnd, UtteranceResumed]

    seg = Segmenter(config)
    feed(seg, [0.9] * 20 + [0.45] * 5)
    (again,) = feed(seg, [0.1])  # the dip turned into silence: speculated afresh
    assert isinstance(again, UtteranceMayEnd) and again.end == 26 * WINDOW
    [ended_at_endpoint] = [e for e in feed(seg, [0.1] * 20) if isinstance(e, UtteranceEnded)]
    assert ended_at_endpoint.end == again.end  # the dip is in the final

    seg = Segmenter(SegmenterConfig(pre_roll=0, post_roll=0.096, partial_interval=0))
    feed(seg, [0.9] * 20 + [0.45] * 5)  # speculation off: a cut in a dip ends it there too
    [off] = [e for e in seg.finalize() if isinstance(e, UtteranceEnded)]
    assert off.end == (20 + windows(0.096)) * WINDOW
