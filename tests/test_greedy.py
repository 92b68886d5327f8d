"""The lean greedy decoder against transformers' generate(), on real speech."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from bench.corpus import clips
from engine.decoding import read_row
from engine.recognizer import Utterance
from engine.whisper import WhisperRecognizer

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
    model = recognizer._model
    with torch.inference_mode():
        features = recognizer._preprocess(batch, window)
        hidden = recognizer._encoders.encode(window, features)
        started = recognizer._greedy.start(hidden)
        prompts = torch.tensor([recognizer._prompt_tail] * len(batch))
        greedy = recognizer._greedy.decode(started, prompts, [100] * len(batch))
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


def test_a_started_batch_decodes_once(recognizer: WhisperRecognizer) -> None:
    with torch.inference_mode():
        hidden = recognizer._encoders.encode(
            10.0, recognizer._preprocess([Utterance(clips(("en_jfk",))[0].audio())], 10.0)
        )
        started = recognizer._greedy.start(hidden)
        prompts = torch.tensor([recognizer._prompt_tail])
        recognizer._greedy.decode(started, prompts, [5])
        with pytest.raises(RuntimeError, match="decoded already"):
            recognizer._greedy.decode(started, prompts, [5])
