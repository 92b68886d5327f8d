"""Windowed encoders: shared weights, window choice, validation (on a tiny random encoder)."""

from __future__ import annotations

import pytest
import torch
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from engine.whisper.windows import WindowedEncoders


@pytest.fixture(scope="module")
def encoder() -> WhisperEncoder:
    torch.manual_seed(0)
    config = WhisperConfig(
        num_mel_bins=4,
        d_model=8,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=16,
        max_source_positions=1500,
    )
    model = WhisperEncoder(config)
    torch.nn.Module.eval(model)
    return model


def test_windows_share_the_full_encoders_storage(encoder: WhisperEncoder) -> None:
    """Every windowed parameter is the full encoder's memory; positions are a prefix view."""
    windows = WindowedEncoders(encoder, [10.0, 5.0])
    assert windows.windows == (5.0, 10.0, 30.0)
    short = windows.encoder(5.0)
    full = dict(encoder.named_parameters())
    for name, parameter in short.named_parameters():
        assert parameter.data_ptr() == full[name].data_ptr(), name
    assert short.embed_positions.weight.shape == (250, 8)
    assert short.config.max_source_positions == 250
    assert encoder.config.max_source_positions == 1500  # the model's config is untouched


def test_a_window_encodes_its_own_length(encoder: WhisperEncoder) -> None:
    """Five seconds of features (500 frames) give 250 encoder states."""
    windows = WindowedEncoders(encoder, [5.0])
    with torch.inference_mode():
        hidden = windows.encode(5.0, torch.zeros(2, 4, windows.frames(5.0)))
    assert hidden.shape == (2, 250, 8)


def test_the_smallest_window_that_fits_is_chosen(encoder: WhisperEncoder) -> None:
    """Durations map to the next window up, and past every window to the full one."""
    windows = WindowedEncoders(encoder, [10.0, 15.0])
    assert windows.for_duration(0.0) == 10.0
    assert windows.for_duration(10.0) == 10.0
    assert windows.for_duration(10.01) == 15.0
    assert windows.for_duration(29.0) == 30.0
    assert windows.for_duration(45.0) == 30.0


@pytest.mark.parametrize("window", [0.0, -5.0, 31.0, 2.005, 0.01])
def test_impossible_windows_are_refused(encoder: WhisperEncoder, window: float) -> None:
    """Windows must be positive, within 30 s, and whole pairs of 10 ms frames."""
    with pytest.raises(ValueError):
        WindowedEncoders(encoder, [window])
