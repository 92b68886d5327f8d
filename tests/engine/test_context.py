"""Left context: the pure helpers, then the real model on corpus speech behind the speech
that came before it (engine/whisper/context.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.corpus import clips
from engine.api import SAMPLE_RATE, LeftContext, Utterance, WordTiming
from engine.whisper import context
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from loadgen.wer import error_rate

# Consecutive sentences of one reader: the second continues the first.
PAIRS = (("en_lj_LJ001-0001", "en_lj_LJ001-0002"), ("en_lj_LJ001-0007", "en_lj_LJ001-0008"))
GAP = np.zeros(SAMPLE_RATE // 2, np.float32)


def _seconds(n: float) -> np.ndarray:
    return np.zeros(round(n * SAMPLE_RATE), np.float32)


def test_fitted_drops_a_context_that_does_not_fit_or_says_nothing() -> None:
    """The context stays while context and utterance fit the room and it has text."""
    left = LeftContext(_seconds(4.0), "Said before.")
    utterance = Utterance(_seconds(3.0), left=left)
    assert context.fitted(utterance, 7.0) is utterance
    assert context.fitted(utterance, 6.9).left is None
    assert (
        context.fitted(dataclasses.replace(utterance, left=LeftContext(left.audio, " ")), 29.0).left
        is None
    )
    assert context.span(utterance) == pytest.approx(7.0)
    # Two utterances of context: the oldest goes first, then the last.
    two = LeftContext(_seconds(9.0), "Older. Said before.", shorter=left)
    assert context.fitted(dataclasses.replace(utterance, left=two), 12.0).left is two
    assert context.fitted(dataclasses.replace(utterance, left=two), 11.9).left is left
    assert context.fitted(dataclasses.replace(utterance, left=two), 6.9).left is None
    assert len(context.window_audio(utterance)) == 7 * SAMPLE_RATE
    assert context.window_audio(Utterance(_seconds(1.0))).shape == (SAMPLE_RATE,)


def test_filled_keeps_the_last_words_that_fit_cut_between_words() -> None:
    """A timed context too long for the room keeps its last words that fit, its audio
    from halfway between the word before and the first kept, words on the cut's time; a
    context that fits stays whole; an untimed one drops whole utterances (`fitted`); one
    whose last word does not fit goes."""
    audio = np.arange(6 * SAMPLE_RATE, dtype=np.float32)
    words = (
        WordTiming(" One", 0.2, 0.8, 0.9),
        WordTiming(" two.", 1.0, 1.6, 0.9),
        WordTiming(" Three", 3.4, 4.0, 0.9),  # the next utterance, after a gap
        WordTiming(" four.", 4.2, 5.0, 0.9),
    )
    left = LeftContext(audio, "One two. Three four.", words=words)
    utterance = Utterance(_seconds(3.0), left=left)
    assert context.filled(utterance, 9.0) is utterance
    cut = context.filled(utterance, 6.5).left  # 3.5 s of context: from 2.5 s ("Three")
    assert cut is not None
    assert cut.text == "Three four."
    assert cut.audio[0] == 2.5 * SAMPLE_RATE and cut.duration == pytest.approx(3.5)
    assert [(w.word, w.start, w.end) for w in cut.words] == [
        (" Three", 0.9, 1.5),
        (" four.", 1.7, 2.5),
    ]
    last = context.filled(utterance, 4.95).left  # 1.95 s: " four." from 4.1 s
    assert last is not None and last.text == "four." and last.duration == pytest.approx(1.9)
    assert context.filled(utterance, 4.8).left is None  # 1.8 s < 1.9 s
    untimed = dataclasses.replace(utterance, left=LeftContext(audio, "One two. Three four."))
    assert context.filled(untimed, 8.9).left is None
    shorter = LeftContext(audio[: 2 * SAMPLE_RATE], "Three four.")
    two = dataclasses.replace(
        utterance, left=LeftContext(audio, "One two. Three four.", shorter=shorter)
    )
    assert context.filled(two, 5.0).left is shorter


def test_lead_trimmed_counts_the_tokens_before_the_first_word() -> None:
    """Punctuation and spaces the context's text lacked are the context's; a word or a
    number starts the utterance."""
    spelled = {1: ".", 2: " ,", 3: " Thanks", 4: " 10", 5: "!"}
    assert context.lead_trimmed([1, 2, 3, 5], spelled.__getitem__) == 2
    assert context.lead_trimmed([4, 1], spelled.__getitem__) == 0
    assert context.lead_trimmed([1, 5], spelled.__getitem__) == 2
    assert context.lead_trimmed([], spelled.__getitem__) == 0


def test_shifted_moves_words_onto_the_utterance_and_keeps_them_inside() -> None:
    """Times over the whole window, less the context's length, inside [0, duration]."""
    words = (
        WordTiming(" a", 2.9, 3.4, 0.9),
        WordTiming(" b", 3.4, 4.0, 0.8),
        WordTiming(" c", 4.0, 9.0, 0.7),
    )
    moved = context.shifted(words, 3.0, 5.0)
    assert [(w.word, w.start, w.end) for w in moved] == [
        (" a", 0.0, 0.4),
        (" b", 0.4, 1.0),
        (" c", 1.0, 5.0),
    ]


@pytest.fixture(scope="module")
def recognizer(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en)


def _record_windows(recognizer: WhisperRecognizer, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The encoder windows `recognizer` runs from now on, in order (the encoder still runs)."""
    windows: list[float] = []
    encode = recognizer.whisper.encoders.encode

    def recorded(window: float, features: torch.Tensor) -> torch.Tensor:
        windows.append(window)
        return encode(window, features)

    monkeypatch.setattr(recognizer.whisper.encoders, "encode", recorded)
    return windows


def _after(recognizer: WhisperRecognizer, before: str, after: str) -> tuple[Utterance, str]:
    """The second clip as an utterance behind the first (its decoded text), its reference."""
    first, second = clips((before,))[0], clips((after,))[0]
    said = recognizer.transcribe([Utterance(first.audio())])[0].text
    left = LeftContext(np.concatenate([first.audio(), GAP]), said)
    return Utterance(second.audio(), left=left, word_timings=True), second.reference


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), PAIRS)
def test_a_short_utterance_behind_its_context_says_only_itself(
    recognizer: WhisperRecognizer, before: str, after: str
) -> None:
    """A short sentence decoded behind the one before it: its own words only (nothing of
    the context repeated), no leading punctuation, and word timings on its own time,
    inside it, in order, joining to its text."""
    utterance, reference = _after(recognizer, before, after)
    result = recognizer.transcribe([utterance])[0]
    assert error_rate(reference, result.text) == 0.0, result.text
    assert result.text[0].isalnum(), result.text
    assert "".join(w.word for w in result.words).strip() == result.text
    starts = [w.start for w in result.words]
    assert starts == sorted(starts)
    assert all(0.0 <= w.start <= w.end <= utterance.duration for w in result.words)
    assert result.words[0].start < 0.6  # the clip's speech starts within its first half second


@pytest.mark.slow
def test_a_row_with_context_decodes_alike_whatever_its_batch_mates(
    recognizer: WhisperRecognizer, tiny_en: Path
) -> None:
    """Rows with contexts of different lengths and rows without one share a batch: each
    row's text and scores equal its decoding alone (in the 30 s window, which every row
    gets alone and in the batch)."""
    full = WhisperRecognizer(tiny_en, WhisperRecognizerConfig(windows=(30.0,)))
    batch = [_after(recognizer, *pair)[0] for pair in PAIRS]
    batch += [Utterance(clips(("en_ls_61-",))[0].audio()), dataclasses.replace(batch[0], left=None)]
    together = full.transcribe(batch)
    alone = [full.transcribe([utterance])[0] for utterance in batch]
    assert [r.text for r in together] == [r.text for r in alone]
    for mixed, single in zip(together, alone, strict=True):
        assert mixed.avg_logprob == pytest.approx(single.avg_logprob, abs=1e-4)


@pytest.mark.slow
def test_noise_behind_speech_gives_empty_text(recognizer: WhisperRecognizer) -> None:
    """Low noise after a sentence: no text, the context's speech notwithstanding.

    (Digital silence there gives "com.": the no-speech probability is read with the
    context's speech in the window. The VAD never cuts digital silence as an utterance.)"""
    first = clips(("en_lj_LJ001-0007",))[0].audio()
    said = recognizer.transcribe([Utterance(first)])[0].text
    left = LeftContext(np.concatenate([first, GAP]), said)
    noise = np.random.default_rng(3).normal(0, 0.003, SAMPLE_RATE * 2).astype(np.float32)
    assert recognizer.transcribe([Utterance(noise, left=left)])[0].text == ""


def test_repeats_itself_spots_an_utterance_said_twice() -> None:
    """The first four words again later (case and punctuation aside): said twice; a
    word repeated, or fewer than four words, is not."""
    twice = "And it is worth mention in passing, and it is worth mention in passing"
    assert context.repeats_itself(twice)
    assert context.repeats_itself("Go forward 10 meters. Go forward 10 meters.")
    assert not context.repeats_itself("Word, another word, here's some more word, word, word.")
    assert not context.repeats_itself("Ask not. Ask not.")
    assert not context.repeats_itself("The billing page is ready, but the designers want it.")


def test_repeats_context_spots_the_context_read_again() -> None:
    """Four words in a row of the context's text again (case and punctuation aside): the
    context re-read; fewer in a longer text, or words in another order, are not."""
    said = "Ask what you can do for your country."
    assert context.repeats_context("I will ask what you can do for your country.", said)
    assert context.repeats_context("You can do for your country.", said)
    assert not context.repeats_context("What your country can do for you.", said)
    assert not context.repeats_context("Your country, ask.", said)
    assert not context.repeats_context("", said)


def test_repeats_context_spots_a_short_final_that_is_all_context() -> None:
    """A final shorter than four words that stands whole in the context's text, word for
    word, is the context read again (the same short final once per utterance); the same
    words out of order, or one word the context lacks, are not."""
    assert context.repeats_context("That's the answer.", "Well. That's the answer.")
    assert context.repeats_context("yes", "Yes.")
    assert not context.repeats_context("The answer's that.", "Well. That's the answer.")
    assert not context.repeats_context("That's an answer.", "Well. That's the answer.")


@pytest.mark.slow
def test_the_breath_after_a_sentence_behind_it_gives_empty_text(
    recognizer: WhisperRecognizer,
) -> None:
    """The JFK clip's last quarter second (the breath after "country") and silence, cut
    as an utterance behind the sentence before it, as the browser's dropped-stream test
    streamed it: behind that context tiny.en wrote "I don't know." (log-probability -1.3)
    or re-read the context; decoded again without it, it is no speech."""
    audio = clips(("en_jfk",))[0].audio()
    sentence = audio[round(7.968 * SAMPLE_RATE) : round(10.56 * SAMPLE_RATE)]
    gap = _seconds(0.192)
    said = "Ask what you can do for your country."
    for start in (10.752, 10.8):  # "I don't know.", "I will ask what you can do for ..."
        breath = np.concatenate([audio[round(start * SAMPLE_RATE) :], _seconds(0.328)])
        left = LeftContext(np.concatenate([sentence, gap]), said)
        result = recognizer.transcribe([Utterance(breath, left=left, word_timings=True)])[0]
        assert result.text == "", (start, result.text)


@pytest.mark.slow
def test_a_context_never_widens_the_window_past_context_window(
    recognizer: WhisperRecognizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A two-sentence context that with the utterance needs the 30 s window: the
    recognizer drops the older sentence and decodes in the 15 s window behind the last
    one, the utterance's words right."""
    utterance, reference = _after(recognizer, *PAIRS[0])
    assert utterance.left is not None
    older = clips((PAIRS[1][0],))[0].audio()
    two = LeftContext(
        np.concatenate([older, GAP, utterance.left.audio]),
        "Older words. " + utterance.left.text,
        shorter=utterance.left,
    )
    assert context.span(dataclasses.replace(utterance, left=two)) > 20.0
    windows = _record_windows(recognizer, monkeypatch)
    result = recognizer.transcribe([dataclasses.replace(utterance, left=two)])[0]
    assert windows == [15.0]
    assert error_rate(reference, result.text) == 0.0, result.text


@pytest.mark.slow
def test_a_context_in_its_own_window_keeps_the_window_and_the_words(
    tiny_en: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`context_own_window`: the previous sentence (timed, as a committer passes it) is
    cut to the room the utterance leaves in the window it has alone, and the encoder runs
    that window only; the utterance says its own words. (This 1.9 s sentence behind 6.8 s
    of context, 1 s of the window after it, loops there: it is decoded again without its
    context in the same window, not on the full one:
    docs/history/2026-12-02-quality-and-left-context.md#left-context-in-the-finals-own-window-issue-17-against-issue-15-branch-ctx.)"""
    own = WhisperRecognizer(tiny_en, WhisperRecognizerConfig(context_own_window=True))
    first, second = clips((PAIRS[0][0],))[0], clips((PAIRS[0][1],))[0]
    said = own.transcribe([Utterance(first.audio(), word_timings=True)])[0]
    assert said.words
    left = LeftContext(np.concatenate([first.audio(), GAP]), said.text, words=said.words)
    utterance = Utterance(second.audio(), left=left, word_timings=True)
    alone = own.window([dataclasses.replace(utterance, left=None)])
    assert context.span(utterance) + own.config.window_margin > alone  # it would widen it
    fitted = own.fit_context(utterance)
    assert fitted.left is not None and fitted.left.text
    assert left.text.endswith(fitted.left.text) and len(fitted.left.text) < len(left.text)
    assert own.window([fitted]) == alone
    windows = _record_windows(own, monkeypatch)
    result = own.transcribe([utterance])[0]
    assert set(windows) == {alone}
    assert error_rate(second.reference, result.text) == 0.0, result.text
    assert all(0.0 <= w.start <= w.end <= utterance.duration for w in result.words)
