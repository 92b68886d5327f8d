"""The int8 shortlist rescored in float32: float32's greedy choice, on a synthetic
projection and on the real model's decoding of real speech."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soxr
import torch

from bench.corpus import clips
from engine.api import Utterance
from engine.whisper.int8 import int8_available
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from engine.whisper.vocabulary import MARGIN, FullHead, ShortlistHead, pick

pytestmark = pytest.mark.skipif(not int8_available(), reason="no fbgemm/x86 int8 kernels")

VOCABULARY = 4_096
WIDTH = 64


def projection_and_states(rows: int = 16) -> tuple[torch.nn.Linear, torch.Tensor]:
    """A projection without bias, and states whose best token stands out by a few logits
    (as a trained decoder's mostly do), each row at another scale."""
    torch.manual_seed(3)
    projection = torch.nn.Linear(WIDTH, VOCABULARY, bias=False)
    targets = torch.randint(0, VOCABULARY, (rows,))
    directions = projection.weight.detach()[targets]
    states = directions * 40 + torch.randn(rows, WIDTH)
    return projection, states * torch.logspace(-1, 1, rows)[:, None]


def test_the_shortlist_picks_float32s_token_with_its_exact_logit() -> None:
    """Tokens equal float32's argmax; log-probabilities within 1e-3 of float32's; and the
    chosen token's logit is float32's, so confident rows come out exact to rounding."""
    projection, states = projection_and_states()
    nothing = torch.zeros(0, dtype=torch.long)
    with torch.inference_mode():
        want_tokens, want_logprobs = pick(projection(states))
        got = ShortlistHead(projection, size=8).choose(states, nothing)
    assert torch.equal(got.tokens, want_tokens)
    assert torch.allclose(got.logprobs, want_logprobs, atol=1e-3)
    # The rows at the largest scales win by far more than the margin: none rescued.
    assert not bool(got.rescued[-4:].any())


def test_suppressed_tokens_are_never_chosen() -> None:
    """Suppressing each row's float32 winner gives float32's second choice, as FullHead
    (its log-probability within 0.01: more of the mass is in the int8 tail there)."""
    projection, states = projection_and_states()
    with torch.inference_mode():
        winners = projection(states).argmax(dim=-1).unique()
        full = FullHead(projection).choose(states, winners)
        short = ShortlistHead(projection, size=8).choose(states, winners)
    assert not bool(torch.isin(short.tokens, winners).any())
    assert torch.equal(short.tokens, full.tokens)
    assert torch.allclose(short.logprobs, full.logprobs, atol=1e-2)


def test_rows_the_shortlist_cannot_vouch_for_are_projected_in_full() -> None:
    """With a margin no int8 error could need, every row is rescued, and its choice is
    the full float32 projection's (to float32's rounding); with none, no row is."""
    projection, states = projection_and_states()
    nothing = torch.zeros(0, dtype=torch.long)
    with torch.inference_mode():
        full = FullHead(projection).choose(states, nothing)
        cautious = ShortlistHead(projection, size=4, margin=1e6).choose(states, nothing)
        bold = ShortlistHead(projection, size=4, margin=0.0).choose(states, nothing)
    assert bool(cautious.rescued.all())
    assert torch.equal(cautious.tokens, full.tokens)
    assert torch.allclose(cautious.logprobs, full.logprobs, rtol=0, atol=1e-5)
    assert not bool(bold.rescued.any())


@pytest.mark.parametrize("margin", [MARGIN, 1e6])
def test_a_rows_choice_does_not_depend_on_its_batch(margin: float) -> None:
    """Each row's token and log-probability are bit for bit the same alone and in the
    batch (the int8 kernel's activations are scaled per row; the rescoring is per row),
    whether the shortlist vouches for it or it is rescued in full."""
    projection, states = projection_and_states()
    head = ShortlistHead(projection, size=8, margin=margin)
    nothing = torch.zeros(0, dtype=torch.long)
    with torch.inference_mode():
        together = head.choose(states, nothing)
        for i in range(states.shape[0]):
            alone = head.choose(states[i : i + 1], nothing)
            assert int(alone.tokens[0]) == int(together.tokens[i]), i
            assert float(alone.logprobs[0]) == float(together.logprobs[i]), i


def test_the_shortlist_refuses_what_it_cannot_rescore() -> None:
    with pytest.raises(ValueError, match="without bias"):
        ShortlistHead(torch.nn.Linear(WIDTH, 16))
    with pytest.raises(ValueError, match="size"):
        ShortlistHead(torch.nn.Linear(WIDTH, 16, bias=False), size=17)


# The real model on real speech.


@pytest.fixture(scope="module")
def float32(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en)


@pytest.fixture(scope="module")
def shortlist(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en, WhisperRecognizerConfig(quantize="int8-shortlist"))


def english_clips() -> list[tuple[str, Utterance]]:
    """The English corpus clips (their first 29 s), and JFK at 8 kHz resampled to 16 kHz
    (the telephone audio per-row int8 layers mis-transcribe)."""
    english = [clip for clip in clips() if clip.language == "en"]
    chosen = [(clip.id, Utterance(clip.audio()[: 16_000 * 29])) for clip in english]
    jfk = clips(("en_jfk",))[0].audio()
    narrow = soxr.resample(soxr.resample(jfk, 16_000, 8_000), 8_000, 16_000)
    return [*chosen, ("en_jfk at 8 kHz", Utterance(narrow.astype(np.float32)))]


@pytest.mark.slow
def test_shortlist_tokens_equal_float32s_alone_and_batched(
    float32: WhisperRecognizer, shortlist: WhisperRecognizer
) -> None:
    """Every English corpus clip and JFK at 8 kHz, decoded alone and in batches of 8 on
    the 30 s window: the same tokens as float32, and log-probabilities within 0.1 per
    token (0.06 measured, where much of the mass is off the shortlist) and 0.005 on
    average (the guard's threshold is -1)."""
    selected = english_clips()
    with torch.inference_mode():
        for start in range(0, len(selected), 8):
            group = selected[start : start + 8]
            utterances = [utterance for _, utterance in group]
            want = float32.forward(utterances, 30.0)
            batched = shortlist.forward(utterances, 30.0)
            for (name, utterance), ref, got in zip(group, want, batched, strict=True):
                (alone,) = shortlist.forward([utterance], 30.0)
                assert got.tokens == ref.tokens == alone.tokens, name
                errors = np.abs(np.subtract(got.logprobs, ref.logprobs))
                assert errors.max(initial=0.0) < 0.1, name
                assert abs(got.avg_logprob - ref.avg_logprob) < 0.005, name
                assert got.no_speech_prob == pytest.approx(ref.no_speech_prob, abs=1e-5), name


@pytest.mark.slow
def test_shortlist_drafts_change_nothing_but_the_work(shortlist: WhisperRecognizer) -> None:
    """Right, half-right and wrong drafts decode to the tokens of no draft."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:4]
    greedy = shortlist.whisper.greedy
    prompts = torch.tensor([shortlist.whisper.prompt_tail] * len(selected))
    budgets = [60] * len(selected)
    with torch.inference_mode():
        batch = [Utterance(clip.audio()) for clip in selected]
        hidden = shortlist.whisper.encoders.encode(30.0, shortlist.preprocess(batch, 30.0))
        plain = greedy.decode(greedy.start(hidden), prompts, budgets)
        truth = [[t for t in row if t < 50256] for row in plain.tokens.tolist()]
        drafts = [truth[0], truth[1][: len(truth[1]) // 2], [400, 401], [*truth[3], 13, 13]]
        checked = greedy.decode(greedy.start(hidden), prompts, budgets, drafts)
    for i, clip in enumerate(selected):
        assert [t for t in checked.tokens[i].tolist() if t < 50256] == truth[i], clip.id
