"""The lean greedy decoder against transformers' generate(), on real speech."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from bench.corpus import clips
from bench.flush_lead import counted_passes
from engine.api import Utterance
from engine.whisper.decoding import read_row
from engine.whisper.greedy import Greedy
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recognizer(tiny_en: Path) -> WhisperRecognizer:
    return WhisperRecognizer(tiny_en)


def test_greedy_tokens_equal_generate_on_a_mixed_batch(recognizer: WhisperRecognizer) -> None:
    """Eight clips of 2-11 s in one batch: the same tokens as generate(), row by row, and
    log-probabilities equal to log_softmax of generate()'s own scores."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:8]
    batch = [Utterance(clip.audio()) for clip in selected]
    window = recognizer.windows[-1]
    model = recognizer.whisper.model
    with torch.inference_mode():
        features = recognizer.preprocess(batch, window)
        hidden = recognizer.whisper.encoders.encode(window, features)
        started = recognizer.whisper.greedy.start(hidden)
        prompts = torch.tensor([recognizer.whisper.prompt_tail] * len(batch))
        greedy = recognizer.whisper.greedy.decode(started, prompts, [100] * len(batch))
        reference = model.generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
            max_length=100,
            output_scores=True,
            return_dict_in_generate=True,
        )
    expected = reference.sequences[:, -len(reference.scores) :]
    for i, clip in enumerate(selected):
        row = read_row(greedy.tokens[i].tolist(), greedy.logprobs[i], end_token=50256, budget=100)
        want = [t for t in expected[i].tolist() if t < 50256]
        assert row.tokens == want, clip.id
        scores = torch.stack([step[i] for step in reference.scores])[: len(want) + 1]
        logprobs = scores.log_softmax(-1).gather(1, expected[i, : len(want) + 1, None])[:, 0]
        assert row.avg_logprob == pytest.approx(float(logprobs.mean()), abs=1e-4), clip.id
    # No-speech: the start step's logits equal the decoder's own at <|startoftranscript|>.
    with torch.inference_mode():
        ids = torch.full((len(batch), 1), 50257)
        states = model.model.decoder(input_ids=ids, encoder_hidden_states=hidden).last_hidden_state
        logits = model.proj_out(states[:, 0])
    assert torch.allclose(started.logits, logits, atol=1e-4)


def test_drafts_change_nothing_but_the_work(recognizer: WhisperRecognizer) -> None:
    """Right, half-right, wrong, empty and over-long drafts in one batch: every row decodes
    to exactly the tokens it decodes to without drafts, and a right draft takes a couple of
    decoder steps instead of one per token."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:5]
    batch = [Utterance(clip.audio()) for clip in selected]
    greedy = recognizer.whisper.greedy
    prompts = torch.tensor([recognizer.whisper.prompt_tail] * len(batch))
    budgets = [60] * len(batch)
    with torch.inference_mode():
        hidden = recognizer.whisper.encoders.encode(30.0, recognizer.preprocess(batch, 30.0))
        plain = greedy.decode(greedy.start(hidden), prompts, budgets)
        truth = [[t for t in row if t < 50256] for row in plain.tokens.tolist()]
        drafts = [
            truth[0],  # right
            [*truth[1][: len(truth[1]) // 2], 11, 11, 11],  # right, then wrong
            [400, 401, 402],  # wrong from the start
            [],  # none
            truth[4] + [13, 13, 13, 13],  # right, then more than there is
        ]
        with counted_passes() as passes:
            checked = greedy.decode(greedy.start(hidden), prompts, budgets, drafts)
    for i in range(len(batch)):
        assert [t for t in checked.tokens[i].tolist() if t < 50256] == truth[i], selected[i].id
        n = len(truth[i]) + 1
        assert torch.allclose(checked.logprobs[i, :n], plain.logprobs[i, :n], atol=1e-3)
    # start, prompt, drafts, then one step per token the worst row (the draftless one,
    # or the wrong one) still needs; far fewer than without drafts only if every row had
    # a good draft, so check a batch of right drafts alone too.
    assert passes[0] <= 3 + max(len(row) for row in truth)
    with torch.inference_mode(), counted_passes() as passes:
        again = greedy.decode(greedy.start(hidden), prompts, budgets, truth)
    assert again.tokens.tolist() == plain.tokens[:, : again.tokens.shape[1]].tolist()
    assert passes[0] == 3  # start, prompt, drafts (whose pass also chooses the end)


def test_a_row_finds_its_way_back_to_its_draft(recognizer: WhisperRecognizer) -> None:
    """Drafts right but for one token in their middle (a partial's comma that the final
    drops, a word it adds or spells otherwise): the tokens are those of no draft, and
    after the token that differs each row goes on checking the rest of its draft, in a
    handful of passes, not one step per token left."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:3]
    batch = [Utterance(clip.audio()) for clip in selected]
    greedy = recognizer.whisper.greedy
    prompts = torch.tensor([recognizer.whisper.prompt_tail] * len(batch))
    budgets = [80] * len(batch)
    with torch.inference_mode():
        hidden = recognizer.whisper.encoders.encode(30.0, recognizer.preprocess(batch, 30.0))
        plain = greedy.decode(greedy.start(hidden), prompts, budgets)
        truth = [[t for t in row if t < 50256] for row in plain.tokens.tolist()]
        assert min(map(len, truth)) >= 16
        mid = [len(row) // 2 for row in truth]
        drafts = [
            [*truth[0][: mid[0]], 11, *truth[0][mid[0] + 1 :]],  # one token spelled otherwise
            [*truth[1][: mid[1]], *truth[1][mid[1] + 1 :]],  # one token left out
            [*truth[2][: mid[2]], 11, *truth[2][mid[2] :]],  # one token too many
        ]
        for i, draft in enumerate(drafts):
            with counted_passes() as passes:
                checked = greedy.decode(
                    greedy.start(hidden[i : i + 1]), prompts[:1], budgets[:1], [draft]
                )
            assert [t for t in checked.tokens[0].tolist() if t < 50256] == truth[i], selected[i].id
            n = len(truth[i]) + 1
            assert torch.allclose(checked.logprobs[0, :n], plain.logprobs[i, :n], atol=1e-3)
            # start, prompt, drafts (which chooses the token that differs), a step at most,
            # the check of the rest (which chooses the end)
            assert passes[0] <= 5, (selected[i].id, passes[0], len(truth[i]))


def test_a_started_batch_decodes_once(recognizer: WhisperRecognizer) -> None:
    with torch.inference_mode():
        hidden = recognizer.whisper.encoders.encode(
            10.0, recognizer.preprocess([Utterance(clips(("en_jfk",))[0].audio())], 10.0)
        )
        started = recognizer.whisper.greedy.start(hidden)
        prompts = torch.tensor([recognizer.whisper.prompt_tail])
        recognizer.whisper.greedy.decode(started, prompts, [5])
        with pytest.raises(RuntimeError, match="decoded already"):
            recognizer.whisper.greedy.decode(started, prompts, [5])


def test_a_partials_text_as_draft_leaves_the_final_as_it_was(
    recognizer: WhisperRecognizer,
) -> None:
    """As a session uses it: the text of the first 60 % of each clip, as the draft of the
    whole clip, gives the same text and average log-probability as no draft."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:6]
    audio = [clip.audio() for clip in selected]
    partials = recognizer.transcribe([Utterance(a[: int(len(a) * 0.6)]) for a in audio])
    plain = recognizer.transcribe([Utterance(a) for a in audio])
    drafted = recognizer.transcribe(
        [Utterance(a, draft=p.text) for a, p in zip(audio, partials, strict=True)]
    )
    assert any(p.text for p in partials)
    for clip, want, got in zip(selected, plain, drafted, strict=True):
        assert got.text == want.text, clip.id
        assert got.avg_logprob == pytest.approx(want.avg_logprob, abs=1e-3), clip.id


def test_a_long_kept_draft_beside_a_long_decoding_fits_a_tight_cache(
    recognizer: WhisperRecognizer,
) -> None:
    """Row 0 keeps its whole (right) draft at once; row 1 has none and decodes token by
    token. With a cache just big enough for the budget, row 0 must not grow past it while
    row 1 finishes."""
    selected = clips(("en_jfk", "en_ls_1221-135766-0001"))
    batch = [Utterance(clip.audio()) for clip in selected]
    greedy = recognizer.whisper.greedy
    prompts = torch.tensor([recognizer.whisper.prompt_tail] * 2)
    budgets = [60, 60]  # row 1 needs 55 tokens; row 0 keeps 24 at once
    positions = 1 + prompts.shape[1] + max(budgets)
    with torch.inference_mode():
        hidden = recognizer.whisper.encoders.encode(30.0, recognizer.preprocess(batch, 30.0))
        plain = greedy.decode(greedy.start(hidden, positions), prompts, budgets)
        truth = [[t for t in row if t < 50256] for row in plain.tokens.tolist()]
        drafted = greedy.decode(greedy.start(hidden, positions), prompts, budgets, [truth[0], []])
    assert [[t for t in row if t < 50256] for row in drafted.tokens.tolist()] == truth


def test_a_new_cache_holds_zeros_not_garbage(recognizer: WhisperRecognizer) -> None:
    """Rows at different lengths mask each other's unwritten slots, and a masked NaN still
    poisons attention (0 x NaN): seen once in CI as 'min should be less than or equal to
    max' from the int8 kernel. So the slots start at zero."""
    with torch.inference_mode():
        started = recognizer.whisper.greedy.start(torch.zeros(2, 500, 384), 40)
    cache = started.take_cache()
    assert bool((cache.keys[:, :, :, 1:] == 0).all()) and bool(
        (cache.values[:, :, :, 1:] == 0).all()
    )
    assert int(cache.lengths.max()) == 1


@pytest.fixture(scope="module")
def int8_decoder(tiny_en: Path) -> WhisperRecognizer:
    """The CPU default of the server: the decoder's layers in int8, scales per row."""
    return WhisperRecognizer(tiny_en, WhisperRecognizerConfig(quantize="int8-decoder"))


def test_an_int8_rows_result_does_not_depend_on_its_batch(
    int8_decoder: WhisperRecognizer,
) -> None:
    """Eight clips decoded together and each alone, from the same encoder states: every
    row's start logits are bit for bit the same, and so are its tokens (activations are
    quantized per row, not per call)."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:8]
    greedy = int8_decoder.whisper.greedy
    prompt = int8_decoder.whisper.prompt_tail
    with torch.inference_mode():
        hidden = torch.cat(
            [
                int8_decoder.whisper.encoders.encode(30.0, int8_decoder.preprocess([u], 30.0))
                for u in (Utterance(clip.audio()) for clip in selected)
            ]
        )
        started = greedy.start(hidden)
        logits = started.logits.clone()
        together = greedy.decode(started, torch.tensor([prompt] * 8), [60] * 8)
        for i, clip in enumerate(selected):
            alone_started = greedy.start(hidden[i : i + 1])
            assert torch.equal(alone_started.logits[0], logits[i]), clip.id
            alone = greedy.decode(alone_started, torch.tensor([prompt]), [60])
            width = alone.tokens.shape[1]
            assert alone.tokens[0].tolist() == together.tokens[i, :width].tolist(), clip.id


def test_int8_drafts_change_nothing_but_the_work(int8_decoder: WhisperRecognizer) -> None:
    """With int8 layers too, right, half-right and wrong drafts decode to the tokens of no
    draft (per-call scales once made a many-token draft check round differently)."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:6]
    audio = [clip.audio() for clip in selected]
    greedy = int8_decoder.whisper.greedy
    prompts = torch.tensor([int8_decoder.whisper.prompt_tail] * len(audio))
    budgets = [60] * len(audio)
    with torch.inference_mode():
        hidden = int8_decoder.whisper.encoders.encode(
            30.0, int8_decoder.preprocess([Utterance(a) for a in audio], 30.0)
        )
        plain = greedy.decode(greedy.start(hidden), prompts, budgets)
        truth = [[t for t in row if t < 50256] for row in plain.tokens.tolist()]
        drafts = [
            truth[0],
            truth[1][: len(truth[1]) // 2],
            [*truth[2][: len(truth[2]) // 2], 11, 11],
            [400, 401],
            truth[4] + [13, 13],
            truth[5][:3],
        ]
        checked = greedy.decode(greedy.start(hidden), prompts, budgets, drafts)
    for i, clip in enumerate(selected):
        assert [t for t in checked.tokens[i].tolist() if t < 50256] == truth[i], clip.id


def test_one_pass_start_decodes_as_start_then_decode(recognizer: WhisperRecognizer) -> None:
    """`start_and_decode` (prefix, <|startoftranscript|>, prompt and draft in one decoder
    pass) against `start` then `decode` (three passes), on rows with and without a prefix
    of previous text, forced text of their own lengths after the prompt, and right,
    half-right, wrong and no drafts: the same tokens, log-probabilities and logits at
    <|startoftranscript|>, and a right draft takes this one pass (which also chooses the
    end after it) instead of three."""
    selected = clips(("en_ls_", "en_jfk", "en_lj_LJ0"))[:5]
    greedy = recognizer.whisper.greedy
    tail = recognizer.whisper.prompt_tail
    words = recognizer.whisper.draft_tokens
    prefixes = [
        [],
        [recognizer.whisper.prev, *words("We met on Monday.")],
        [],
        [],
        [recognizer.whisper.prev],
    ]
    prompts = [[*tail], [*tail], [*tail, *words("And then")], [*tail], [*tail, *words("So")]]
    budgets = [60] * len(selected)
    with torch.inference_mode():
        hidden = recognizer.whisper.encoders.encode(
            30.0, recognizer.preprocess([Utterance(c.audio()) for c in selected], 30.0)
        )

        def three_passes(drafts: list[list[int]] | None) -> tuple[torch.Tensor, Greedy]:
            started = greedy.start(hidden, 120, prefixes)
            width = max(map(len, prompts))
            padded = torch.tensor([p + [50256] * (width - len(p)) for p in prompts])
            lengths = [len(p) for p in prompts]
            return started.logits, greedy.decode(
                started, padded, budgets, drafts, prompt_lengths=lengths
            )

        logits, plain = three_passes(None)
        truth = [[t for t in row if t < 50256] for row in plain.tokens.tolist()]
        drafts = [
            truth[0],
            [*truth[1][: len(truth[1]) // 2], 11, 11],
            [400, 401, 402],
            [],
            truth[4][:3],
        ]
        _, drafted = three_passes(drafts)
        for guesses in (None, drafts):
            started, fused = greedy.start_and_decode(
                hidden, 120, prefixes, prompts, budgets, guesses
            )
            assert torch.allclose(started.logits, logits, atol=1e-4)
            width = fused.tokens.shape[1]
            assert fused.tokens.tolist() == plain.tokens[:, :width].tolist()
            assert torch.allclose(fused.logprobs, plain.logprobs[:, :width], atol=1e-4)
        assert drafted.tokens.tolist() == fused.tokens.tolist()
        with counted_passes() as passes:
            greedy.start_and_decode(hidden[:1], 120, None, [tail], [60], [truth[0]])
    assert passes[0] == 1
