"""The encoder in its own dtype (`encoder_dtype`): bfloat16 under a float32 model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.corpus import clips
from engine import loading
from engine.api import Utterance
from engine.loading import resolve_encoder_dtype
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from loadgen.wer import ErrorCounts, error_counts
from server.engine_plan import model_config_with

# Four clips of one window (10 s) and JFK: read speech with exact references.
CLIPS = ("en_lj_LJ001-0004", "en_ls_1221-135766-0002", "en_lj_LJ001-0008", "en_ls_61-", "en_jfk")


def test_auto_is_bfloat16_on_a_cpu_that_multiplies_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PARLEY_ENCODER_DTYPE=auto`: bfloat16 for a float32 model on a CPU with native
    bfloat16 dot products; the model's dtype (None) without them, on cuda, in another
    dtype or under `int8` (which quantizes the encoder); an explicit choice is kept."""
    monkeypatch.setattr(loading, "native_bfloat16", lambda: True)
    assert resolve_encoder_dtype(model_config_with(), "cpu") == "bfloat16"
    assert resolve_encoder_dtype(model_config_with(dtype="float32"), "cpu") == "bfloat16"
    assert resolve_encoder_dtype(model_config_with(), "cuda") is None
    assert resolve_encoder_dtype(model_config_with(dtype="float16"), "cpu") is None
    assert resolve_encoder_dtype(model_config_with(quantize="int8"), "cpu") is None
    assert resolve_encoder_dtype(model_config_with(encoder_dtype="float32"), "cpu") == "float32"
    monkeypatch.setattr(loading, "native_bfloat16", lambda: False)
    assert resolve_encoder_dtype(model_config_with(), "cpu") is None
    assert resolve_encoder_dtype(model_config_with(encoder_dtype="bfloat16"), "cpu") == "bfloat16"


def test_int8_encoder_layers_cannot_run_in_bfloat16() -> None:
    with pytest.raises(ValueError, match="encoder"):
        WhisperRecognizerConfig(quantize="int8", encoder_dtype="bfloat16")


@pytest.mark.slow
def test_a_bfloat16_encoder_transcribes_as_float32_does(tiny_en: Path) -> None:
    """Five corpus clips: the transcripts are as accurate with the encoder in bfloat16
    (at most one more error in ~100 words, with its attention in plain matrix products),
    and the decoder still runs in float32."""
    selected = clips(CLIPS)
    assert len(selected) == 5
    utterances = [Utterance(clip.audio()) for clip in selected]
    results = {}
    for dtype in ("float32", "bfloat16"):
        config = WhisperRecognizerConfig(quantize="int8-shortlist", encoder_dtype=dtype)
        recognizer = WhisperRecognizer(tiny_en, config)
        results[dtype] = recognizer.transcribe(utterances)
        encoder = recognizer.whisper.model.model.encoder
        assert encoder.conv1.weight.dtype == getattr(torch, dtype)
        assert recognizer.whisper.model.model.decoder.embed_tokens.weight.dtype == torch.float32
        # CPU flash attention is slower in bfloat16 than plain products: eager there.
        attention = {"float32": "sdpa", "bfloat16": "eager"}[dtype]
        assert recognizer.whisper.model.config._attn_implementation == attention
    errors = {
        dtype: sum(
            (error_counts(clip.reference, r.text) for clip, r in zip(selected, rs, strict=True)),
            ErrorCounts(0, 0, 0, 0),
        )
        for dtype, rs in results.items()
    }
    assert errors["bfloat16"].errors <= errors["float32"].errors + 1, errors
    assert all(r.text for r in results["bfloat16"])
