"""Decoder steps over fixed buffers (`engine.whisper.step_graphs`), on the CPU: the same tokens as
eager decoding. The CUDA graph capture itself needs a GPU (bench/gpu_check measures it)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from bench.corpus import clips
from engine.api import Utterance
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from engine.whisper.step_graphs import StepGraphs, bucket
from server.settings import SettingError, Settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def eager(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en)


@pytest.fixture(scope="module")
def graphed(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en, WhisperRecognizerConfig(decoder_graphs=True))


def graphs_of(recognizer: WhisperRecognizer) -> StepGraphs:
    graphs = recognizer.whisper.greedy.graphs
    assert graphs is not None
    return graphs


def test_a_batch_is_padded_to_the_next_power_of_two() -> None:
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 33, 64)] == [1, 2, 4, 4, 8, 8, 16, 64, 64]
    with pytest.raises(ValueError):
        bucket(0)


def test_fixed_buffers_decode_the_tokens_eager_steps_do(
    eager: WhisperRecognizer, graphed: WhisperRecognizer
) -> None:
    """Five rows (a bucket of 8, three rows of padding) at different positions (drafts kept
    to different lengths, one row none) and ending at different steps: every token and
    log-probability is eager decoding's."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:5]
    batch = [Utterance(clip.audio()) for clip in selected]
    prompts = torch.tensor([eager.whisper.prompt_tail] * len(batch))
    budgets = [60] * len(batch)
    with torch.inference_mode():
        hidden = eager.whisper.encoders.encode(30.0, eager.preprocess(batch, 30.0))
        plain = eager.whisper.greedy.decode(eager.whisper.greedy.start(hidden), prompts, budgets)
        truth = [[t for t in row if t < 50256] for row in plain.tokens.tolist()]
        drafts = [truth[0][:3], [], truth[2][:8], [400, 401], truth[4]]
        greedy = graphed.whisper.greedy
        fixed = greedy.decode(greedy.start(hidden), prompts, budgets, drafts)
    for i, clip in enumerate(selected):
        assert [t for t in fixed.tokens[i].tolist() if t < 50256] == truth[i], clip.id
        n = len(truth[i]) + 1
        assert torch.allclose(fixed.logprobs[i, :n], plain.logprobs[i, :n], atol=1e-3), clip.id
    (shape,) = graphs_of(graphed).shapes
    assert shape == (8, hidden.shape[1], hidden.dtype)


def test_the_recognizer_transcribes_the_same_with_them(
    eager: WhisperRecognizer, graphed: WhisperRecognizer
) -> None:
    """Through `transcribe` (windows, the guard, word timings): the same text and words as
    eager steps, batch after batch, each in the buffers of its own shape."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0", "en_mfa_"))[:7]
    utterances = [Utterance(clip.audio(), word_timings=True) for clip in selected]
    for batch in (utterances[:3], utterances[3:4], utterances[4:]):
        want = eager.transcribe(batch)
        got = graphed.transcribe(batch)
        assert [t.text for t in got] == [t.text for t in want]
        assert [[w.word for w in t.words] for t in got] == [[w.word for w in t.words] for t in want]
    assert {shape[0] for shape in graphs_of(graphed).shapes} >= {1, 4}


def test_two_threads_decoding_at_once_keep_to_their_own_buffers(
    eager: WhisperRecognizer, graphed: WhisperRecognizer
) -> None:
    """Two model workers (threads) decode a batch of the same shape at once (the same
    batch: the same window and positions): each gets buffers of its own, or one would
    reset the other's lengths halfway and both would read garbage."""
    batch = [Utterance(c.audio()) for c in clips(("en_ls_", "en_lj_LJ0"))[:3]]
    want = [t.text for t in eager.transcribe(batch)]
    with ThreadPoolExecutor(2) as pool:
        for _ in range(3):
            got = list(pool.map(lambda b: [t.text for t in graphed.transcribe(b)], [batch] * 2))
            assert got == [want, want]


def test_the_oldest_graphs_go_when_their_buffers_pass_the_budget(
    eager: WhisperRecognizer,
) -> None:
    """Graphs are kept by shape (bucket, window, dtype; not positions: the buffers hold
    them all) while their buffers fit `max_bytes`, the newest always."""
    step = eager.whisper.greedy.step
    utterance = Utterance(clips(("en_jfk",))[0].audio())
    hiddens = []
    with torch.inference_mode():
        for window in (10.0, 30.0):
            features = eager.preprocess([utterance], window)
            hiddens.append(eager.whisper.encoders.encode(window, features))
    roomy = StepGraphs(step, 50256, capture=False)
    tight = StepGraphs(step, 50256, capture=False, max_bytes=1)
    with torch.inference_mode():
        for graphs in (roomy, tight):
            for hidden, positions in ((hiddens[0], 40), (hiddens[0], 90), (hiddens[1], 40)):
                graphs.load(step.cache(hidden, positions))
    frames = [hidden.shape[1] for hidden in hiddens]
    assert roomy.shapes == [(1, frames[0], torch.float32), (1, frames[1], torch.float32)]
    assert tight.shapes == [(1, frames[1], torch.float32)]


def test_graphs_are_a_setting_refused_on_a_cpu_device() -> None:
    assert Settings.from_env({"PARLEY_DECODER_GRAPHS": "on"}).model.decoder_graphs
    with pytest.raises(SettingError, match="PARLEY_DECODER_GRAPHS"):
        Settings.from_env({"PARLEY_DECODER_GRAPHS": "on", "PARLEY_DEVICE": "cpu"})
